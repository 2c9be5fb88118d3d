// Warpgroup matrix products on wgmma for the SM90 path. Both operands are
// read from shared memory by the tensor cores through descriptors, so a
// product issues no ldmatrix and holds no operand registers; it runs
// asynchronously until the warpgroup waits for it.
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

}  // namespace flashtile::sm90
