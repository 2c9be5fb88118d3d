// Host-side checks of the SM80 kernels' tile configurations, run by
// ctest on machines without a GPU: shared memory within every target's limit,
// copies and MMA partitions that cover each tile exactly once, the register
// layouts the online softmax and the P·V product rely on, and shared-memory
// access patterns free of bank conflicts. Layouts are evaluated on the host
// over a plain array, so every address a thread would touch is computed.
// The sm90 forward's d256 uniform tile (128 x 80) takes a wgmma shape CuTe
// declares only under this macro (sm90/fwd_traits.hpp).
#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED
#include <cute/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/bwd_walk.hpp"
#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/sm80/bwd_launch.hpp"
#include "flashtile/sm80/bwd_tail_split.hpp"
#include "flashtile/sm80/bwd_traits.hpp"
#include "flashtile/sm80/fwd_traits.hpp"
#include "flashtile/sm90/bwd_launch.hpp"
#include "flashtile/sm90/fwd_traits.hpp"
#include "flashtile/sm90/gemm.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/workspace.hpp"

using namespace cute;

namespace {

int g_failures = 0;
int g_checks = 0;

void expect(bool ok, const char* config, const char* what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL [%s] %s\n", config, what);
  }
}

// Opt-in dynamic shared memory per block: sm86/sm89 99 KB, sm80 163 KB, sm90
// 227 KB. The forward fits all of them; the backward needs sm80 or sm90.
constexpr int kSmemLimitAllBytes = 99 * 1024;
constexpr int kSmemLimitSm80Bytes = 163 * 1024;
constexpr int kSmemLimitSm90Bytes = 227 * 1024;

// Every coordinate of a (rows, cols) tile is produced by exactly one
// (thread, value) of the partition function `part(thread)`.
template <class PartitionOf>
bool covers_exactly_once(int threads, int rows, int cols, PartitionOf part) {
  std::map<std::pair<int, int>, int> seen;
  for (int t = 0; t < threads; ++t) {
    auto coords = part(t);
    for (int i = 0; i < size(coords); ++i) {
      seen[{int(get<0>(coords(i))), int(get<1>(coords(i)))}]++;
    }
  }
  if (int(seen.size()) != rows * cols) return false;
  for (auto& [rc, n] : seen) {
    if (n != 1 || rc.first < 0 || rc.first >= rows || rc.second < 0 || rc.second >= cols) return false;
  }
  return true;
}

// 16-byte accesses (cp.async, ldmatrix rows, vector loads) are served eight
// threads at a time; within each group of 8 the 16-byte chunks must fall in
// distinct bank quads, and each thread's 8 elements must be contiguous.
// part(t) is thread t's (CPY, M, K) partition of a tensor over `base`.
template <class Element, class PartitionOf>
bool vector_accesses_conflict_free(const Element* base, PartitionOf part) {
  auto first = part(0);
  for (int m = 0; m < size<1>(first); ++m) {
    for (int k = 0; k < size<2>(first); ++k) {
      for (int group = 0; group < 4; ++group) {
        std::set<long> chunks;
        for (int lane = group * 8; lane < group * 8 + 8; ++lane) {
          auto vec = part(lane)(_, m, k);
          const long offset = &vec(0) - base;
          for (int j = 1; j < size(vec); ++j) {
            if (&vec(j) - base != offset + j) return false;  // not one 16-byte vector
          }
          chunks.insert((offset * long(sizeof(Element)) / 16) % 8);
        }
        if (chunks.size() != 8) return false;
      }
    }
  }
  return true;
}

// 32-bit stores (register pairs into P, dS, O staging): a warp's 32 lanes
// must hit 32 distinct banks. part(t) is thread t's (CPY, M, N) partition.
template <class Element, class PartitionOf>
bool word_stores_conflict_free(const Element* base, PartitionOf part) {
  auto first = part(0);
  for (int m = 0; m < size<1>(first); ++m) {
    for (int n = 0; n < size<2>(first); ++n) {
      for (int v = 0; v < size<0>(first); v += 2) {
        std::set<long> banks;
        for (int lane = 0; lane < 32; ++lane) {
          banks.insert(((&part(lane)(v, m, n) - base) * long(sizeof(Element)) / 4) % 32);
        }
        if (banks.size() != 32) return false;
      }
    }
  }
  return true;
}

// Dropout's four-score groups (common/dropout.hpp): every thread's S
// accumulator atom (v, m, n) of a (rows, cols) tile starts at a row ≡ 0..7
// (mod 16) and an even column, and its element v sits at (8·(v / 2), v % 2)
// from element 0, so every kernel draws one Philox call per same group.
template <class TiledMma>
bool dropout_groups_match(int rows, int cols) {
  TiledMma mma;
  for (int t = 0; t < int(size(mma)); ++t) {
    auto tScS = mma.get_thread_slice(t).partition_C(make_identity_tensor(make_shape(rows, cols)));  // (MMA, MMA_M, MMA_N)
    if (size<0>(tScS) != 4) return false;
    for (int m = 0; m < size<1>(tScS); ++m) {
      for (int n = 0; n < size<2>(tScS); ++n) {
        const int row = get<0>(tScS(0, m, n)), col = get<1>(tScS(0, m, n));
        if (row % 16 >= 8 || col % 2 != 0) return false;
        for (int v = 0; v < 4; ++v) {
          if (get<0>(tScS(v, m, n)) != row + 8 * (v / 2) || get<1>(tScS(v, m, n)) != col + v % 2) return false;
        }
      }
    }
  }
  return true;
}

// Philox4x32-10 against the Random123 known-answer vectors (counter, key ->
// output), the keep threshold's ends and the byte compare.
void check_philox() {
  struct Kat {
    uint32_t counter[4];
    flashtile::PhiloxKey key;
    uint32_t expected[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& kat : kats) {
    uint32_t out[4];
    flashtile::philox4x32_10(kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3], kat.key, out);
    expect(out[0] == kat.expected[0] && out[1] == kat.expected[1] && out[2] == kat.expected[2] &&
               out[3] == kat.expected[3],
           "philox", "Philox4x32-10 gives the Random123 known answer");
    flashtile::philox4x32_10<2>(kat.counter[0], kat.counter[1], kat.counter[2], kat.counter[3], kat.key, out);
    expect(out[0] == kat.expected[0] && out[1] == kat.expected[1] && out[2] == kat.expected[2] &&
               out[3] == kat.expected[3],
           "philox", "the two-rounds-per-iteration loop gives the same words");
  }
  expect(flashtile::dropout_keep_threshold(0.5f) == 128, "philox", "p = 0.5 keeps bytes below 128");
  expect(flashtile::dropout_keep_threshold(0.1f) == 230, "philox", "p = 0.1 keeps bytes below round(0.9 * 256)");
  expect(flashtile::dropout_keep_threshold(1e-3f) == 256, "philox", "p below 1/512 keeps every byte");
  expect(flashtile::dropout_keep_threshold(1.f - 0x1p-23f) == 0, "philox", "p from 1 - 1/512 keeps none");
  expect(flashtile::dropout_keep_nibble(0x00FF7F80u, 128) == 0b1010, "philox", "bytes below the threshold set the bits");
}

