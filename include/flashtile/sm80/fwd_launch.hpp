// Host launcher for the SM80 forward kernel of one (head dim, dtype). The
// causal flag picks one of two instantiations; everything else is runtime.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/params.hpp"
#include "flashtile/sm80/fwd_kernel.hpp"
#include "flashtile/sm80/fwd_traits.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm80 {

template <class Traits, bool kIsCausal>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  auto* kernel = &fwd_kernel<Traits, kIsCausal>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if constexpr (kSmemBytes > 48 * 1024) {
    // Above 48 KB a kernel must opt in to the larger dynamic shared memory.
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) !=
        cudaSuccess) {
      return Status::kCudaError;
    }
  }
  const dim3 grid(ceil_div(params.seqlen_q, Traits::kBlockM), params.nheads, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;  // cause left set
}

// Entry point a generated kernels/ file instantiates and registers. Assumes
// can_implement_fwd(params) passed.
template <int kHeadDim, class Element>
Status run_fwd(const FwdParams& params, cudaStream_t stream) {
  using Traits = FwdTraitsFor<kHeadDim, Element>;
  return params.causal ? launch_fwd<Traits, true>(params, stream)
                       : launch_fwd<Traits, false>(params, stream);
}

}  // namespace flashtile::sm80
