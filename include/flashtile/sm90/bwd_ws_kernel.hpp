// The warp-specialized SM90 backward's main kernel (tiles and roles in
// sm90/bwd_ws_traits.hpp). One CTA per key block of kBlockN keys of one K/V
// head; the query blocks that see those keys (every query head of the GQA
// group, common/bwd_walk.hpp's order) stream through a two-stage ring:
//
//   loader warp     K, V once (TMA); per query block: wait for its stage to
//                   be free, write the block's LSE · log2(e) and D there,
//                   then Q and dO by TMA; the stage completes on its
//                   mbarrier (the lanes' arrivals and TMA's bytes)
//   consumers       per query block: Sᵀ and dPᵀ issued; the mask and Pᵀ
//                   while dPᵀ's product runs; dSᵀ in registers and staged;
//                   dV += Pᵀ·dO issued; both warpgroups meet; dQ = dS·K,
//                   then dK += dSᵀ·Q, dQ added into the fp32 accumulator
//                   from registers (red.global.add.v4.f32, common/bwd_tile.hpp's
//                   register order) while dK's product runs; the stage freed
//
// then dK (scaled) and dV are written from the consumers' registers. With
// Traits::kStagedScores (d256, sm90/bwd_ws_staged_traits.hpp) the consumers
// compute S and dP with the queries on wgmma's M, stage P and dS in shared
// memory, meet, and issue dQ, dV and dK from there, adding dQ while dV's
// and dK's products run. With kDeterministic the key blocks add a query
// block's dQ in key-block order (sm90/dq_turns.hpp).
//
// With kScoreMod the kernel applies softcap and ALiBi (common/score_mod.hpp,
// decided at run time): once dPᵀ is in, one pass makes t = tanh(·) of each
// score the mask left (−inf stays −inf), P = exp2((t + bias) · scale − LSE)
// and dS = P ∘ (dP − D) ∘ (1 − t²), the chain rule through the tanh, as
// the SM80 kernels do (common/bwd_tile.hpp's recompute_p_and_ds). That pass
// needs t and dPᵀ together, so its exponentials wait for dPᵀ's product
// instead of running under it. Dropout is not taken (the SM80 kernels).
#pragma once

#include <cute/tensor.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/array.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/bwd_walk.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/bwd_ws_traits.hpp"
#include "flashtile/sm90/column_values.hpp"
#include "flashtile/sm90/dq_turns.hpp"
#include "flashtile/sm90/gemm.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm90 {

using namespace cute;

// Global tensors as TMA sees them: (rows, head dim, heads, batch); a varlen
// batch is one packed sequence of batch 1 (rows: total_q or total_k).
using BwdShapeRows = Shape<int32_t, int32_t, int32_t, int32_t>;
using BwdStrideRows = Stride<int64_t, _1, int64_t, int64_t>;

template <class Traits>
struct BwdWsTma {
  using Element = typename Traits::Element;
  template <class SmemLayout, int kRows>
  static auto make(const Element* ptr, BwdShapeRows shape, BwdStrideRows stride) {
    return make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(ptr), shape, stride), SmemLayout{},
                         Shape<Int<kRows>, Int<Traits::kHeadDim>>{}, _1{});
  }
  using Q = decltype(make<typename Traits::SmemLayoutQ, Traits::kBlockM>(nullptr, BwdShapeRows{}, BwdStrideRows{}));
  using K = decltype(make<typename Traits::SmemLayoutK, Traits::kBlockN>(nullptr, BwdShapeRows{}, BwdStrideRows{}));
  using V = decltype(make<typename Traits::SmemLayoutV, Traits::kBlockN>(nullptr, BwdShapeRows{}, BwdStrideRows{}));
};

template <class Traits>
struct BwdWsParams {
  BwdParams bwd;
  typename BwdWsTma<Traits>::Q tma_q, tma_do;
  typename BwdWsTma<Traits>::K tma_k;
  typename BwdWsTma<Traits>::V tma_v;
  BwdShapeRows shape_q;  // (rows, kHeadDim, nheads, batch)
  BwdShapeRows shape_k;  // (rows, kHeadDim, nheads_k, batch)
  float* dq_accum;
  int* dq_turns;         // the deterministic mode's (workspace.hpp), else nullptr
  const float* dsum;

