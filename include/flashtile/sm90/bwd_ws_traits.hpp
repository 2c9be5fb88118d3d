// Tile configuration of the warp-specialized SM90 backward
// (sm90/bwd_ws_kernel.hpp). A CTA owns kBlockN = 128 keys of one K/V head;
// its two consumer warpgroups own 64 keys each and walk the query blocks
// (kBlockM = 128 rows at d32 and d64, 64 at d96 and d128) that see them.
// Per query block, warpgroup w computes on its keys:
//   Sᵀ  = K_w·Qᵀ,  dPᵀ = V_w·dOᵀ     (64 × kBlockM)   SS, both K-major
//   dV_w += Pᵀ·dO, dK_w += dSᵀ·Q      (64 × kHeadDim)  RS: Pᵀ, dSᵀ from registers
// and, once both warpgroups have staged dSᵀ in shared memory, its share of
//   dQ = dS·K                           SS, both MN-major
// (rows 64w..64w+63 at d32 and d64, head-dim half w at d96 and d128).
// Computing Sᵀ rather than S puts the keys on wgmma's M, so Pᵀ and dSᵀ
// leave the accumulators already as the A operands of dV and dK: nothing
// goes through shared memory for them, and dK, dV stay in registers.
//
// Warpgroup 0 is the producer: its warp 0 loads (K and V once by TMA; per
// query block Q and dO by TMA, its LSE and D rows by its lanes); the
// consumers add dQ into the fp32 accumulator themselves.
#pragma once

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_traits_sm90.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <cstdint>
#include <type_traits>

#include "flashtile/common/smem_layout.hpp"
#include "flashtile/sm90/smem_atoms.hpp"

