// Host launcher for the SM80 backward of one (head dim, dtype): zero the dQ
// accumulator, rowsum(dO ∘ O), the main dK/dV kernel, then dQ's conversion.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/params.hpp"
#include "flashtile/sm80/bwd_aux_kernels.hpp"
#include "flashtile/sm80/bwd_kernel.hpp"
#include "flashtile/sm80/bwd_traits.hpp"
#include "flashtile/status.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm80 {

template <class Traits, bool kIsCausal>
cudaError_t launch_bwd_dkdv(const BwdParams& params, float* dq_accum, const float* dsum,
                            cudaStream_t stream) {
  auto* kernel = &bwd_dkdv_kernel<Traits, kIsCausal>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if constexpr (kSmemBytes > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(ceil_div(params.seqlen_k, Traits::kBlockN), params.nheads_k, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params, dq_accum, dsum);
  return cudaGetLastError();
}

// Entry point a generated kernels/ file instantiates and registers. Assumes
// can_implement_bwd(params) passed.
template <int kHeadDim, class Element>
Status run_bwd(const BwdParams& params, cudaStream_t stream) {
  using Traits = BwdTraits<kHeadDim, Element>;
  const BwdWorkspace ws = bwd_workspace_layout(params, params.workspace);
  if (cudaMemsetAsync(ws.dq_accum, 0, ws.dq_accum_bytes, stream) != cudaSuccess) {
    return Status::kCudaError;
  }
  constexpr int kThreads = 128;
  const int64_t rows = int64_t(params.batch) * params.seqlen_q * params.nheads;
  bwd_dot_do_o_kernel<Element, kHeadDim>
      <<<unsigned(ceil_div(rows, int64_t(kThreads))), kThreads, 0, stream>>>(params, ws.dsum);
  if (cudaGetLastError() != cudaSuccess) return Status::kCudaError;
  const cudaError_t err = params.causal
                              ? launch_bwd_dkdv<Traits, true>(params, ws.dq_accum, ws.dsum, stream)
                              : launch_bwd_dkdv<Traits, false>(params, ws.dq_accum, ws.dsum, stream);
  if (err != cudaSuccess) return Status::kCudaError;
  const int64_t vectors = rows * kHeadDim / 8;
  bwd_convert_dq_kernel<Element, kHeadDim>
      <<<unsigned(ceil_div(vectors, int64_t(kThreads))), kThreads, 0, stream>>>(params, ws.dq_accum);
  return cudaGetLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;
}

}  // namespace flashtile::sm80