template <class Traits>
void check_fwd_config(const char* config, int smem_limit = kSmemLimitAllBytes) {
  using Element = typename Traits::Element;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr int kThreads = Traits::kNThreads;

  // Shared memory: the three tiles, unpadded, within every target's limit.
  expect(Traits::kSmemBytes == (kM + 2 * kN) * kD * int(sizeof(Element)), config,
         "kSmemBytes is Q + K + V tiles");
  expect(Traits::kSmemBytes <= smem_limit, config, "shared memory within its targets' limit");
  expect(cosize(typename Traits::SmemLayoutQ{}) == kM * kD, config, "Q layout is unpadded");
  expect(cosize(typename Traits::SmemLayoutKV{}) == kN * kD, config, "K/V layout is unpadded");

  std::vector<Element> q_buf(kM * kD), kv_buf(kN * kD);
  auto sQ = make_tensor(q_buf.data(), typename Traits::SmemLayoutQ{});    // (kM, kD)
  auto sK = make_tensor(kv_buf.data(), typename Traits::SmemLayoutKV{});  // (kN, kD)
  auto sVt = make_tensor(kv_buf.data(), typename Traits::SmemLayoutVt{});  // (kD, kN)
  {  // the layouts are bijections onto their buffers
    std::set<long> q_offsets, kv_offsets;
    for (int i = 0; i < size(sQ); ++i) q_offsets.insert(&sQ(i) - q_buf.data());
    for (int i = 0; i < size(sK); ++i) kv_offsets.insert(&sK(i) - kv_buf.data());
    expect(int(q_offsets.size()) == kM * kD, config, "Q layout is a bijection");
    expect(int(kv_offsets.size()) == kN * kD, config, "K/V layout is a bijection");
    bool vt_is_transpose = true;
    for (int d = 0; d < kD; ++d) {
      for (int n = 0; n < kN; ++n) vt_is_transpose &= &sVt(d, n) == &sK(n, d);
    }
    expect(vt_is_transpose, config, "Vt is the transpose of V's bytes");
  }

  // Global <-> shared copies cover each tile once, conflict-free.
  typename Traits::GmemTiledCopyQKV gmem_copy;
  typename Traits::GmemTiledCopyO gmem_copy_O;
  expect(size(gmem_copy) == kThreads, config, "gmem copy uses every thread");
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) {
           return gmem_copy.get_slice(t).partition_S(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
         }),
         config, "Q copy covers the tile once");
  expect(covers_exactly_once(kThreads, kN, kD, [&](int t) {
           return gmem_copy.get_slice(t).partition_S(make_identity_tensor(Shape<Int<kN>, Int<kD>>{}));
         }),
         config, "K/V copy covers the tile once");
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) {
           return gmem_copy_O.get_slice(t).partition_D(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
         }),
         config, "O copy covers the tile once");
  expect(vector_accesses_conflict_free(q_buf.data(), [&](int t) { return gmem_copy.get_slice(t).partition_D(sQ); }),
         config, "cp.async into sQ is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf.data(), [&](int t) { return gmem_copy.get_slice(t).partition_D(sK); }),
         config, "cp.async into sK/sV is conflict-free");
  expect(vector_accesses_conflict_free(q_buf.data(), [&](int t) { return gmem_copy_O.get_slice(t).partition_S(sQ); }),
         config, "reading sO for the store is conflict-free");

  // ldmatrix: each group of 8 lanes supplies the 8 row addresses of one 8x8.
  typename Traits::TiledMma tiled_mma;
  auto ldsm_Q = make_tiled_copy_A(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto ldsm_K = make_tiled_copy_B(typename Traits::SmemCopyAtom{}, tiled_mma);
  auto ldsm_V = make_tiled_copy_B(typename Traits::SmemCopyAtomTransposed{}, tiled_mma);
  expect(vector_accesses_conflict_free(q_buf.data(), [&](int t) { return ldsm_Q.get_slice(t).partition_S(sQ); }),
         config, "ldmatrix of Q is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf.data(), [&](int t) { return ldsm_K.get_slice(t).partition_S(sK); }),
         config, "ldmatrix of K is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf.data(), [&](int t) { return ldsm_V.get_slice(t).partition_S(sVt); }),
         config, "ldmatrix.trans of V is conflict-free");

  // MMA accumulators cover S and O once.
  auto cS = make_identity_tensor(Shape<Int<kM>, Int<kN>>{});  // (kM, kN) -> (row, col)
  auto cO = make_identity_tensor(Shape<Int<kM>, Int<kD>>{});  // (kM, kD) -> (row, col)
  expect(covers_exactly_once(kThreads, kM, kN, [&](int t) { return tiled_mma.get_slice(t).partition_C(cS); }),
         config, "S accumulators cover the tile once");
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) { return tiled_mma.get_slice(t).partition_C(cO); }),
         config, "O accumulators cover the tile once");
  expect(dropout_groups_match<typename Traits::TiledMma>(kM, kN), config, "S atoms are dropout's four-score groups");

  // Online softmax: in the (row, col) view each thread's row r is one query
  // row, the four lanes of a quad hold the same rows, and together they hold
  // every column of it -- what quad_allreduce assumes.
  bool rows_ok = true;
  for (int t = 0; t < kThreads; ++t) {
    auto mine = flashtile::rowcol_view(tiled_mma.get_slice(t).partition_C(cS));  // (rows, cols)
    for (int r = 0; r < size<0>(mine); ++r) {
      std::set<int> cols;
      for (int lane = t & ~3; lane < (t & ~3) + 4; ++lane) {
        auto quad = flashtile::rowcol_view(tiled_mma.get_slice(lane).partition_C(cS));
        for (int c = 0; c < size<1>(quad); ++c) {
          rows_ok &= get<0>(quad(r, c)) == get<0>(mine(r, 0));
          cols.insert(get<1>(quad(r, c)));
        }
      }
      rows_ok &= int(cols.size()) == kN;
    }
  }
  expect(rows_ok, config, "rowcol view: a quad holds whole rows");

  // P·V: the accumulator of S, viewed as an A operand, holds exactly the
  // (row, key) elements the MMA expects in each A register slot.
  bool operand_ok = true;
  for (int t = 0; t < kThreads; ++t) {
    auto thr = tiled_mma.get_slice(t);
    auto acc = thr.partition_C(cS);                                                // (MMA, MMA_M, MMA_N)
    auto as_a = make_tensor(acc.data(), flashtile::acc_to_operand_a_layout(acc.layout()));
    auto want = thr.partition_A(cS);                                               // (MMA, MMA_M, MMA_K)
    operand_ok &= size(as_a) == size(want);
    for (int i = 0; i < size(want) && operand_ok; ++i) operand_ok &= as_a(i) == want(i);
  }
  expect(operand_ok, config, "S accumulator reinterpreted as the A operand of P·V");
}

// A shared-memory layout over element offsets. The SM90 (GMMA) layouts keep
// their swizzle beside a pointer flag, in byte units, for a shared-memory
// pointer to apply; here it is applied to offsets into a host buffer.
template <class Layout>
auto element_layout(Layout layout) {
  return layout;
}
template <class SwizzleFn, int kBits, class Layout>
auto element_layout(ComposedLayout<SwizzleFn, smem_ptr_flag_bits<kBits>, Layout> layout) {
  return as_position_independent_swizzle_layout(layout);
}

