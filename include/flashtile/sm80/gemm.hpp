// Warp-level matrix products on mma.sync for the SM80 path. Operands come
// from shared memory through ldmatrix one k-slice ahead of the MMA that uses
// them, so the shared-memory latency hides behind the previous slice's MMAs.
#pragma once

#include <cute/tensor.hpp>

namespace flashtile::sm80 {

using namespace cute;

// acc += A · Bᵀ, both operands staged from shared memory.
//   tCrA: (MMA, MMA_M, MMA_K) fragment   tCsA: (CPY, MMA_M, MMA_K) smem partition
//   tCrB: (MMA, MMA_N, MMA_K) fragment   tCsB: (CPY, MMA_N, MMA_K) smem partition
template <class TiledMma, class Acc, class FragA, class FragB, class SmemA, class SmemB,
          class CopyA, class CopyB>
CUTE_DEVICE void gemm_smem_smem(TiledMma const& tiled_mma, Acc& acc, FragA& tCrA, FragB& tCrB,
                                SmemA const& tCsA, SmemB const& tCsB, CopyA const& copy_a,
                                CopyB const& copy_b) {
  auto tCrA_view = copy_a.get_slice(threadIdx.x).retile_D(tCrA);  // (CPY, MMA_M, MMA_K)
  auto tCrB_view = copy_b.get_slice(threadIdx.x).retile_D(tCrB);  // (CPY, MMA_N, MMA_K)
  constexpr int kSlices = decltype(size<2>(tCrA))::value;
  static_assert(kSlices == decltype(size<2>(tCrB))::value);
  copy(copy_a, tCsA(_, _, _0{}), tCrA_view(_, _, _0{}));
  copy(copy_b, tCsB(_, _, _0{}), tCrB_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) {
      copy(copy_a, tCsA(_, _, k + 1), tCrA_view(_, _, k + 1));
      copy(copy_b, tCsB(_, _, k + 1), tCrB_view(_, _, k + 1));
    }
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A · Bᵀ with one operand already in registers and the other staged
// from shared memory (kStageA: A is staged, else B): its partition tCsX is
// copied into its fragment one k-slice ahead, as in gemm_smem_smem.
template <bool kStageA, class TiledMma, class Acc, class FragA, class FragB, class SmemX, class CopyX>
CUTE_DEVICE void gemm_one_staged(TiledMma const& tiled_mma, Acc& acc, FragA& tCrA, FragB& tCrB,
                                 SmemX const& tCsX, CopyX const& copy_x) {
  auto& tCrX = [&]() -> auto& {
    if constexpr (kStageA) {
      return tCrA;
    } else {
      return tCrB;
    }
  }();
  auto tCrX_view = copy_x.get_slice(threadIdx.x).retile_D(tCrX);  // (CPY, MMA_MN, MMA_K)
  constexpr int kSlices = decltype(size<2>(tCrA))::value;
  static_assert(kSlices == decltype(size<2>(tCrB))::value);
  copy(copy_x, tCsX(_, _, _0{}), tCrX_view(_, _, _0{}));
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    if (k + 1 < kSlices) copy(copy_x, tCsX(_, _, k + 1), tCrX_view(_, _, k + 1));
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
}

// acc += A · Bᵀ with A in registers (the forward's softmax probabilities)
// and B staged from shared memory.
//   tCrB: (MMA, MMA_N, MMA_K) fragment   tCsB: (CPY, MMA_N, MMA_K) smem partition
template <class TiledMma, class Acc, class FragA, class FragB, class SmemB, class CopyB>
CUTE_DEVICE void gemm_reg_smem(TiledMma const& tiled_mma, Acc& acc, FragA const& tCrA, FragB& tCrB,
                               SmemB const& tCsB, CopyB const& copy_b) {
  gemm_one_staged<false>(tiled_mma, acc, tCrA, tCrB, tCsB, copy_b);
}

// acc += A · Bᵀ with B in registers (the backward's V, loaded once per CTA
// when BwdConfig::kVInRegs) and A staged from shared memory.
//   tCrA: (MMA, MMA_M, MMA_K) fragment   tCsA: (CPY, MMA_M, MMA_K) smem partition
template <class TiledMma, class Acc, class FragA, class FragB, class SmemA, class CopyA>
CUTE_DEVICE void gemm_smem_reg(TiledMma const& tiled_mma, Acc& acc, FragA& tCrA, FragB const& tCrB,
                               SmemA const& tCsA, CopyA const& copy_a) {
  gemm_one_staged<true>(tiled_mma, acc, tCrA, tCrB, tCsA, copy_a);
}

}  // namespace flashtile::sm80