namespace flashtile::sm90 {

using namespace cute;

template <int kHeadDim_, class Element_>
struct BwdWsTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr bool kStagedScores = false;  // Pᵀ, dSᵀ stay in registers (the kernel's branch)
  static constexpr int kHeadDim = kHeadDim_;
  // Query rows per step. At d64, 128: Sᵀ, dPᵀ and dQ are then n128 wgmmas
  // (6 KB of shared memory read per 262 kFLOP; n64 reads 4 KB per 131 kFLOP,
  // all of shared memory's bandwidth at the tensor cores' rate), and dK, dV
  // (32 fp32 each) leave the registers for Sᵀ and dPᵀ's 64 each; at d32
  // too (16 each). At d96 and d128 64 rows: dK and dV take 48 or 64 each.
  static constexpr int kBlockM = kHeadDim <= 64 ? 128 : 64;
  static constexpr int kBlockN = 128;  // keys per CTA, 64 per consumer warpgroup
  static constexpr int kStages = 2;    // Q, dO, LSE, D buffers
  static constexpr int kMmaWarpgroups = 2;
  static constexpr int kMmaThreads = 128 * kMmaWarpgroups;
  static constexpr int kNThreads = 128 + kMmaThreads;  // the producer warpgroup first
  // 64 · 2 (dK, dV) + 32 · 2 (Sᵀ, dPᵀ) + 32 (dQ) fp32 per consumer thread at
  // d128, 32 · 2 + 64 · 2 + 32 at d64, in 240 registers, beside the LSE and D
  // of the thread's query columns (16 each at d128, 32 at d64) and Pᵀ, dSᵀ
  // in 16 bits: what bounds d64.
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 128, "dK and dV of 64 keys stay in registers up to d128");
  // At d64 the LSE and D of a thread's 32 query columns are split between
  // the 8 lanes that share them and fetched by shuffle (sm90/column_values.hpp):
  // with all 32 in registers beside Sᵀ, dPᵀ, dK and dV, ptxas spilled.
  static constexpr bool kSplitColumnValues = kBlockM == 128;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kMmaRegisters = 240;
  // setmaxnreg moves registers within the CTA's launch allocation (ptxas
  // gives each of the kNThreads threads 65536 / kNThreads, in steps of 8):
  // the consumers can only take what the producer gives back, else their
  // increase waits forever.
  static constexpr int kLaunchRegisters = 65536 / kNThreads / 8 * 8;
  static_assert(128 * (kLaunchRegisters - kProducerRegisters) >= kMmaThreads * (kMmaRegisters - kLaunchRegisters),
                "the consumers' registers must come from the producer's");

  // The named barrier, after CUTLASS's reserved ones (NamedBarrier adds
  // them), where both consumer warpgroups have staged their dSᵀ (also
  // K, V's tail zeroed; in the deterministic mode also before and after
  // their dQ adds, sm90/dq_turns.hpp).
  static constexpr uint32_t kBarrierConsumers = 0;  // kMmaThreads

  using KeysPerWarpgroup = Layout<Shape<Int<kMmaWarpgroups>, _1, _1>>;
  // dQ = dS·K over all kBlockN keys, split between the warpgroups by
  // query rows where there are 128 of them, else by halves of the head dim.
  static constexpr bool kDqSplitsRows = kBlockM == 64 * kMmaWarpgroups;
  static constexpr int kDqCols = kDqSplitsRows ? kHeadDim : kHeadDim / kMmaWarpgroups;  // dQ's N per warpgroup
  using DqPerWarpgroup = std::conditional_t<kDqSplitsRows, Layout<Shape<Int<kMmaWarpgroups>, _1, _1>>,
                                            Layout<Shape<_1, Int<kMmaWarpgroups>, _1>>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockM>, Int<kHeadDim>>, GMMA::Major::K,
                           GMMA::Major::K>(),
      KeysPerWarpgroup{}));  // (kBlockN, kBlockM) over kHeadDim
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockM>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      KeysPerWarpgroup{}));  // (kBlockN, kHeadDim) over kBlockM
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kDqCols>, Int<kBlockN>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      DqPerWarpgroup{}));  // (kBlockM, kHeadDim) over kBlockN
  // d96's N = 48 is one of the wgmma shapes CuTe declares only under
  // CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED (kernels/generate.py writes it
  // into the d96 backward files); without it the selector splits dQ into
  // 64 × 16 products, each reading dS's tile from shared memory again.
  static_assert(size<1>(typename TiledMmadQ::AtomShape_MNK{}) == kDqCols,
                "this tile needs CuTe's extended wgmma shapes: define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED "
                "before including any CuTe header");

  // Swizzled tiles of 8-row atoms, the widest whose columns divide the
  // tile's: 128-byte rows (64 columns), else 64-byte (32, d96's) or 32-byte
  // (16). The operands read MN-major are transposed views of them (a
  // K-major 8 × 64 atom read column-wise is an MN-major 64 × 8 one). Kᵀ is
  // dQ's MN-major B operand, whose N (a warpgroup's columns of dQ) must be
  // whole atoms: K's atom divides kDqCols (d96's warpgroups take 48 columns
  // each: 32-byte atoms for K alone).
  template <int kRows, int kCols, int kAtomCols = kCols>
  using SmemLayoutTile = decltype(tile_to_shape(GmmaAtomK<Element, kAtomCols>{}, Shape<Int<kRows>, Int<kCols>>{}));
  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim>;           // Q, dO: (kBlockM, kHeadDim), one stage
  using SmemLayoutK = SmemLayoutTile<kBlockN, kHeadDim, kDqCols>;  // (kBlockN, kHeadDim)
  using SmemLayoutV = SmemLayoutTile<kBlockN, kHeadDim>;           // (kBlockN, kHeadDim)
  using SmemLayoutdSt = SmemLayoutTile<kBlockN, kBlockM>;          // dSᵀ: (kBlockN, kBlockM)
  // bwd_convert_dq_kernel's stage, written from dQ's product fragments: a
  // warpgroup's kDqCols columns whole atoms, as K's.
  using SmemLayoutdQ = SmemLayoutTile<kBlockM, kHeadDim, kDqCols>;  // (kBlockM, kHeadDim)
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;     // (kHeadDim, kBlockM)
  using SmemLayoutKt = TransposedLayout<SmemLayoutK, kBlockN, kHeadDim>;     // (kHeadDim, kBlockN)
  using SmemLayoutdS = TransposedLayout<SmemLayoutdSt, kBlockN, kBlockM>;    // (kBlockM, kBlockN)
  // dSᵀ from the accumulator's registers by stmatrix (8 × 8 tiles of 16-bit
  // values, 16-byte rows): the element-wise copy compiled to 16 generic
  // 4-byte stores, each waited on before its address register was reused.
  using SmemCopyAtomdS = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  struct SharedStorage {
    // 1024-byte alignment: the 128-byte swizzle's period, which TMA and
    // wgmma assume of a tile's base address.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, kStages * cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, kStages * cosize_v<SmemLayoutQ>> dout;
    // dSᵀ double-buffered: a warpgroup writes block i's while the other
    // may still read block i − 1's in its dQ product.
    alignas(1024) cute::array_aligned<Element, 2 * cosize_v<SmemLayoutdSt>> ds;
    float lse_log2[kStages][kBlockM];  // LSE · log2(e); +inf for rows with no P
    float dsum[kStages][kBlockM];      // D = rowsum(dO ∘ O); 0 past the rows
    // The stage's query block, written by the loader, which walks the
    // blocks anyway: the consumers' own walk divided by the heads' block
    // counts on every block (1.7 % of their issued instructions, ncu).
    int64_t block_dq_offset[kStages];  // its first element in the dQ accumulator
    int block_m[kStages];              // its index in the sequence
    alignas(8) uint64_t barrier_kv;    // K and V's TMA loads
    uint64_t barrier_full[kStages];    // Q, dO (TMA bytes) and LSE, D (the loader lanes' arrivals)
    uint64_t barrier_empty[kStages];   // every consumer thread done with the stage
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "sm90 gives a block at most 227 KB of shared memory");
};

// What bwd_convert_dq_kernel reads of a main kernel's traits, for
// the dQ accumulator BwdWsTraits' consumers fill: their dQ product's
// register order over kMmaThreads threads, one kBlockM-row block at a time.
template <class WsTraits>
struct BwdWsConvertTraits {
  using Element = typename WsTraits::Element;
  static constexpr int kBlockM = WsTraits::kBlockM;
  static constexpr int kHeadDim = WsTraits::kHeadDim;
  static constexpr int kNThreads = WsTraits::kMmaThreads;
  using TiledMmadQ = typename WsTraits::TiledMmadQ;
  using SmemLayoutQ = typename WsTraits::SmemLayoutdQ;  // the conversion's bf16/fp16 stage
  using SmemCopyAtomPdS = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
  using GmemTiledCopyStore =
      GmemTiledCopyForAtom<UniversalCopy<uint128_t>, Element, kNThreads, kHeadDim % 64 == 0 ? 64 : 32>;
};

}  // namespace flashtile::sm90