// The fp32 dQ accumulator's per-block layout (dq_accum_offset): every
// (thread, value) of the dQ product gets its own slot in [0, kM·kD), which
// the main kernel's atomic adds and the convert kernel both rely on.
template <class Traits>
void check_bwd_dq_accum(const char* config) {
  constexpr int kM = Traits::kBlockM, kD = Traits::kHeadDim;
  constexpr int kThreads = Traits::kNThreads;
  typename Traits::TiledMmadQ mma_dq;
  constexpr int kValues = decltype(size(partition_fragment_C(mma_dq, Shape<Int<kM>, Int<kD>>{})))::value;
  auto bijective = [&](auto offset_of) {
    std::vector<int> hits(kM * kD, 0);
    bool ok = true;
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kValues; ++i) {
        const int offset = offset_of(t, i);
        ok &= offset >= 0 && offset < kM * kD;
        if (offset >= 0 && offset < kM * kD) ++hits[offset];
      }
    }
    for (int h : hits) ok &= h == 1;
    return ok;
  };
  // Both layouts: 4-value vectors (sm90) and scalars (sm80).
  const bool once = kValues % 4 == 0 &&
                    bijective([](int t, int i) { return flashtile::dq_accum_offset<kThreads, 4>(t, i); }) &&
                    bijective([](int t, int i) { return flashtile::dq_accum_offset<kThreads, 1>(t, i); });
  expect(once, config, "dQ accumulator layout is a bijection onto the block");
}

// The SM80 kernels' ldmatrix partitions and dropout's score groups.
template <class Traits, bool kDqKernel, class SQ, class SK, class SP, class SQt, class SKt, class SPt>
void check_bwd_ldmatrix(const char* config, SQ const& sQ, SK const& sK, SP const& sP, SQt const& sQt,
                        SKt const& sKt, SPt const& sPt) {
  using Element = typename Traits::Element;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN;
  const Element* q_buf = sQ.data();
  const Element* kv_buf = sK.data();
  const Element* pds_buf = sP.data();
  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  expect(dropout_groups_match<typename Traits::TiledMmaSdP>(kM, kN), config,
         "S atoms are dropout's four-score groups");

  using Ldsm = typename Traits::SmemCopyAtom;
  using LdsmT = typename Traits::SmemCopyAtomTransposed;
  auto sdp_a = make_tiled_copy_A(Ldsm{}, mma_sdp);
  auto sdp_b = make_tiled_copy_B(Ldsm{}, mma_sdp);
  auto dkv_a = make_tiled_copy_A(LdsmT{}, mma_dkv);
  auto dkv_b = make_tiled_copy_B(LdsmT{}, mma_dkv);
  auto dq_a = make_tiled_copy_A(Ldsm{}, mma_dq);
  auto dq_b = make_tiled_copy_B(LdsmT{}, mma_dq);
  expect(vector_accesses_conflict_free(q_buf, [&](int t) { return sdp_a.get_slice(t).partition_S(sQ); }),
         config, "ldmatrix of Q/dO (S, dP) is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf, [&](int t) { return sdp_b.get_slice(t).partition_S(sK); }),
         config, "ldmatrix of K/V (S, dP) is conflict-free");
  expect(vector_accesses_conflict_free(pds_buf, [&](int t) { return dkv_a.get_slice(t).partition_S(sPt); }),
         config, "ldmatrix.trans of P/dS (dV, dK) is conflict-free");
  expect(vector_accesses_conflict_free(q_buf, [&](int t) { return dkv_b.get_slice(t).partition_S(sQt); }),
         config, "ldmatrix.trans of dO/Q (dV, dK) is conflict-free");
  expect(vector_accesses_conflict_free(pds_buf, [&](int t) { return dq_a.get_slice(t).partition_S(sP); }),
         config, "ldmatrix of dS (dQ) is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf, [&](int t) { return dq_b.get_slice(t).partition_S(sKt); }),
         config, "ldmatrix.trans of K (dQ) is conflict-free");

  if constexpr (!kDqKernel) check_bwd_dq_accum<Traits>(config);
}

// kDqKernel: the tiles of the deterministic mode's dQ kernel, whose shared
// memory is kSmemDqBytes; otherwise the main kernel's (kSmemBytes).
template <class Traits, bool kDqKernel = false>
void check_bwd_config(const char* config, int smem_limit = kSmemLimitSm80Bytes) {
  using Element = typename Traits::Element;
  constexpr int kM = Traits::kBlockM, kN = Traits::kBlockN, kD = Traits::kHeadDim;
  constexpr int kThreads = Traits::kNThreads;
  constexpr int kSmemBytes = [] {
    if constexpr (kDqKernel) {
      return Traits::kSmemDqBytes;
    } else {
      return Traits::kSmemBytes;
    }
  }();
  expect(kSmemBytes <= smem_limit, config,
         "shared memory within its targets' limit");

  std::vector<Element> q_buf(kM * kD), kv_buf(kN * kD), pds_buf(kM * kN);
  auto sQ = make_tensor(q_buf.data(), element_layout(typename Traits::SmemLayoutQ{}));        // (kM, kD)
  auto sK = make_tensor(kv_buf.data(), element_layout(typename Traits::SmemLayoutKV{}));      // (kN, kD)
  auto sP = make_tensor(pds_buf.data(), element_layout(typename Traits::SmemLayoutPdS{}));    // (kM, kN)
  auto sQt = make_tensor(q_buf.data(), element_layout(typename Traits::SmemLayoutQt{}));      // (kD, kM)
  auto sKt = make_tensor(kv_buf.data(), element_layout(typename Traits::SmemLayoutKt{}));     // (kD, kN)
  auto sPt = make_tensor(pds_buf.data(), element_layout(typename Traits::SmemLayoutPdSt{}));  // (kN, kM)
  bool transposes = true;
  for (int m = 0; m < kM; ++m) {
    for (int d = 0; d < kD; ++d) transposes &= &sQt(d, m) == &sQ(m, d);
    for (int n = 0; n < kN; ++n) transposes &= &sPt(n, m) == &sP(m, n);
  }
  for (int n = 0; n < kN; ++n) {
    for (int d = 0; d < kD; ++d) transposes &= &sKt(d, n) == &sK(n, d);
  }
  expect(transposes, config, "Qt, Kt, Pt are transposes of Q, K, P");

  typename Traits::GmemTiledCopy gmem_copy;
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) {
           return gmem_copy.get_slice(t).partition_S(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
         }),
         config, "Q/dO copy covers the tile once");
  expect(covers_exactly_once(kThreads, kN, kD, [&](int t) {
           return gmem_copy.get_slice(t).partition_S(make_identity_tensor(Shape<Int<kN>, Int<kD>>{}));
         }),
         config, "K/V copy covers the tile once");
  expect(vector_accesses_conflict_free(q_buf.data(), [&](int t) { return gmem_copy.get_slice(t).partition_D(sQ); }),
         config, "cp.async into sQ/sdO is conflict-free");
  expect(vector_accesses_conflict_free(kv_buf.data(), [&](int t) { return gmem_copy.get_slice(t).partition_D(sK); }),
         config, "cp.async into sK/sV is conflict-free");
  typename Traits::GmemTiledCopyStore store_copy;
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) {
           return store_copy.get_slice(t).partition_D(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
         }),
         config, "dQ store copy covers the tile once");
  expect(vector_accesses_conflict_free(q_buf.data(), [&](int t) { return store_copy.get_slice(t).partition_S(sQ); }),
         config, "reading staged dQ for the store is conflict-free");

  typename Traits::TiledMmaSdP mma_sdp;
  typename Traits::TiledMmadKV mma_dkv;
  typename Traits::TiledMmadQ mma_dq;
  expect(covers_exactly_once(kThreads, kM, kN, [&](int t) {
           return mma_sdp.get_slice(t).partition_C(make_identity_tensor(Shape<Int<kM>, Int<kN>>{}));
         }),
         config, "S/dP accumulators cover the tile once");
  expect(covers_exactly_once(kThreads, kN, kD, [&](int t) {
           return mma_dkv.get_slice(t).partition_C(make_identity_tensor(Shape<Int<kN>, Int<kD>>{}));
         }),
         config, "dK/dV accumulators cover the tile once");
  expect(covers_exactly_once(kThreads, kM, kD, [&](int t) {
           return mma_dq.get_slice(t).partition_C(make_identity_tensor(Shape<Int<kM>, Int<kD>>{}));
         }),
         config, "dQ accumulators cover the tile once");
  check_bwd_ldmatrix<Traits, kDqKernel>(config, sQ, sK, sP, sQt, sKt, sPt);

  auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
  expect(word_stores_conflict_free(pds_buf.data(), [&](int t) { return copy_pds.get_slice(t).partition_D(sP); }),
         config, "storing P/dS to shared memory is conflict-free");
  // store_tile_staged: dK and dV staged in sK/sV, dQ in a Q-shaped tile.
  auto stage_dkv = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_dkv);
  expect(word_stores_conflict_free(kv_buf.data(), [&](int t) { return stage_dkv.get_slice(t).partition_D(sK); }),
         config, "staging dK/dV in shared memory is conflict-free");
  auto stage_dq = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_dq);
  expect(word_stores_conflict_free(q_buf.data(), [&](int t) { return stage_dq.get_slice(t).partition_D(sQ); }),
         config, "staging dQ in shared memory is conflict-free");
}

