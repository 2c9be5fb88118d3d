// Host launcher of the KV-cache kernels for one (head dim, dtype): the
// split-KV kernel, then, with more than one split, the combine kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/kvcache_params.hpp"
#include "flashtile/sm80/kvcache_kernel.hpp"
#include "flashtile/sm80/kvcache_traits.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm80 {

// Entry point a generated kernels/kvcache_*.cu file instantiates and
// registers. Assumes can_implement_kvcache(params) passed.
template <int kHeadDim, class Element>
Status run_kvcache(const KvCacheParams& params, cudaStream_t stream) {
  using Traits = KvCacheTraits<kHeadDim, Element>;
  auto* kernel = &kvcache_kernel<Traits>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if constexpr (kSmemBytes > 48 * 1024) {
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) {
      return Status::kCudaError;
    }
  }
  const int m_blocks = ceil_div(params.seqlen_q * (params.nheads / params.nheads_k), Traits::kBlockM);
  const dim3 grid(m_blocks * params.num_splits, params.nheads_k, params.batch);
  kernel<<<grid, Traits::kNThreads, kSmemBytes, stream>>>(params);
  if (cudaPeekAtLastError() != cudaSuccess) return Status::kCudaError;  // cause left set
  if (params.num_splits > 1) {
    const int64_t rows = KvCacheWorkspace(params).rows;
    kvcache_combine_kernel<kHeadDim, Element><<<unsigned(rows), 32 * kCombineWarps, 0, stream>>>(params);
    if (cudaPeekAtLastError() != cudaSuccess) return Status::kCudaError;
  }
  return Status::kSuccess;
}

}  // namespace flashtile::sm80
