// Tile configuration of the SM80 forward kernel: block shape, warps,
// shared-memory layouts and swizzles, the TiledMMA and every copy atom, all
// as types. FwdConfig is the one table that maps a head dim to its shape.
#pragma once

#include <cute/algorithm/copy.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

namespace flashtile::sm80 {

using namespace cute;

// Block shapes per head dim. Both use 4 warps, each owning 16-row slices of
// the query block (split-Q: no cross-warp softmax). Shared memory per CTA:
// (kBlockM + 2·kBlockN) · head_dim · 2 B = 32 KB (d64), 64 KB (d128); ~235
// and 255 registers a thread, so two CTAs share an SM.
// Measured on the H200 (bf16, seqlen 16k, benchmarks/NOTES.md): d64 128×64
// beats FlashAttention-2's 128×128 (329 vs 290 TFLOP/s; S needs half the
// registers); d128 128×64 beats 128×32 (382 vs 358), 64×64 and 8 warps.
template <int kHeadDim>
struct FwdConfig;
template <>
struct FwdConfig<64> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};
template <>
struct FwdConfig<128> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, class Element_>
struct FwdTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 64 == 0, "the 8x64 swizzle atom tiles whole 128-byte rows");

  // m16n8k16, fp32 accumulate. Warps tile M; the 16-wide N tile lets one
  // ldmatrix.x4 feed two n8 MMAs.
  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;

  // Shared memory: rows of 64 elements (128 B) in 8-row atoms; Swizzle<3,3,3>
  // XORs the 16-byte chunk index with the row, so both the row-wise cp.async
  // stores and the column-wise ldmatrix reads are bank-conflict free.
  using SmemLayoutAtom = decltype(composition(
      Swizzle<3, 3, 3>{}, Layout<Shape<_8, _64>, Stride<_64, _1>>{}));
  using SmemLayoutQ = decltype(tile_to_shape(SmemLayoutAtom{},
                                             Shape<Int<kBlockM>, Int<kHeadDim>>{}));  // (kBlockM, kHeadDim)
  using SmemLayoutKV = decltype(tile_to_shape(SmemLayoutAtom{},
                                              Shape<Int<kBlockN>, Int<kHeadDim>>{}));  // (kBlockN, kHeadDim)
  // Vᵀ as a view of the same bytes, for the P·V product's B operand.
  using SmemLayoutVt = decltype(composition(
      SmemLayoutKV{}, make_layout(Shape<Int<kHeadDim>, Int<kBlockN>>{}, GenRowMajor{})));  // (kHeadDim, kBlockN)
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's buffer

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * sizeof(Element);
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  // Global <-> shared: 16-byte vectors, 8 threads per 64-element row chunk.
  static constexpr int kElemsPerVector = 16 / sizeof(Element);
  static constexpr int kThreadsPerRow = 64 / kElemsPerVector;
  using GmemThreadLayout = Layout<Shape<Int<kNThreads / kThreadsPerRow>, Int<kThreadsPerRow>>,
                                  Stride<Int<kThreadsPerRow>, _1>>;
  using GmemValueLayout = Layout<Shape<_1, Int<kElemsPerVector>>>;
  // CACHEGLOBAL: K/V tiles are re-read by other CTAs through L2, not L1.
  using GmemTiledCopyQKV = decltype(make_tiled_copy(
      Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element>{}, GmemThreadLayout{},
      GmemValueLayout{}));
  using GmemTiledCopyO = decltype(make_tiled_copy(Copy_Atom<UniversalCopy<uint128_t>, Element>{},
                                                  GmemThreadLayout{}, GmemValueLayout{}));

  // Shared -> registers: ldmatrix (transposed for Vᵀ); registers -> shared for O.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

template <int kHeadDim, class Element>
using FwdTraitsFor = FwdTraits<kHeadDim, FwdConfig<kHeadDim>::kBlockM, FwdConfig<kHeadDim>::kBlockN,
                               FwdConfig<kHeadDim>::kNWarps, Element>;

}  // namespace flashtile::sm80