// BlockMask, checked against the (row, col) visibility rule by brute force:
// the blocks a query block visits (forward, dQ kernel) and the query blocks
// a key block visits (backward) include every visible pair; tiles that skip
// the mask hide nothing; the forward's three loops and the backward's
// masked prefix and suffix cover every tile that needs the mask.
template <flashtile::MaskKind kKind, int kM, int kN>
void check_block_mask(const char* config) {
  using flashtile::MaskKind;
  bool visits_all = true, skips_only_visible = true, fwd_loops_mask = true, bwd_ranges_mask = true,
       in_range = true, hides_is_rule = true, anchored_is_hides = true, dq_turns_in_order = true,
       ascending_walk_agrees = true;
  std::vector<std::pair<int, int>> windows = {{-1, -1}};
  if (kKind == MaskKind::kCausal) windows = {{-1, 0}};
  // The last three would overflow int sums unless BlockMask caps them.
  if (kKind == MaskKind::kLocal) {
    windows = {{0, 0}, {5, 3}, {64, 0}, {100, -1}, {-1, 37}, {0, -1}, {130, 130}, {7, 200},
               {0, INT_MAX}, {INT_MAX, 0}, {INT_MAX - 1, 3}};
  }
  for (auto window : windows) {
    const int window_left = window.first, window_right = window.second;
    for (int seqlen_q : {1, 63, 64, 65, 130, 257, 700}) {
      for (int seqlen_k : {1, 63, 64, 65, 130, 257, 700}) {
        const flashtile::BlockMask<kKind, kM, kN> mask(seqlen_q, seqlen_k, window_left, window_right);
        const int m_blocks = (seqlen_q + kM - 1) / kM, n_blocks = (seqlen_k + kN - 1) / kN;
        const int off = seqlen_k - seqlen_q;
        auto hidden = [&](int row, int col) {  // in 64 bits: the windows may be near INT_MAX
          const long long diagonal = (long long)row + off;
          return col >= seqlen_k || (kKind == MaskKind::kCausal && col > diagonal) ||
                 (window_right >= 0 && col > diagonal + window_right) ||
                 (window_left >= 0 && col < diagonal - window_left);
        };
        auto block_has_visible = [&](int m, int n) {
          for (int r = m * kM; r < std::min((m + 1) * kM, seqlen_q); ++r) {
            for (int c = n * kN; c < std::min((n + 1) * kN, seqlen_k); ++c) {
              if (!hidden(r, c)) return true;
            }
          }
          return false;
        };
        auto block_has_hidden = [&](int m, int n) {
          for (int r = m * kM; r < (m + 1) * kM; ++r) {
            for (int c = n * kN; c < (n + 1) * kN; ++c) {
              if (hidden(r, c)) return true;
            }
          }
          return false;
        };
        // hides(), and anchored_at(row0, col0).hides(dr, dc) from anchors
        // on and off the diagonal, against the rule, over a tile's offsets
        // (rows of the sequence only: past it the capped windows may differ
        // from the rule, and no kernel uses those rows' results).
        for (int row0 : {0, seqlen_q / 2, seqlen_q - 1}) {
          for (int col0 : {0, seqlen_k / 3, seqlen_k - 1}) {
            const auto anchored = mask.anchored_at(row0, col0);
            for (int dr = 0; dr < kM && row0 + dr < seqlen_q; ++dr) {
              for (int dc = 0; dc < kN; ++dc) {
                const bool rule = hidden(row0 + dr, col0 + dc);
                hides_is_rule &= mask.hides(row0 + dr, col0 + dc) == rule;
                anchored_is_hides &= anchored.hides(dr, dc) == rule;
              }
            }
          }
        }
        for (int m = 0; m < m_blocks; ++m) {
          const int begin = mask.n_block_begin(m), end = mask.n_block_end(m);
          in_range &= begin >= 0 && end <= n_blocks;
          const int unmasked_end = end - mask.n_masked_blocks();
          const int unmasked_begin = std::max(begin, mask.n_block_left_unmasked_begin(m));
          for (int n = 0; n < n_blocks; ++n) {
            const bool visited = n >= begin && n < end;
            if (!visited) visits_all &= !block_has_visible(m, n);
            if (!mask.needs_mask(m, n)) skips_only_visible &= !block_has_hidden(m, n);
            // fwd_kernel.hpp: blocks in [unmasked_begin, unmasked_end) run without the mask.
            if (visited && n >= unmasked_begin && n < unmasked_end) fwd_loops_mask &= !mask.needs_mask(m, n);
          }
        }
        for (int n = 0; n < n_blocks; ++n) {
          const int m_begin = mask.m_block_begin(n), m_end = std::max(m_begin, mask.m_block_end(n));
          in_range &= m_begin >= 0 && m_end <= m_blocks;
          const int mask_end = mask.m_block_mask_end(n, m_begin, m_end);
          const int left_begin = mask.m_block_left_mask_begin(n, mask_end, m_end);
          bwd_ranges_mask &= m_begin <= mask_end && mask_end <= left_begin && left_begin <= m_end;
          for (int m = 0; m < m_blocks; ++m) {
            if (m < m_begin || m >= m_end) visits_all &= !block_has_visible(m, n);
            // bwd_kernel.hpp: query blocks in [mask_end, left_begin) run without the mask.
            if (m >= mask_end && m < left_begin) bwd_ranges_mask &= !block_has_hidden(m, n);
          }
        }
        // bwd_walk.hpp: the ascending walk (kAscending) takes the same (query
        // head, query block) pairs as the default one, each masked alike,
        // its query blocks in ascending order (a GQA group of 3 heads).
        for (int n = 0; n < n_blocks; ++n) {
          const flashtile::BwdQueryWalk<kKind, kM, kN> walk(mask, n, 1, 3);
          const flashtile::BwdQueryWalk<kKind, kM, kN, true> ascending(mask, n, 1, 3);
          std::set<std::tuple<int, int, bool>> pairs, ascending_pairs;
          int last_m = -1;
          for (int it = 0; it < walk.iterations; ++it) {
            const auto hm = walk(it);
            pairs.insert({cute::get<0>(hm), cute::get<1>(hm), walk.masked(it, cute::get<1>(hm))});
            const auto ahm = ascending(it);
            const int m = cute::get<1>(ahm);
            ascending_pairs.insert({cute::get<0>(ahm), m, ascending.masked(it, m)});
            ascending_walk_agrees &= m >= last_m;
            last_m = m;
          }
          ascending_walk_agrees &= ascending.iterations == walk.iterations &&
                                   int(pairs.size()) == walk.iterations && pairs == ascending_pairs;
        }
        // sm90/dq_turns.hpp: the key blocks whose walk takes query block m
        // are exactly [n_block_begin(m), n_block_end(m)).
        for (int m = 0; m < m_blocks; ++m) {
          const int first = mask.n_block_begin(m), end = mask.n_block_end(m);
          for (int n = 0; n < n_blocks; ++n) {
            const int m_begin = mask.m_block_begin(n), m_end = std::max(m_begin, mask.m_block_end(n));
            dq_turns_in_order &= (m >= m_begin && m < m_end) == (n >= first && n < end);
          }
        }
      }
    }
  }
  expect(in_range, config, "visited block ranges stay within the blocks that exist");
  expect(visits_all, config, "every visible (row, col) is in a visited tile, forward and backward");
  expect(skips_only_visible, config, "tiles without the mask hide no (row, col)");
  expect(fwd_loops_mask, config, "the forward's mask-free loop gets only tiles that need no mask");
  expect(bwd_ranges_mask, config, "the backward's mask-free query blocks need no mask");
  expect(hides_is_rule, config, "hides(row, col) is the visibility rule");
  expect(anchored_is_hides, config, "anchored_at(row0, col0).hides(dr, dc) is hides(row0 + dr, col0 + dc)");
  expect(ascending_walk_agrees, config, "the ascending walk takes the default walk's blocks, masked alike, in order");
  expect(dq_turns_in_order, config, "the key blocks whose walk takes a query block are [n_block_begin, n_block_end)");
}