  // The descriptors for p's q, dout, k and v (bwd_supports(p): TMA can step
  // their strides). A mode of extent 1 is never stepped: it gets stride 8
  // elements, whatever the caller's (TMA refuses some, 0 among them).
  static BwdWsParams make(BwdParams const& p, float* dq_accum, int* dq_turns, const float* dsum) {
    const bool varlen = is_varlen(p);
    const int32_t batch = varlen ? 1 : p.batch;
    const int32_t rows_q = varlen ? p.total_q : p.seqlen_q;
    const int32_t rows_k = varlen ? p.total_k : p.seqlen_k;
    auto strides = [&](int64_t row, int64_t head, int64_t batch_stride, int32_t rows, int32_t heads) {
      return BwdStrideRows{tma_stride(row, rows), _1{}, tma_stride(head, heads), tma_stride(batch_stride, batch)};
    };
    using Tma = BwdWsTma<Traits>;
    using Element = typename Traits::Element;
    using LayoutQ = typename Traits::SmemLayoutQ;
    const BwdShapeRows shape_q{rows_q, Traits::kHeadDim, p.nheads, batch};
    const BwdShapeRows shape_k{rows_k, Traits::kHeadDim, p.nheads_k, batch};
    return {p,
            Tma::template make<LayoutQ, Traits::kBlockM>(
                static_cast<const Element*>(p.q), shape_q,
                strides(p.q_row_stride, p.q_head_stride, p.q_batch_stride, rows_q, p.nheads)),
            Tma::template make<LayoutQ, Traits::kBlockM>(
                static_cast<const Element*>(p.dout), shape_q,
                strides(p.dout_row_stride, p.dout_head_stride, p.dout_batch_stride, rows_q, p.nheads)),
            Tma::template make<typename Traits::SmemLayoutK, Traits::kBlockN>(
                static_cast<const Element*>(p.k), shape_k,
                strides(p.k_row_stride, p.k_head_stride, p.k_batch_stride, rows_k, p.nheads_k)),
            Tma::template make<typename Traits::SmemLayoutV, Traits::kBlockN>(
                static_cast<const Element*>(p.v), shape_k,
                strides(p.v_row_stride, p.v_head_stride, p.v_batch_stride, rows_k, p.nheads_k)),
            shape_q,
            shape_k,
            dq_accum,
            dq_turns,
            dsum};
  }
};

// One sequence's rows of a (rows, d, heads, batch) TMA coordinate tensor at
// one head: its batch slice, or (varlen) its rows of the packed one.
template <class Tensor_>
CUTE_DEVICE auto bwd_sequence_rows(Tensor_ const& m, int head, SeqInfo const& seq, int row_start) {
  if (seq.varlen) return domain_offset(make_coord(row_start, _0{}), m(_, _, head, 0));
  return domain_offset(make_coord(0, _0{}), m(_, _, head, seq.batch));
}

template <class Traits, MaskKind kMask, bool kDeterministic, bool kVarlen, bool kScoreMod = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    bwd_ws_kernel(const __grid_constant__ BwdWsParams<Traits> params) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // wgmma, TMA and setmaxnreg exist on sm90a only; run_bwd launches this
  // kernel nowhere else.
  __trap();
