// Tile configuration of the warp-specialized SM90 backward at head dims
// whose dK and dV do not fit one warpgroup's registers for 64 keys (d192
// and d256: at d256 64 × 256 fp32 each, 128 registers a thread apiece).
// The CTA owns kBlockN = 64 keys; its two consumer warpgroups split the
// head dim of dK, dV and dQ (96 or 128 columns each) and the keys of S and
// dP (32 each). Per
// query block of kBlockM = 64 rows, warpgroup w computes
//   S   = Q·K_wᵀ,  dP = dO·V_wᵀ         (64 × 32)    SS, both K-major
// P and dS of its 32 keys, and stages them (16-bit) in shared memory; once
// both warpgroups have staged theirs, on its head-dim half h_w:
//   dV_w += Pᵀ·dO_h,  dK_w += dSᵀ·Q_h    (64 × kHeadDim / 2)   SS, both MN-major
//   dQ_w  = dS·K_hᵀ                       (64 × kHeadDim / 2)   SS, A K-major, B MN-major
// dK_w and dV_w stay in registers (64 fp32 each at d256); dQ_w is added
// into the fp32 accumulator from registers as in the 32-128 kernel.
// FlashAttention-3 and -4 also stage P and dS at d256 (64 × 80 and 64 × 48
// tiles, hdim on the dK/dV product's M); with 64 keys the keys stay on M.
// Q, dO and K are read in head-dim halves (the B operands Q_h, dO_h, K_hᵀ),
// so their swizzle atoms divide kHeadDim / 2: 128-byte at d256, 64-byte at
// d192 (96 columns a half); V, read whole, keeps 128-byte ones.
//
// The producer warpgroup, its loader warp and the stage ring are those of
// sm90/bwd_ws_traits.hpp (same SharedStorage names, plus P's buffers).
#pragma once

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/mma_sm90.hpp>
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
struct BwdWsStagedTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr bool kStagedScores = true;  // P and dS through shared memory (the kernel's branch)
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = 64;
  static constexpr int kStages = 2;
  static constexpr int kMmaWarpgroups = 2;
  static constexpr int kMmaThreads = 128 * kMmaWarpgroups;
  static constexpr int kNThreads = 128 + kMmaThreads;
  static constexpr int kHalfDim = kHeadDim / kMmaWarpgroups;
  static_assert(kHalfDim % 32 == 0, "each warpgroup's head-dim half is whole 64- or 128-byte atoms");
  static constexpr int kProducerRegisters = 24;
  static constexpr int kMmaRegisters = 240;
  static constexpr int kLaunchRegisters = 65536 / kNThreads / 8 * 8;
  static_assert(128 * (kLaunchRegisters - kProducerRegisters) >= kMmaThreads * (kMmaRegisters - kLaunchRegisters),
                "the consumers' registers must come from the producer's");
  static constexpr bool kSplitColumnValues = false;

  // Both consumer warpgroups have staged their P and dS halves (also K, V's
  // tail zeroed; the deterministic mode's dQ turns).
  static constexpr uint32_t kBarrierConsumers = 0;

  using SplitN = Layout<Shape<_1, Int<kMmaWarpgroups>, _1>>;
  using TiledMmaSdP = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN / kMmaWarpgroups>, Int<kHeadDim>>,
                           GMMA::Major::K, GMMA::Major::K>(),
      SplitN{}));  // (kBlockM, kBlockN) over kHeadDim
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHalfDim>, Int<kBlockM>>, GMMA::Major::MN,
                           GMMA::Major::MN>(),
      SplitN{}));  // (kBlockN, kHeadDim) over kBlockM
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kHalfDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      SplitN{}));  // (kBlockM, kHeadDim) over kBlockN

  template <int kRows, int kCols, int kAtomCols = kCols>
  using SmemLayoutTile = decltype(tile_to_shape(GmmaAtomK<Element, kAtomCols>{}, Shape<Int<kRows>, Int<kCols>>{}));
  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim, kHalfDim>;  // Q, dO: (kBlockM, kHeadDim), one stage
  using SmemLayoutK = SmemLayoutTile<kBlockN, kHeadDim, kHalfDim>;  // (kBlockN, kHeadDim)
  using SmemLayoutV = SmemLayoutTile<kBlockN, kHeadDim>;            // (kBlockN, kHeadDim)
  using SmemLayoutdQ = SmemLayoutQ;  // bwd_convert_dq_kernel's stage, written in head-dim halves
  using SmemLayoutPdS = SmemLayoutTile<kBlockM, kBlockN>;  // P, dS: (kBlockM, kBlockN)
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;     // (kHeadDim, kBlockM)
  using SmemLayoutKt = TransposedLayout<SmemLayoutK, kBlockN, kHeadDim>;     // (kHeadDim, kBlockN)
  using SmemLayoutPdSt = TransposedLayout<SmemLayoutPdS, kBlockM, kBlockN>;  // (kBlockN, kBlockM)
  // P and dS from the accumulator's registers by stmatrix.
  using SmemCopyAtomPdS = Copy_Atom<SM90_U32x4_STSM_N, Element>;

  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  struct SharedStorage {
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutV>> v;
    alignas(1024) cute::array_aligned<Element, kStages * cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, kStages * cosize_v<SmemLayoutQ>> dout;
    // P and dS double-buffered: a warpgroup stages block i's while the
    // other may still read block i − 1's in its products.
    alignas(1024) cute::array_aligned<Element, 2 * cosize_v<SmemLayoutPdS>> p;
    alignas(1024) cute::array_aligned<Element, 2 * cosize_v<SmemLayoutPdS>> ds;
    float lse_log2[kStages][kBlockM];  // LSE · log2(e); +inf for rows with no P
    float dsum[kStages][kBlockM];      // D = rowsum(dO ∘ O); 0 past the rows
    int64_t block_dq_offset[kStages];  // the stage's first element in the dQ accumulator
    int block_m[kStages];              // the stage's query block
    alignas(8) uint64_t barrier_kv;
    uint64_t barrier_full[kStages];
    uint64_t barrier_empty[kStages];
  };
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  // d256: K, V 64 KB, two Q + dO stages 128 KB, P and dS twice 32 KB: a
  // third stage does not fit (d192: 176 KB in all).
  static_assert(kSmemBytes <= 227 * 1024, "sm90 gives a block at most 227 KB of shared memory");
};

}  // namespace flashtile::sm90