// bwd_tile_coord: every (block order, head) of a 1-D grid is owned by exactly
// one CTA, whatever the band size, including a partial last band.
void check_tile_schedule() {
  bool bijective = true;
  for (int blocks_per_head : {1, 3, 8, 33}) {
    for (int heads : {1, 5, 16, 37}) {
      for (int64_t head_bytes : {int64_t(1), int64_t(3) << 20, int64_t(7) << 20, int64_t(1) << 40}) {
        std::vector<int> hits(blocks_per_head * heads, 0);
        for (int block = 0; block < blocks_per_head * heads; ++block) {
          const auto c = flashtile::bwd_tile_coord(block, blocks_per_head, heads, head_bytes);
          if (c.block_order < 0 || c.block_order >= blocks_per_head || c.head < 0 || c.head >= heads) {
            bijective = false;
          } else {
            ++hits[c.head * blocks_per_head + c.block_order];
          }
        }
        for (int h : hits) bijective &= h == 1;
      }
    }
  }
  expect(bijective, "bwd schedule", "each (block, head) is owned by exactly one CTA");
}

// The split tail (bwd_tail_split.hpp): the plans for the H200's 132 slots
// at the benchmark's grids, and for any plan, every (key block, iteration)
// run by exactly one CTA of the grid, the splits all in the last wave.
void check_tail_split() {
  using flashtile::sm80::plan_bwd_tail_split;
  const char* config = "bwd tail split";
  auto plan = [](int tasks, int slots, int iterations, int max_tasks) {
    const auto s = plan_bwd_tail_split(tasks, slots, iterations, max_tasks, nullptr);
    return std::make_pair(s.first_task, s.parts);
  };
  expect(plan(2688, 132, 16, 64) == std::make_pair(2640, 2), config, "d96 at the benchmark's shapes: 48 blocks in 2");
  expect(plan(4096, 132, 8, 64) == std::make_pair(4092, 2), config, "4 blocks left: 2 parts (the cap)");
  expect(plan(40, 132, 1, 40).second == 1, config, "a grid under one wave of one iteration per block: no split");
  expect(plan(2048, 132, 16, 64).second == 1, config, "68 of 132 left: more than half a wave, no split");
  expect(plan(2640, 132, 16, 64).second == 1, config, "whole waves: no split");
  expect(plan(2688, 132, 16, 47).second == 1, config, "no split past the workspace's slots");
  expect(plan(2688, 0, 16, 64).second == 1, config, "no device query: no split");
  expect(plan(2688, 132, 1, 64).second == 1, config, "one iteration per block: nothing to split");
  bool exact = true, tail_only = true;
  for (int tasks : {1, 7, 40, 133, 200, 2688}) {
    for (int slots : {8, 132, 264}) {
      for (int iterations : {1, 2, 5, 16, 33}) {
        const auto split = plan_bwd_tail_split(tasks, slots, iterations, 64, nullptr);
        std::vector<int> runs(size_t(tasks) * iterations, 0);
        const int blocks = split.grid_blocks(tasks);
        for (int block = 0; block < blocks; ++block) {
          const flashtile::sm80::BwdTailPart part(split, block);
          tail_only &= part.parts == 1 || block >= blocks - slots;
          for (int it = part.begin(iterations); it < part.end(iterations); ++it) ++runs[size_t(part.task) * iterations + it];
        }
        for (int r : runs) exact &= r == 1;
      }
    }
  }
  expect(exact, config, "each (key block, iteration) runs in exactly one CTA");
  expect(tail_only, config, "split CTAs fit in the grid's last wave");
}

