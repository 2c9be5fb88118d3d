// Warpgroup matrix products on wgmma for the SM90 path. Operands in shared
// memory are read by the tensor cores through descriptors, so a product
// issues no ldmatrix; it runs asynchronously until the warpgroup waits for
// it.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>
#include <cute/tensor.hpp>

namespace flashtile::sm90 {

using namespace cute;

// Shared-memory writes of the generic proxy (st.shared, cp.async) made
// visible to the async proxy that wgmma reads through. Each writing thread
// fences; a barrier after it then orders every thread's writes before the
// products that read them.
CUTE_DEVICE void fence_smem_for_wgmma() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Issues acc = A·Bᵀ (kZeroInit) or acc += A·Bᵀ as one wgmma batch and
// commits it; warpgroup_wait<N>() retires it. Until then acc must not be
// read or written by other instructions.
//   tCrA: (MMA, MMA_M, MMA_K) descriptors   tCrB: (MMA, MMA_N, MMA_K) descriptors
//   acc: (MMA, MMA_M, MMA_N) fp32 accumulator
template <bool kZeroInit, class TiledMma, class FragA, class FragB, class Acc>
CUTE_DEVICE void gemm_async(TiledMma& tiled_mma, FragA const& tCrA, FragB const& tCrB, Acc& acc) {
  constexpr int kSlices = decltype(size<2>(tCrA))::value;
  static_assert(kSlices == decltype(size<2>(tCrB))::value);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = kZeroInit ? GMMA::ScaleOut::Zero : GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
}

// Issues acc += A·B with A from registers (RS): the same batch as
// gemm_async, but the warpgroup's A fragment is read from its registers,
// so they too must stay untouched until warpgroup_wait retires it.
//   tCrA: (MMA, MMA_M, MMA_K) registers   tCrB: (MMA, MMA_N, MMA_K) descriptors
template <class TiledMma, class FragA, class FragB, class Acc>
CUTE_DEVICE void gemm_rs_async(TiledMma& tiled_mma, FragA& tCrA, FragB const& tCrB, Acc& acc) {
  constexpr int kSlices = decltype(size<2>(tCrA))::value;
  static_assert(kSlices == decltype(size<2>(tCrB))::value);
  warpgroup_fence_operand(tCrA);
  warpgroup_fence_operand(acc);
  warpgroup_arrive();
  tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  CUTE_UNROLL
  for (int k = 0; k < kSlices; ++k) {
    gemm(tiled_mma, tCrA(_, _, k), tCrB(_, _, k), acc);
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(acc);
  warpgroup_fence_operand(tCrA);
}

// A wgmma accumulator ((2, 2, N / 8), MMA_M, MMA_N) as the register A
// operand of a k16 wgmma, ((2, 2, 2), MMA_M, (N / 16, MMA_N)): two
// neighbouring n8 column groups of the accumulator are the k0..7 and k8..15
// halves of one A slice, the same registers in the same order, so P =
// softmax(S) feeds O += P·V without moving (after the conversion to 16 bits).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_to_rs_operand_a_layout(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3 && decltype(size<0, 2>(acc))::value % 2 == 0);
  auto split = logical_divide(acc, Shape<Shape<Underscore, Underscore, _2>, Underscore, Underscore>{});
  // ((2, 2, (2, N / 16)), MMA_M, MMA_N)
  return make_layout(make_layout(get<0, 0>(split), get<0, 1>(split), get<0, 2, 0>(split)), get<1>(split),
                     make_layout(get<0, 2, 1>(split), get<2>(split)));
}

// ((2, 2, N / 8), MMA_M, MMA_N) wgmma accumulator -> ((2, 2), MMA_M, (N / 8,
// MMA_N)): the same registers as the m16n8 atoms of the SM80 MMA's
// accumulator (a warp's 16 rows of wgmma's D hold them in that order), the
// structure dropout draws its decisions by (common/dropout.hpp).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_to_m16n8_atoms_layout(Layout acc) {
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc)), get<1>(acc),
                     make_layout(get<0, 2>(acc), get<2>(acc)));
}

}  // namespace flashtile::sm90
