// Tile configuration of the SM90 backward main kernel (sm90/bwd_kernel.hpp):
// the SM80 kernel's CTA and walk, with its five products on wgmma, whose
// operands stream from shared memory through descriptors instead of through
// ldmatrix and registers. Two warpgroups (8 warps) split every product's N:
//   SdP: S = Q·Kᵀ and dP = dO·Vᵀ     (kBlockM × kBlockN)   operands K-major
//   dKV: dV += Pᵀ·dO, dK += dSᵀ·Q     (kBlockN × kHeadDim)  operands MN-major
//   dQ:  dQ = dS·K                     (kBlockM × kHeadDim)  A K-major, B MN-major
// The MN-major operands are transposed views of the same 128-byte-swizzled
// tiles (a K-major 8 × 64 atom read column-wise is an MN-major 64 × 8 one).
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "flashtile/common/smem_layout.hpp"

namespace flashtile::sm90 {

using namespace cute;

// Block shapes per head dim and mask: query rows × keys.
template <int kHeadDim, bool kIsCausal>
struct BwdConfig {
  static constexpr int kBlockM = 64, kBlockN = 64;
};

template <int kHeadDim_, class Element_, class Config_>
struct BwdTraits {
  using Config = Config_;
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kWarpGroups = 2;
  static constexpr int kNWarps = 4 * kWarpGroups;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr bool kWgmma = true;
  static constexpr bool kDqOwnKernel = false;  // dQ by atomic adds outside deterministic mode
  static_assert(kHeadDim % 64 == 0 && kBlockN % 64 == 0 && kBlockM == 64,
                "128-byte swizzle atoms tile whole rows; one wgmma M of 64 query rows");

  // Each warpgroup takes 1 / kWarpGroups of a product's columns.
  template <int kM, int kN, GMMA::Major kMajorA, GMMA::Major kMajorB>
  using TiledMmaFor =
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<Int<kM>, Int<kN / kWarpGroups>, _16>,
                                                   kMajorA, kMajorB>(),
                              Layout<Shape<_1, Int<kWarpGroups>, _1>>{}));
  using TiledMmaSdP = TiledMmaFor<kBlockM, kBlockN, GMMA::Major::K, GMMA::Major::K>;
  using TiledMmadKV = TiledMmaFor<kBlockN, kHeadDim, GMMA::Major::MN, GMMA::Major::MN>;
  using TiledMmadQ = TiledMmaFor<kBlockM, kHeadDim, GMMA::Major::K, GMMA::Major::MN>;

  // Tiles of 8-row swizzle atoms 64 columns wide (128-byte rows), or 32
  // (64-byte rows) where a warpgroup's half of the head dim is not a multiple
  // of 64 (192): an MN-major operand's N must be whole atoms.
  template <int kCols>
  static constexpr int kAtomCols = (kCols / kWarpGroups) % 64 == 0 ? 64 : 32;
  template <int kCols>
  using SmemLayoutAtomFor = std::conditional_t<kAtomCols<kCols> == 64, GMMA::Layout_K_SW128_Atom<Element>,
                                               GMMA::Layout_K_SW64_Atom<Element>>;
  template <int kRows, int kCols>
  using SmemLayoutTile = decltype(tile_to_shape(SmemLayoutAtomFor<kCols>{}, Shape<Int<kRows>, Int<kCols>>{}));
  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim>;    // Q and dO: (kBlockM, kHeadDim)
  using SmemLayoutKV = SmemLayoutTile<kBlockN, kHeadDim>;   // K and V: (kBlockN, kHeadDim)
  using SmemLayoutPdS = SmemLayoutTile<kBlockM, kBlockN>;   // P and dS: (kBlockM, kBlockN)
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;     // (kHeadDim, kBlockM)
  using SmemLayoutKt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;    // (kHeadDim, kBlockN)
  using SmemLayoutPdSt = TransposedLayout<SmemLayoutPdS, kBlockM, kBlockN>;  // (kBlockN, kBlockM)

  static constexpr int kSmemQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemPdSBytes = kBlockM * kBlockN * sizeof(Element);
  static constexpr int kSmemRowsBytes = kBlockM * int(sizeof(float));
  // Q, dO, LSE and D double-buffered; K, V, P, dS single.
  static constexpr int kSmemBytes = 4 * kSmemQBytes + 2 * kSmemKVBytes + 2 * kSmemPdSBytes + 4 * kSmemRowsBytes;

  // Q, dO, K, V in (cp.async) and dK, dV, dQ out, one thread group per atom row.
  using GmemTiledCopy =
      GmemTiledCopyForAtom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element, kNThreads, kAtomCols<kHeadDim>>;
  using GmemTiledCopyStore =
      GmemTiledCopyForAtom<UniversalCopy<uint128_t>, Element, kNThreads, kAtomCols<kHeadDim>>;
  using SmemCopyAtomPdS = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
  using RowCopyAtom = SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>;
};

}  // namespace flashtile::sm90