// Variable-length batches: SeqInfo keeps every sequence inside the packed
// tensors and within the maxima, whatever the offsets hold (the kernels
// never read them on the host), and with valid offsets the dQ accumulator
// gives each (sequence, head) its own whole query blocks inside the
// workspace.
void check_varlen_layout() {
  bool inside = true, disjoint = true;
  uint32_t state = 12345;
  auto next = [&](int lo, int hi) {  // a small LCG: reproducible, no <random> state
    state = state * 1664525u + 1013904223u;
    return lo + int(state % uint32_t(hi - lo + 1));
  };
  for (int trial = 0; trial < 400; ++trial) {
    const int batch = next(1, 9);
    const bool garbage = trial % 4 == 3;  // offsets that decrease, go negative or run past the end
    std::vector<int> cu_q(batch + 1, 0), cu_k(batch + 1, 0), used(batch, 0);
    int max_q = 1, max_k = 1;
    for (int b = 0; b < batch; ++b) {
      const int lq = next(0, 300), lk = next(0, 300);
      cu_q[b + 1] = garbage ? next(-50, 2000) : cu_q[b] + lq;
      cu_k[b + 1] = garbage ? next(-50, 2000) : cu_k[b] + lk;
      used[b] = garbage ? next(-10, 400) : next(0, lk);
      max_q = std::max(max_q, lq), max_k = std::max(max_k, lk);
    }
    flashtile::BwdParams p;
    p.batch = batch, p.nheads = 3, p.head_dim = 64, p.seqlen_q = max_q, p.seqlen_k = max_k;
    p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data(), p.seqused_k = used.data();
    p.total_q = garbage ? next(1, 1500) : std::max(1, cu_q[batch]);
    p.total_k = garbage ? next(1, 1500) : std::max(1, cu_k[batch]);
    const int64_t accum_rows = flashtile::bwd_dq_accum_rows(p);
    std::vector<int> owner(size_t(accum_rows) * p.nheads, -1);
    for (int b = 0; b < batch; ++b) {
      const flashtile::SeqInfo seq(p, b);
      inside &= seq.seqlen_q >= 0 && seq.seqlen_q <= p.seqlen_q && seq.q_start >= 0 &&
                seq.q_start + seq.seqlen_q <= p.total_q;
      inside &= seq.seqlen_k_rows >= 0 && seq.seqlen_k_rows <= p.seqlen_k && seq.k_start >= 0 &&
                seq.k_start + seq.seqlen_k_rows <= p.total_k && seq.seqlen_k >= 0 && seq.seqlen_k <= seq.seqlen_k_rows;
      if (!garbage) inside &= seq.seqlen_q == cu_q[b + 1] - cu_q[b] && seq.seqlen_k == used[b];
      const int64_t blocks_rows = (seq.seqlen_q + flashtile::kBwdDqAccumRowAlign - 1) /
                                  flashtile::kBwdDqAccumRowAlign * flashtile::kBwdDqAccumRowAlign;
      for (int h = 0; h < p.nheads; ++h) {
        const int64_t row0 = flashtile::bwd_dq_accum_row(p, seq, h);
        inside &= row0 >= int64_t(h) * accum_rows && row0 + blocks_rows <= int64_t(h + 1) * accum_rows;
        if (garbage) continue;  // wrong offsets may share rows: wrong sums, never stray writes
        for (int64_t r = row0; r < row0 + blocks_rows && r < int64_t(owner.size()); ++r) {
          disjoint &= owner[size_t(r)] == -1;
          owner[size_t(r)] = b;
        }
      }
    }
  }
  expect(inside, "varlen", "sequences stay inside the packed tensors and the dQ accumulator");
  expect(disjoint, "varlen", "each (sequence, head) owns its dQ accumulator rows");
}

// The SM90 forward's tiles (sm90/fwd_traits.hpp): P = softmax(S), kept in
// the QK product's accumulator registers, is the PV product's register A
// operand element for element (acc_to_rs_operand_a_layout), for every
// consumer thread; the accumulator's (row, col) view has each thread's rows
// whole in a quad (the online softmax's reduction).
template <class Traits>
void check_sm90_fwd_config(const char* config) {
  using ShapeS = Shape<Int<Traits::kBlockM>, Int<Traits::kBlockN>>;
  typename Traits::TiledMmaQK tiled_mma_qk;
  typename Traits::TiledMmaPV tiled_mma_pv;
  bool same = true, rows_in_quad = true;
  for (int t = 0; t < Traits::kMmaThreads; ++t) {
    auto cS = tiled_mma_qk.get_thread_slice(t).partition_C(make_identity_tensor(ShapeS{}));  // (MMA, MMA_M, MMA_N)
    auto cS_as_a = make_tensor(cS.data(), flashtile::sm90::acc_to_rs_operand_a_layout(cS.layout()));
    auto cA = tiled_mma_pv.get_thread_slice(t).partition_A(make_identity_tensor(ShapeS{}));  // (MMA, MMA_M, MMA_K)
    same &= size(cS_as_a) == size(cA);
    for (int i = 0; same && i < size(cA); ++i) same &= cS_as_a(i) == cA(i);
    auto rows = flashtile::rowcol_view(cS);
    auto quad0 = flashtile::rowcol_view(tiled_mma_qk.get_thread_slice(t - t % 4).partition_C(
        make_identity_tensor(ShapeS{})));
    for (int r = 0; r < size<0>(rows); ++r) rows_in_quad &= get<0>(rows(r, 0)) == get<0>(quad0(r, 0));
  }
  expect(same, config, "S's accumulator is P's register operand, element for element");
  expect(rows_in_quad, config, "a quad's four lanes hold the same rows");
  expect(Traits::kSmemBytes <= kSmemLimitSm90Bytes, config, "fits sm90's shared memory");
}

// The SM90 forward takes attention without dropout or the probabilities
// (softcap and ALiBi in its scoremod variant) on strides TMA can step.
void check_sm90_fwd_support() {
  const char* config = "sm90 fwd support";
  flashtile::FwdParams p;
  p.batch = 2, p.seqlen_q = 100, p.seqlen_k = 90, p.nheads = 4, p.nheads_k = 2, p.head_dim = 128;
  p.q_row_stride = 512, p.q_head_stride = 128, p.q_batch_stride = 51200;
  p.k_row_stride = 256, p.k_head_stride = 128, p.k_batch_stride = 23040;
  p.v_row_stride = 256, p.v_head_stride = 128, p.v_batch_stride = 23040;
  expect(flashtile::sm90::fwd_supports(p), config, "a contiguous fixed-length batch");
  flashtile::FwdParams q = p;
  q.softcap = 30.f;
  expect(flashtile::sm90::fwd_supports(q), config, "softcap (the scoremod variant)");
  q = p, q.dropout_p = 0.1f;
  expect(flashtile::sm90::fwd_supports(q), config, "dropout (the scoremod variant)");
  q = p, q.attn_probs = reinterpret_cast<void*>(256);
  expect(flashtile::sm90::fwd_supports(q), config, "the probabilities (the scoremod variant)");
  q = p, q.k_batch_stride = 0;
  expect(flashtile::sm90::fwd_supports(q), config, "k expanded along the batch (stride 0: extent 1)");
  q = p, q.q_head_stride = 0, q.v_batch_stride = 0;
  expect(flashtile::sm90::fwd_supports(q), config, "q expanded along heads, v along the batch");
  q = p, q.k_row_stride = 0;
  expect(!flashtile::sm90::fwd_supports(q), config, "k expanded along the rows (stride 0)");
  q = p, q.batch = 1, q.k_batch_stride = 0;
  expect(flashtile::sm90::fwd_supports(q), config, "stride 0 on a mode of extent 1");
  q = p, q.v_row_stride = int64_t(1) << 40;
  expect(!flashtile::sm90::fwd_supports(q), config, "a row stride past TMA's 2^40 bytes");
}