#else
  using Element = typename Traits::Element;
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages;
  constexpr int kMmaThreads = Traits::kMmaThreads;
  using ShapeQ = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  using ShapeSt = Shape<Int<kBlockN>, Int<kBlockM>>;
  using Barrier = cutlass::arch::ClusterBarrier;
  using TransactionBarrier = cutlass::arch::ClusterTransactionBarrier;
  using NamedBarrier = cutlass::arch::NamedBarrier;
  static_assert(kBwdDqAccumRowAlign % kBlockM == 0, "dQ accumulator rows are whole query blocks");
  static_assert(kBlockM % kBwdDqTurnRows == 0, "a query block's dQ turn counter is its first rows'");
  // Named apart from the other kernels' `smem`, which asks less alignment.
  extern __shared__ __align__(1024) char bwd_ws_smem[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(bwd_ws_smem);
  BwdParams const& p = params.bwd;

  const int n_blocks = ceil_div(p.seqlen_k, kBlockN);
  const BwdTileCoord coord = bwd_main_tile_coord(p, int(blockIdx.x), n_blocks, kHeadDim);
  // The deterministic mode runs a head's key blocks last first, the order
  // in which they add a query block's dQ (sm90/dq_turns.hpp).
  const int n_block = kDeterministic ? n_blocks - 1 - coord.block_order : coord.block_order;
  const int head_k = coord.head % p.nheads_k;
  const SeqInfo seq(p, coord.head / p.nheads_k, std::bool_constant<kVarlen>{});
  if (kVarlen && n_block * kBlockN >= seq.seqlen_k_rows) return;  // past this sequence's keys
  const int kv_rows_valid = seq.seqlen_k - n_block * kBlockN;      // attended keys of the block
  const BlockMask<kMask, kBlockM, kBlockN> mask(seq.seqlen_q, seq.seqlen_k, p.window_left, p.window_right);
  const BwdQueryWalk<kMask, kBlockM, kBlockN, kDeterministic> query_block_of(mask, n_block, head_k,
                                                                                     p.nheads / p.nheads_k);
  // Keys that no query attends (past seqused_k) have dK = dV = 0: the
  // consumers write their zero accumulators, nothing is loaded.
  const int iterations = kv_rows_valid > 0 ? query_block_of.iterations : 0;

  if (threadIdx.x == 0) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_do.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
    Barrier::init(&storage.barrier_kv, 1);
    CUTE_UNROLL
    for (int stage = 0; stage < kStages; ++stage) {
      Barrier::init(&storage.barrier_full[stage], 32);  // the loader warp's lanes
      Barrier::init(&storage.barrier_empty[stage], kMmaThreads);
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  // Stage `stage` of the Q or dO ring, as (kBlockM, kHeadDim) or transposed.
  auto stage_of = [](Element* ring, int stage, auto layout) {
    return make_tensor(make_smem_ptr(ring + stage * cosize_v<typename Traits::SmemLayoutQ>), layout);
  };
  Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});  // (kBlockN, kHeadDim)
  Tensor sV = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutV{});  // (kBlockN, kHeadDim)

  const int warp_group = int(threadIdx.x) / 128;
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    const int warp = int(threadIdx.x) / 32;
    const int lane = int(threadIdx.x) % 32;
    if (warp == 0) {
      // ---- the loader ----
      Tensor mQ = params.tma_q.get_tma_tensor(params.shape_q);    // (rows, kHeadDim, nheads, batch)
      Tensor mdO = params.tma_do.get_tma_tensor(params.shape_q);  // (rows, kHeadDim, nheads, batch)
      auto tma_q = params.tma_q.get_slice(_0{});
      auto tma_do = params.tma_do.get_slice(_0{});
      if (iterations > 0 && lane == 0) {
        Tensor mK = params.tma_k.get_tma_tensor(params.shape_k);  // (rows, kHeadDim, nheads_k, batch)
        Tensor mV = params.tma_v.get_tma_tensor(params.shape_k);  // (rows, kHeadDim, nheads_k, batch)
        Tensor gK = local_tile(bwd_sequence_rows(mK, head_k, seq, seq.k_start), ShapeKV{}, make_coord(n_block, _0{}));
        Tensor gV = local_tile(bwd_sequence_rows(mV, head_k, seq, seq.k_start), ShapeKV{}, make_coord(n_block, _0{}));
        auto tma_k = params.tma_k.get_slice(_0{});
        auto tma_v = params.tma_v.get_slice(_0{});
        TransactionBarrier::arrive_and_expect_tx(&storage.barrier_kv, 2 * Traits::kBytesKV);
        copy(params.tma_k.with(storage.barrier_kv), tma_k.partition_S(gK), tma_k.partition_D(sK));
        copy(params.tma_v.with(storage.barrier_kv), tma_v.partition_S(gV), tma_v.partition_D(sV));
      }
      for (int it = 0; it < iterations; ++it) {
        const int stage = it % kStages;
        if (it >= kStages) Barrier::wait(&storage.barrier_empty[stage], (it / kStages - 1) & 1);
        const auto head_block = query_block_of(it);
        const int head = get<0>(head_block), m_block = get<1>(head_block);
        const int rows_valid = seq.seqlen_q - m_block * kBlockM;
        const int64_t row0 = seq.row_index(p, head) + int64_t(m_block) * kBlockM;
        if (lane == 0) {
          storage.block_m[stage] = m_block;
          storage.block_dq_offset[stage] = (bwd_dq_accum_row(p, seq, head) + int64_t(m_block) * kBlockM) * kHeadDim;
        }
        // A row past the sequence, or one that saw no key in the forward
        // (LSE −inf), gets +inf: its P is exp2(−inf) = 0 and its dS 0
        // (its Q and dO rows may be another sequence's, or TMA's zeros).
        CUTE_UNROLL
        for (int r = lane; r < kBlockM; r += 32) {
          const float lse = r < rows_valid ? p.lse[row0 + r] : -INFINITY;
          storage.lse_log2[stage][r] = lse == -INFINITY ? INFINITY : lse * float(M_LOG2E);
          storage.dsum[stage][r] = r < rows_valid ? params.dsum[row0 + r] : 0.f;
        }
        if (lane == 0) {
          TransactionBarrier::arrive_and_expect_tx(&storage.barrier_full[stage], 2 * Traits::kBytesQ);
          Tensor gQ = local_tile(bwd_sequence_rows(mQ, head, seq, seq.q_start), ShapeQ{}, make_coord(m_block, _0{}));
          Tensor gdO =
              local_tile(bwd_sequence_rows(mdO, head, seq, seq.q_start), ShapeQ{}, make_coord(m_block, _0{}));
          Tensor sQ = stage_of(storage.q.data(), stage, typename Traits::SmemLayoutQ{});      // (kBlockM, kHeadDim)
          Tensor sdO = stage_of(storage.dout.data(), stage, typename Traits::SmemLayoutQ{});  // (kBlockM, kHeadDim)
          copy(params.tma_q.with(storage.barrier_full[stage]), tma_q.partition_S(gQ), tma_q.partition_D(sQ));
          copy(params.tma_do.with(storage.barrier_full[stage]), tma_do.partition_S(gdO), tma_do.partition_D(sdO));
        } else {
          Barrier::arrive(&storage.barrier_full[stage]);  // releases this lane's LSE and D writes
        }
      }
    }
  } else {
    // ---- the consumers ----
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    const int mma_tid = int(threadIdx.x) - 128;
    typename Traits::TiledMmaSdP mma_sdp;
    typename Traits::TiledMmadKV mma_dkv;
    typename Traits::TiledMmadQ mma_dq;
    auto thr_sdp = mma_sdp.get_thread_slice(mma_tid);
    auto thr_dkv = mma_dkv.get_thread_slice(mma_tid);
    auto thr_dq = mma_dq.get_thread_slice(mma_tid);
    Tensor sKt = make_tensor(sK.data(), typename Traits::SmemLayoutKt{});  // (kHeadDim, kBlockN)
    Tensor tdQrKt = thr_dq.partition_fragment_B(sKt);   // (MMA, MMA_N, MMA_K) descriptors
    Tensor acc_dk = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_M, MMA_N)
    Tensor acc_dv = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_M, MMA_N)
    clear(acc_dk);
    clear(acc_dv);
    // The score modifiers of this (batch, KV head); ALiBi's slope is the
    // query head's, set per query block (block_mod). Without them
    // score_scale() is softmax_scale.
    const ScoreMod<kScoreMod> mod(p.softmax_scale, p.softcap, seq.seqlen_q, seq.seqlen_k, 0.f);
    const float scale_log2 = mod.score_scale() * float(M_LOG2E);
    // The modifiers of query block `it`: its query head's ALiBi slope (the
    // walk's head; the loader hands the consumers only the block index).
    auto block_mod = [&](int it) {
      if constexpr (kScoreMod) {
        if (p.alibi_slopes != nullptr) return mod.with_alibi_slope(alibi_slope(p, seq.batch, get<0>(query_block_of(it))));
      }
      return mod;
    };

    if (iterations > 0) {
      TransactionBarrier::wait(&storage.barrier_kv, 0);
      // A varlen batch's K, V rows past the sequence's attended keys hold
      // the next sequence's keys or unwritten cache slots: their scores are
      // masked, but 0 · NaN in dPᵀ or dQ would not be 0. Zeroed here, made
      // visible to wgmma (the async proxy). A fixed-length batch's are
      // TMA's zero fill.
      if (kVarlen && kv_rows_valid < kBlockN) {
        for (int i = mma_tid; i < (kBlockN - kv_rows_valid) * kHeadDim; i += kMmaThreads) {
          sK(kv_rows_valid + i / kHeadDim, i % kHeadDim) = Element(0);
          sV(kv_rows_valid + i / kHeadDim, i % kHeadDim) = Element(0);
        }
        fence_smem_for_wgmma();
        NamedBarrier::sync(kMmaThreads, Traits::kBarrierConsumers);
      }
    }

    // A query block's dQ tile from registers into the fp32 accumulator.
    auto add_dq = [&](auto const& acc_dq, int stage, int m_block) {
      const int64_t dq_offset = storage.block_dq_offset[stage];
      if constexpr (kDeterministic) {
        // This key block's turn among those that see the query block, the
        // last of them first.
        int* turn = params.dq_turns + dq_offset / (int64_t(kBwdDqTurnRows) * kHeadDim);
        wait_for_dq_turn<kMmaThreads>(turn, mask.n_block_end(m_block) - 1 - n_block, mma_tid,
                                      Traits::kBarrierConsumers);
        add_tile_atomic<kMmaThreads>(params.dq_accum + dq_offset, acc_dq, mma_tid);
        pass_dq_turn<kMmaThreads>(turn, mma_tid, Traits::kBarrierConsumers);
      } else {
        add_tile_atomic<kMmaThreads>(params.dq_accum + dq_offset, acc_dq, mma_tid);
      }
    };

    if constexpr (!Traits::kStagedScores) {
      const int lane = int(threadIdx.x) % 32;
      Tensor tSrK = thr_sdp.partition_fragment_A(sK);     // (MMA, MMA_M, MMA_K) descriptors
      Tensor tdPrV = thr_sdp.partition_fragment_A(sV);    // (MMA, MMA_M, MMA_K) descriptors
      Tensor tScS = thr_sdp.partition_C(make_identity_tensor(ShapeSt{}));  // (MMA, MMA_M, MMA_N) -> (key, query)
      auto copy_ds = make_tiled_copy_C(typename Traits::SmemCopyAtomdS{}, mma_sdp);
      auto thr_copy_ds = copy_ds.get_thread_slice(mma_tid);
      auto process_query_block = [&](int it) {
        const int stage = it % kStages;
        Tensor sQ = stage_of(storage.q.data(), stage, typename Traits::SmemLayoutQ{});       // (kBlockM, kHeadDim)
        Tensor sdO = stage_of(storage.dout.data(), stage, typename Traits::SmemLayoutQ{});   // (kBlockM, kHeadDim)
        Tensor sQt = stage_of(storage.q.data(), stage, typename Traits::SmemLayoutQt{});     // (kHeadDim, kBlockM)
        Tensor sdOt = stage_of(storage.dout.data(), stage, typename Traits::SmemLayoutQt{}); // (kHeadDim, kBlockM)
        Tensor tSrQ = thr_sdp.partition_fragment_B(sQ);      // (MMA, MMA_N, MMA_K) descriptors
        Tensor tdPrdO = thr_sdp.partition_fragment_B(sdO);   // (MMA, MMA_N, MMA_K) descriptors
        Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt); // (MMA, MMA_N, MMA_K) descriptors
        Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);   // (MMA, MMA_N, MMA_K) descriptors

        TransactionBarrier::wait(&storage.barrier_full[stage], (it / kStages) & 1);
        const int m_block = storage.block_m[stage];
        // The block's modifiers (its ALiBi slope: a global load) read under
        // the products, but at d64: holding the slope across them spilled
        // its kernels 20-176 bytes, reading it in the pass 32-92 (ptxas).
        constexpr bool kModifiersEarly = kHeadDim > 64;
        const auto early_modifiers = [&] {
          if constexpr (kModifiersEarly) return block_mod(it);
          else return 0;
        }();
        Tensor acc_s = partition_fragment_C(mma_sdp, ShapeSt{});   // (MMA, MMA_M, MMA_N): Sᵀ
        Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeSt{});  // (MMA, MMA_M, MMA_N): dPᵀ
        gemm_async<true>(mma_sdp, tSrK, tSrQ, acc_s);
        gemm_async<true>(mma_sdp, tdPrV, tdPrdO, acc_dp);
        // The LSE of this thread's query columns read while the products run:
        // read after them, shared memory's queue behind the products' operand
        // reads stalled the exponentials (11 % of the warps' samples, ncu).
        // (The modified kernels without split column values read LSE and D
        // from shared memory in their one pass.)
        constexpr bool kColumnValuesInRegs = !kScoreMod || Traits::kSplitColumnValues;
        ColumnValues<kBlockM, Traits::kSplitColumnValues> lse_log2;  // of the thread's query columns
        if constexpr (kColumnValuesInRegs) lse_log2.load(storage.lse_log2[stage], lane);
        warpgroup_wait<1>();  // Sᵀ; dPᵀ's product runs under the exponentials
        warpgroup_fence_operand(acc_s);

        if (query_block_of.masked(it, m_block)) {
          // Each element's (key, query) as a constant offset from the
          // thread's first one.
          const auto first = tScS(0);
          const auto anchored = mask.anchored_at(m_block * kBlockM + get<1>(first), n_block * kBlockN + get<0>(first));
          CUTE_UNROLL
          for (int i = 0; i < size(acc_s); ++i) {
            if (anchored.hides(get<1>(tScS(i)) - get<1>(first), get<0>(tScS(i)) - get<0>(first))) acc_s(i) = -INFINITY;
          }
        }
        Tensor st = rowcol_view(acc_s);   // (keys, queries)
        Tensor dpt = rowcol_view(acc_dp); // (keys, queries)
        if constexpr (!kScoreMod) {
          // Pᵀ = exp2(Sᵀ · scale · log2 e − LSE · log2 e)
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(st); ++ni) {
            const float lse = lse_log2(ni);
            CUTE_UNROLL
            for (int mi = 0; mi < size<0>(st); ++mi) st(mi, ni) = fast_exp2(st(mi, ni) * scale_log2 - lse);
          }
          // D read while dPᵀ's product runs, into the LSE's registers.
          ColumnValues<kBlockM, Traits::kSplitColumnValues> dsum;  // of the thread's query columns
          dsum.load(storage.dsum[stage], lane);

          // dSᵀ = Pᵀ ∘ (dPᵀ − D)
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_dp);
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(st); ++ni) {
            const float d = dsum(ni);
            CUTE_UNROLL
            for (int mi = 0; mi < size<0>(st); ++mi) dpt(mi, ni) = st(mi, ni) * (dpt(mi, ni) - d);
          }
        } else {
          ColumnValues<kBlockM, Traits::kSplitColumnValues> dsum;  // of the thread's query columns
          if constexpr (kColumnValuesInRegs) dsum.load(storage.dsum[stage], lane);
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_dp);
          // t = tanh(Sᵀ · softmax_scale / softcap) where the mask left a
          // score, Pᵀ = exp2((t + bias) · scale · log2 e − LSE · log2 e) and
          // dSᵀ = Pᵀ ∘ (dPᵀ − D) ∘ (1 − t²) in one pass (1 − t² only with
          // softcap; its max with 0 makes a masked t = −inf's 0). The tanh
          // here rather than before the mask: t beside dPᵀ's accumulators
          // in flight spilled 384-396 bytes at d128 in the deterministic
          // mode (ptxas), 0-12 this way. LSE and D
          // split between lanes where the traits split them (d64), else from
          // shared memory a column at a time: the 16 of each a d128 thread
          // holds, in registers beside t and dPᵀ, spilled (ptxas: 32-52
          // bytes, 4-8 this way; at d64 the reads spilled 96-120 bytes
          // against the split values' 36-100).
          const auto modifiers = [&] {
            if constexpr (kModifiersEarly) return early_modifiers;
            else return block_mod(it);
          }();
          const float dtanh_weight = modifiers.has_softcap() ? 1.f : 0.f;
          Tensor cst = rowcol_view(tScS);  // (keys, queries) -> (key, query)
          const int key0 = n_block * kBlockN, query0 = m_block * kBlockM;
          CUTE_UNROLL
          for (int ni = 0; ni < size<1>(st); ++ni) {
            const int query = get<1>(cst(0, ni));
            const float lse = kColumnValuesInRegs ? lse_log2(ni) : storage.lse_log2[stage][query];
            const float d = kColumnValuesInRegs ? dsum(ni) : storage.dsum[stage][query];
            CUTE_UNROLL
            for (int mi = 0; mi < size<0>(st); ++mi) {
              const float t = modifiers.softcapped(st(mi, ni));
              const float bias = modifiers.bias(query0 + get<1>(cst(mi, ni)), key0 + get<0>(cst(mi, ni)));
              const float pt = fast_exp2((t + bias) * scale_log2 - lse);
              const float dtanh = fmaxf(0.f, 1.f - dtanh_weight * t * t);
              st(mi, ni) = pt;
              dpt(mi, ni) = pt * (dpt(mi, ni) - d) * dtanh;
            }
          }
        }
        // Pᵀ and dSᵀ as the A operands of dV and dK: ((2, 2, 2), MMA_M, MMA_K).
        // Converted only now: at d64, Pᵀ's 16-bit copy beside Sᵀ, dPᵀ and D
        // would not fit the registers.
        Tensor tdVrPt = make_tensor<Element>(acc_to_rs_operand_a_layout(acc_s.layout()));
        Tensor tdKrdSt = make_tensor<Element>(acc_to_rs_operand_a_layout(acc_dp.layout()));
        convert_fragment_into(acc_s, tdVrPt);
        convert_fragment_into(acc_dp, tdKrdSt);

        // dSᵀ into buffer it % 2: both warpgroups finished reading it in
        // block it − 2's dQ before they met on block it − 1's.
        Element* ds_buffer = storage.ds.data() + (it % 2) * cosize_v<typename Traits::SmemLayoutdSt>;
        Tensor sdSt = make_tensor(make_smem_ptr(ds_buffer), typename Traits::SmemLayoutdSt{});  // (kBlockN, kBlockM)
        Tensor sdS = make_tensor(make_smem_ptr(ds_buffer), typename Traits::SmemLayoutdS{});    // (kBlockM, kBlockN)
        // The same registers, in the accumulator's (key, query) order.
        Tensor rdSt = make_tensor(tdKrdSt.data(), acc_dp.layout());
        copy(copy_ds, thr_copy_ds.retile_S(rdSt), thr_copy_ds.partition_D(sdSt));
        gemm_rs_async(mma_dkv, tdVrPt, tdVrdOt, acc_dv);
        fence_smem_for_wgmma();
        NamedBarrier::sync(kMmaThreads, Traits::kBarrierConsumers);  // both halves of dSᵀ staged
        // dQ, then dK once dV has retired (Pᵀ's registers free); dQ is
        // added while dK's product runs. From registers: 8 vector reductions
        // a thread, measured 1-8 % faster than a tile staged in shared memory
        // for a writer warp's bulk reduce-add (benchmarks/NOTES.md).
        Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);         // (MMA, MMA_M, MMA_K) descriptors
        Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_N)
        gemm_async<true>(mma_dq, tdQrdS, tdQrKt, acc_dq);
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc_dv);
        gemm_rs_async(mma_dkv, tdKrdSt, tdKrQt, acc_dk);
        warpgroup_wait<1>();
        warpgroup_fence_operand(acc_dq);
        add_dq(acc_dq, stage, m_block);
        warpgroup_wait<0>();
        Barrier::arrive(&storage.barrier_empty[stage]);  // Q, dO, LSE, D read
      };
      for (int it = 0; it < iterations; ++it) process_query_block(it);
    } else {
      // P and dS staged in shared memory (sm90/bwd_ws_staged_traits.hpp).
      using ShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
      using SmemLayoutPdS = typename Traits::SmemLayoutPdS;
      using SmemLayoutPdSt = typename Traits::SmemLayoutPdSt;
      Tensor tSrK = thr_sdp.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_K) descriptors
      Tensor tdPrV = thr_sdp.partition_fragment_B(sV);  // (MMA, MMA_N, MMA_K) descriptors
      Tensor cS = rowcol_view(thr_sdp.partition_C(make_identity_tensor(ShapeS{})));  // (rows, cols) -> (query, key)
      auto copy_pds = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, mma_sdp);
      auto thr_copy_pds = copy_pds.get_thread_slice(mma_tid);
      auto process_query_block = [&](int it) {
        const int stage = it % kStages;
        Tensor sQ = stage_of(storage.q.data(), stage, typename Traits::SmemLayoutQ{});       // (kBlockM, kHeadDim)
        Tensor sdO = stage_of(storage.dout.data(), stage, typename Traits::SmemLayoutQ{});   // (kBlockM, kHeadDim)
        Tensor sQt = stage_of(storage.q.data(), stage, typename Traits::SmemLayoutQt{});     // (kHeadDim, kBlockM)
        Tensor sdOt = stage_of(storage.dout.data(), stage, typename Traits::SmemLayoutQt{}); // (kHeadDim, kBlockM)
        // P and dS into buffers it % 2: both warpgroups finished reading them
        // in block it − 2's products before they met on block it − 1's.
        Element* p_buffer = storage.p.data() + (it % 2) * cosize_v<SmemLayoutPdS>;
        Element* ds_buffer = storage.ds.data() + (it % 2) * cosize_v<SmemLayoutPdS>;
        Tensor sP = make_tensor(make_smem_ptr(p_buffer), SmemLayoutPdS{});      // (kBlockM, kBlockN)
        Tensor sPt = make_tensor(make_smem_ptr(p_buffer), SmemLayoutPdSt{});    // (kBlockN, kBlockM)
        Tensor sdS = make_tensor(make_smem_ptr(ds_buffer), SmemLayoutPdS{});    // (kBlockM, kBlockN)
        Tensor sdSt = make_tensor(make_smem_ptr(ds_buffer), SmemLayoutPdSt{});  // (kBlockN, kBlockM)
        Tensor tSrQ = thr_sdp.partition_fragment_A(sQ);       // (MMA, MMA_M, MMA_K) descriptors
        Tensor tdPrdO = thr_sdp.partition_fragment_A(sdO);    // (MMA, MMA_M, MMA_K) descriptors
        Tensor tdVrPt = thr_dkv.partition_fragment_A(sPt);    // (MMA, MMA_M, MMA_K) descriptors
        Tensor tdVrdOt = thr_dkv.partition_fragment_B(sdOt);  // (MMA, MMA_N, MMA_K) descriptors
        Tensor tdKrdSt = thr_dkv.partition_fragment_A(sdSt);  // (MMA, MMA_M, MMA_K) descriptors
        Tensor tdKrQt = thr_dkv.partition_fragment_B(sQt);    // (MMA, MMA_N, MMA_K) descriptors
        Tensor tdQrdS = thr_dq.partition_fragment_A(sdS);     // (MMA, MMA_M, MMA_K) descriptors

        TransactionBarrier::wait(&storage.barrier_full[stage], (it / kStages) & 1);
        const int m_block = storage.block_m[stage];
        const auto modifiers = block_mod(it);  // its ALiBi slope's load under the products
        Tensor acc_s = partition_fragment_C(mma_sdp, ShapeS{});   // (MMA, MMA_M, MMA_N): S
        Tensor acc_dp = partition_fragment_C(mma_sdp, ShapeS{});  // (MMA, MMA_M, MMA_N): dP
        gemm_async<true>(mma_sdp, tSrQ, tSrK, acc_s);
        gemm_async<true>(mma_sdp, tdPrdO, tdPrV, acc_dp);
        Tensor s = rowcol_view(acc_s);    // (queries, keys)
        Tensor dp = rowcol_view(acc_dp);  // (queries, keys)
        constexpr int kRows = decltype(size<0>(s))::value;
        float lse_log2[kRows];  // of the thread's query rows
        CUTE_UNROLL
        for (int mi = 0; mi < kRows; ++mi) lse_log2[mi] = storage.lse_log2[stage][get<0>(cS(mi, 0))];
        warpgroup_wait<1>();  // S; dP's product runs under the exponentials
        warpgroup_fence_operand(acc_s);

        if (query_block_of.masked(it, m_block)) {
          const auto first = cS(0, 0);
          const auto anchored = mask.anchored_at(m_block * kBlockM + get<0>(first), n_block * kBlockN + get<1>(first));
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(s); ++mi) {
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(s); ++ni) {
              if (anchored.hides(get<0>(cS(mi, ni)) - get<0>(first), get<1>(cS(mi, ni)) - get<1>(first))) {
                s(mi, ni) = -INFINITY;
              }
            }
          }
        }
        Tensor tPrP = make_tensor_like<Element>(acc_s);
        if constexpr (!kScoreMod) {
          // P = exp2(S · scale · log2 e − LSE · log2 e)
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(s); ++mi) {
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(s); ++ni) s(mi, ni) = fast_exp2(s(mi, ni) * scale_log2 - lse_log2[mi]);
          }
          convert_fragment_into(acc_s, tPrP);
          copy(copy_pds, thr_copy_pds.retile_S(tPrP), thr_copy_pds.partition_D(sP));

          // dS = P ∘ (dP − D)
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_dp);
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(dp); ++mi) {
            const float d = storage.dsum[stage][get<0>(cS(mi, 0))];
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(dp); ++ni) dp(mi, ni) = s(mi, ni) * (dp(mi, ni) - d);
          }
        } else {
          // t = tanh(S · softmax_scale / softcap) where the mask left a
          // score, P = exp2((t + bias) · scale · log2 e − LSE · log2 e) and
          // dS = P ∘ (dP − D) ∘ (1 − t²) in one pass, once dP is in (the
          // non-staged branch above says why).
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_dp);
          const float dtanh_weight = modifiers.has_softcap() ? 1.f : 0.f;
          const int key0 = n_block * kBlockN, query0 = m_block * kBlockM;
          CUTE_UNROLL
          for (int mi = 0; mi < size<0>(s); ++mi) {
            const float d = storage.dsum[stage][get<0>(cS(mi, 0))];
            CUTE_UNROLL
            for (int ni = 0; ni < size<1>(s); ++ni) {
              const float t = modifiers.softcapped(s(mi, ni));
              const float bias = modifiers.bias(query0 + get<0>(cS(mi, ni)), key0 + get<1>(cS(mi, ni)));
              const float pr = fast_exp2((t + bias) * scale_log2 - lse_log2[mi]);
              const float dtanh = fmaxf(0.f, 1.f - dtanh_weight * t * t);
              s(mi, ni) = pr;
              dp(mi, ni) = pr * (dp(mi, ni) - d) * dtanh;
            }
          }
          convert_fragment_into(acc_s, tPrP);
          copy(copy_pds, thr_copy_pds.retile_S(tPrP), thr_copy_pds.partition_D(sP));
        }
        Tensor tdSrdS = make_tensor_like<Element>(acc_dp);
        convert_fragment_into(acc_dp, tdSrdS);
        copy(copy_pds, thr_copy_pds.retile_S(tdSrdS), thr_copy_pds.partition_D(sdS));
        fence_smem_for_wgmma();
        NamedBarrier::sync(kMmaThreads, Traits::kBarrierConsumers);  // both key halves of P and dS staged

        // dQ first, so that its adds run while dV's and dK's products do.
        Tensor acc_dq = partition_fragment_C(mma_dq, ShapeQ{});  // (MMA, MMA_M, MMA_N)
        gemm_async<true>(mma_dq, tdQrdS, tdQrKt, acc_dq);
        gemm_async<false>(mma_dkv, tdVrPt, tdVrdOt, acc_dv);
        gemm_async<false>(mma_dkv, tdKrdSt, tdKrQt, acc_dk);
        warpgroup_wait<2>();
        warpgroup_fence_operand(acc_dq);
        add_dq(acc_dq, stage, m_block);
        warpgroup_wait<0>();
        Barrier::arrive(&storage.barrier_empty[stage]);  // Q, dO, LSE, D read
      };
      for (int it = 0; it < iterations; ++it) process_query_block(it);
    }
    warpgroup_fence_operand(acc_dk);
    warpgroup_fence_operand(acc_dv);

    // dK · softmax_scale and dV, in the output dtype, each thread's column
    // pairs as 4-byte words; rows past the sequence's keys left alone (rows
    // past seqused_k get their zeros: no P reached them).
    auto [gK, gV, gdK, gdV] = key_block_tiles<kHeadDim, kBlockN, Element>(p, seq, head_k, n_block);
    const int rows_out = seq.seqlen_k_rows - n_block * kBlockN;
    Tensor cKV = rowcol_view(thr_dkv.partition_C(make_identity_tensor(ShapeKV{})));  // (rows, cols) -> (key, d)
    auto store = [&](auto const& acc, auto& out, float scale) {
      Tensor rows = rowcol_view(acc);  // (rows, cols)
      using Pair = cutlass::Array<Element, 2>;
      CUTE_UNROLL
      for (int r = 0; r < size<0>(rows); ++r) {
        const int row = get<0>(cKV(r, 0));
        if (row >= rows_out) continue;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(rows); c += 2) {
          Pair pair;
          pair[0] = Element(rows(r, c) * scale);
          pair[1] = Element(rows(r, c + 1) * scale);
          *reinterpret_cast<Pair*>(&out(row, get<1>(cKV(r, c)))) = pair;
        }
      }
    };
    store(acc_dk, gdK, p.softmax_scale);
    store(acc_dv, gdV, 1.f);
  }
#endif
}

}  // namespace flashtile::sm90