// The SM90 warp-specialized backward reads q, dout, k and v through TMA:
// no dropout, on strides TMA can step, dout's among them.
void check_sm90_bwd_support() {
  const char* config = "sm90 bwd support";
  flashtile::BwdParams p;
  p.batch = 2, p.seqlen_q = 100, p.seqlen_k = 90, p.nheads = 4, p.nheads_k = 2, p.head_dim = 128;
  p.q_row_stride = p.dout_row_stride = 512, p.q_head_stride = p.dout_head_stride = 128;
  p.q_batch_stride = p.dout_batch_stride = 51200;
  p.k_row_stride = 256, p.k_head_stride = 128, p.k_batch_stride = 23040;
  p.v_row_stride = 256, p.v_head_stride = 128, p.v_batch_stride = 23040;
  expect(flashtile::sm90::bwd_supports(p), config, "a contiguous fixed-length batch");
  flashtile::BwdParams q = p;
  q.dropout_p = 0.1f;
  expect(!flashtile::sm90::bwd_supports(q), config, "dropout runs the kernels without TMA");
  q = p, q.dout_row_stride = 0;
  expect(!flashtile::sm90::bwd_supports(q), config, "dout expanded along the rows (stride 0)");
  q = p, q.dout_head_stride = 4;
  expect(!flashtile::sm90::bwd_supports(q), config, "dout's head stride not a multiple of 16 bytes");
  q = p, q.nheads = 1, q.nheads_k = 1, q.q_head_stride = q.dout_head_stride = 0, q.k_head_stride = q.v_head_stride = 0;
  expect(flashtile::sm90::bwd_supports(q), config, "stride 0 on modes of extent 1");
  // Softcap and ALiBi run the sm90 backward (its scoremod variant), dropout
  // the SM80 kernels.
  q = p, q.softcap = 30.f;
  expect(flashtile::sm90::bwd_supports(q), config, "softcap");
  q.alibi_slopes = &q.softcap;
  expect(flashtile::sm90::bwd_supports(q), config, "softcap and ALiBi");
  q.dropout_p = 0.1f;
  expect(!flashtile::sm90::bwd_supports(q), config, "softcap, ALiBi and dropout");
}

// The warp-specialized backward's per-query-column values (LSE, D;
// sm90/column_values.hpp) assume its Sᵀ and dPᵀ partition: every consumer
// thread's column ni, in every row of its fragment, is
// accumulator_column(lane, ni).
template <int kD>
void check_bwd_ws_columns(const char* config) {
  using Traits = flashtile::sm90::BwdWsTraits<kD, cutlass::bfloat16_t>;
  using namespace cute;
  typename Traits::TiledMmaSdP mma;
  const auto identity = make_identity_tensor(Shape<Int<Traits::kBlockN>, Int<Traits::kBlockM>>{});
  bool columns_match = true;
  bool counts_match = true;
  for (int t = 0; t < Traits::kMmaThreads; ++t) {
    const auto ct = flashtile::rowcol_view(mma.get_thread_slice(t).partition_C(identity));  // (keys, queries)
    counts_match = counts_match && int(size<1>(ct)) == Traits::kBlockM / 4;
    for (int mi = 0; mi < int(size<0>(ct)); ++mi) {
      for (int ni = 0; ni < int(size<1>(ct)); ++ni) {
        columns_match = columns_match && int(get<1>(ct(mi, ni))) == flashtile::sm90::accumulator_column(t % 32, ni);
      }
    }
  }
  expect(counts_match, config, "each thread holds kBlockM / 4 query columns");
  expect(columns_match, config, "query column ni of lane l is accumulator_column(l, ni)");
  // The split form: column ni of lane l is where the shuffle fetches it from,
  // each kept value loaded by exactly one lane of the 8 that share it.
  using Split = flashtile::sm90::ColumnValues<Traits::kBlockM, true>;
  bool fetched_right = true;
  std::set<std::pair<int, int>> kept;  // (l mod 4, column)
  for (int lane = 0; lane < 32; ++lane) {
    for (int ni = 0; ni < Traits::kBlockM / 4; ++ni) {
      const int source = Split::source_lane(lane, ni);
      fetched_right = fetched_right && source % 4 == lane % 4 &&
                      Split::held_column(source, Split::source_index(ni)) == flashtile::sm90::accumulator_column(lane, ni);
    }
    for (int index = 0; index < 2 * Split::kGroupsPerLane; ++index) kept.insert({lane % 4, Split::held_column(lane, index)});
  }
  expect(fetched_right, config, "split column values: each column fetched from a lane that keeps it");
  expect(int(kept.size()) == 32 * 2 * Split::kGroupsPerLane, config, "split column values: no column kept twice");
}

// Every tile of one head dim's SM80 backward for a shared-memory budget (no
// mask, causal and local, and the deterministic mode's dQ kernel) within
// that budget and passing check_bwd_config.
template <int kD, flashtile::SmemBudget kBudget>
void check_bwd_budget(const char* name) {
  using Main = flashtile::sm80::BwdTraitsFor<kD, cutlass::bfloat16_t, kBudget>;
  const int limit = flashtile::smem_budget_bytes(kBudget);
  check_bwd_config<typename Main::template type<false>>((std::string(name) + " no mask").c_str(), limit);
  check_bwd_config<typename Main::template type<true>>((std::string(name) + " causal").c_str(), limit);
  check_bwd_config<flashtile::sm80::BwdDqTraitsFor<kD, cutlass::bfloat16_t, kBudget>, true>(
      (std::string(name) + " dq-kernel").c_str(), limit);
}

}  // namespace

int main() {
  check_philox();
  check_tail_split();
  using flashtile::sm80::FwdTraitsFor;
  using flashtile::sm80::BwdTraits;
  // Shared-memory limits: 99 KB runs everywhere (sm80+); 163 KB needs sm80
  // or sm90; above that, sm90 only.
  check_fwd_config<FwdTraitsFor<64, false, cutlass::half_t>>("fwd d64 fp16");
  check_fwd_config<FwdTraitsFor<128, false, cutlass::half_t>>("fwd d128 fp16");
  check_fwd_config<FwdTraitsFor<32, false, cutlass::bfloat16_t>>("fwd d32");
  check_fwd_config<FwdTraitsFor<64, false, cutlass::bfloat16_t>>("fwd d64");
  check_fwd_config<flashtile::sm80::FwdShortTraitsFor<64, cutlass::bfloat16_t>>("fwd d64 short keys");
  check_fwd_config<flashtile::sm80::FwdShortTraitsFor<64, cutlass::half_t>>("fwd d64 short keys fp16");
  check_fwd_config<FwdTraitsFor<96, false, cutlass::bfloat16_t>>("fwd d96");
  check_fwd_config<FwdTraitsFor<128, false, cutlass::bfloat16_t>>("fwd d128");
  check_fwd_config<FwdTraitsFor<192, false, cutlass::bfloat16_t>>("fwd d192");
  check_fwd_config<FwdTraitsFor<256, false, cutlass::bfloat16_t>>("fwd d256", kSmemLimitSm80Bytes);
  check_fwd_config<FwdTraitsFor<256, true, cutlass::bfloat16_t>>("fwd d256 causal");
  using flashtile::sm80::BwdConfig;
  check_bwd_config<BwdTraits<32, cutlass::bfloat16_t, BwdConfig<32, false>>>("bwd d32");
  check_bwd_config<BwdTraits<64, cutlass::bfloat16_t, BwdConfig<64, false>>>("bwd d64");
  check_bwd_config<BwdTraits<64, cutlass::bfloat16_t, BwdConfig<64, true>>>("bwd d64 causal");
  check_bwd_config<BwdTraits<96, cutlass::bfloat16_t, BwdConfig<96, false>>>("bwd d96");
  check_bwd_config<BwdTraits<96, cutlass::bfloat16_t, BwdConfig<96, true>>>("bwd d96 causal");
  check_bwd_config<BwdTraits<128, cutlass::bfloat16_t, BwdConfig<128, false>>>("bwd d128");
  check_bwd_config<BwdTraits<192, cutlass::bfloat16_t, BwdConfig<192, false>>>("bwd d192");
  check_bwd_config<BwdTraits<192, cutlass::bfloat16_t, BwdConfig<192, true>>>("bwd d192 causal");
  check_bwd_config<BwdTraits<256, cutlass::bfloat16_t, BwdConfig<256, false>>>("bwd d256", kSmemLimitSm90Bytes);
  using flashtile::sm80::BwdDqConfig;
  check_bwd_config<BwdTraits<32, cutlass::bfloat16_t, BwdDqConfig<32>>, true>("bwd dq-kernel d32");
  check_bwd_config<BwdTraits<64, cutlass::bfloat16_t, BwdDqConfig<64>>, true>("bwd dq-kernel d64");
  check_bwd_config<BwdTraits<96, cutlass::bfloat16_t, BwdDqConfig<96>>, true>("bwd dq-kernel d96");
  check_bwd_config<BwdTraits<128, cutlass::bfloat16_t, BwdDqConfig<128>>, true>("bwd dq-kernel d128");
  check_bwd_config<BwdTraits<192, cutlass::bfloat16_t, BwdDqConfig<192>>, true>("bwd dq-kernel d192");
  check_bwd_config<BwdTraits<256, cutlass::bfloat16_t, BwdDqConfig<256>>, true>("bwd dq-kernel d256",
                                                                                kSmemLimitSm90Bytes);
  using flashtile::SmemBudget;
  check_fwd_config<FwdTraitsFor<256, false, cutlass::bfloat16_t, SmemBudget::k99KB>>("fwd d256 99 KB");
  check_fwd_config<FwdTraitsFor<32, false, cutlass::bfloat16_t, SmemBudget::k99KB>>("fwd d32 99 KB");
  check_fwd_config<FwdTraitsFor<64, false, cutlass::bfloat16_t, SmemBudget::k99KB, true>>(
      "fwd d64 99 KB, modifiers (8 warps)");
  check_fwd_config<FwdTraitsFor<96, true, cutlass::bfloat16_t, SmemBudget::k99KB>>("fwd d96 causal 99 KB");
  check_fwd_config<FwdTraitsFor<96, false, cutlass::half_t, SmemBudget::k99KB, true>>(
      "fwd d96 99 KB fp16, modifiers (8 warps)");
  check_fwd_config<FwdTraitsFor<128, false, cutlass::bfloat16_t, SmemBudget::k99KB>>("fwd d128 99 KB");
  check_fwd_config<FwdTraitsFor<128, true, cutlass::half_t, SmemBudget::k99KB>>("fwd d128 causal 99 KB fp16");
  check_fwd_config<FwdTraitsFor<128, false, cutlass::bfloat16_t, SmemBudget::k99KB, true>>(
      "fwd d128 99 KB, modifiers (8 warps)");
  check_bwd_budget<32, SmemBudget::k99KB>("bwd d32 99 KB");
  check_bwd_budget<64, SmemBudget::k99KB>("bwd d64 99 KB");
  check_bwd_budget<96, SmemBudget::k99KB>("bwd d96 99 KB");
  check_bwd_budget<128, SmemBudget::k99KB>("bwd d128 99 KB");
  check_bwd_budget<192, SmemBudget::k99KB>("bwd d192 99 KB");
  check_bwd_budget<256, SmemBudget::k99KB>("bwd d256 99 KB");
  check_bwd_budget<64, SmemBudget::k163KB>("bwd d64 163 KB");
  check_bwd_budget<128, SmemBudget::k163KB>("bwd d128 163 KB");
  check_bwd_budget<192, SmemBudget::k163KB>("bwd d192 163 KB");
  check_bwd_budget<256, SmemBudget::k163KB>("bwd d256 163 KB");
  check_tile_schedule();
  check_varlen_layout();
  check_sm90_fwd_support();
  check_sm90_bwd_support();
  check_bwd_ws_columns<32>("sm90 ws bwd d32 columns");
  check_bwd_ws_columns<64>("sm90 ws bwd d64 columns");
  check_bwd_ws_columns<96>("sm90 ws bwd d96 columns");
  check_bwd_ws_columns<128>("sm90 ws bwd d128 columns");
  check_sm90_fwd_config<flashtile::sm90::FwdTraits<64, cutlass::bfloat16_t>>("sm90 fwd d64");
  check_sm90_fwd_config<flashtile::sm90::FwdTraits<128, cutlass::bfloat16_t>>("sm90 fwd d128");
  check_sm90_fwd_config<flashtile::sm90::FwdTraits<256, cutlass::half_t>>("sm90 fwd d256 fp16");
  check_sm90_fwd_config<flashtile::sm90::FwdTraits<256, cutlass::half_t, flashtile::sm90::FwdConfig<256, true>>>(
      "sm90 fwd d256 fp16, uniform tiles (128 x 80)");
  // O's buffer fits beside d96's and d128's K/V stages, not d192's or d256's.
  expect(flashtile::sm90::FwdTraits<128, cutlass::bfloat16_t>::kStoreOThroughSmem &&
             flashtile::sm90::FwdTraits<96, cutlass::half_t>::kStoreOThroughSmem,
         "sm90 fwd d96, d128", "O goes out through shared memory");
  expect(!flashtile::sm90::FwdTraits<192, cutlass::bfloat16_t>::kStoreOThroughSmem &&
             !flashtile::sm90::FwdTraits<256, cutlass::bfloat16_t>::kStoreOThroughSmem,
         "sm90 fwd d192, d256", "O goes out from registers (no room for its buffer)");
  using flashtile::MaskKind;
  check_block_mask<MaskKind::kNone, 128, 128>("mask 128x128");
  check_block_mask<MaskKind::kCausal, 128, 128>("mask causal 128x128");
  check_block_mask<MaskKind::kLocal, 128, 128>("mask local 128x128");
  check_block_mask<MaskKind::kNone, 64, 128>("mask 64x128");
  check_block_mask<MaskKind::kCausal, 64, 128>("mask causal 64x128");
  check_block_mask<MaskKind::kLocal, 64, 128>("mask local 64x128");
  check_block_mask<MaskKind::kCausal, 128, 64>("mask causal 128x64 (forward)");
  check_block_mask<MaskKind::kLocal, 128, 64>("mask local 128x64 (forward)");
  check_block_mask<MaskKind::kLocal, 128, 128>("mask local 128x128 (forward d32)");
  check_block_mask<MaskKind::kCausal, 64, 64>("mask causal 64x64 (dQ kernel)");
  check_block_mask<MaskKind::kLocal, 64, 64>("mask local 64x64 (dQ kernel, d192/256)");
  check_block_mask<MaskKind::kCausal, 32, 64>("mask causal 32x64 (d192 99 KB, d256 163 KB)");
  check_block_mask<MaskKind::kLocal, 32, 64>("mask local 32x64");
  check_block_mask<MaskKind::kCausal, 32, 32>("mask causal 32x32 (d256 99 KB)");
  check_block_mask<MaskKind::kLocal, 32, 32>("mask local 32x32");
  check_block_mask<MaskKind::kCausal, 64, 32>("mask causal 64x32 (dQ kernel, d128 99 KB, d256 163 KB)");
  check_block_mask<MaskKind::kLocal, 64, 32>("mask local 64x32");
  check_block_mask<MaskKind::kCausal, 128, 32>("mask causal 128x32 (forward d128 99 KB)");
  check_block_mask<MaskKind::kLocal, 128, 32>("mask local 128x32");
  std::printf("%d passed, %d failed\n", g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}
