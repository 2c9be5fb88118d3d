// Host launcher of the KV-cache kernels for one (head dim, dtype): the
// split-KV kernel at the pipeline depth params' shapes take, then, with
// more than one split, the combine kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/kvcache_params.hpp"
#include "flashtile/sm80/kvcache_kernel.hpp"
#include "flashtile/sm80/kvcache_traits.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm80 {

template <class Traits>
Status launch_kvcache(const KvCacheParams& params, cudaStream_t stream) {
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim;
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

// Shared memory of the deeper pipeline of (kHeadDim, Element), 0 where the
// head dim has none: what a kernels/kvcache_*.cu file registers beside its
// launcher, for the split planner.
template <int kHeadDim, class Element>
constexpr int kvcache_deep_smem_bytes() {
  using Config = KvCacheConfig<kHeadDim>;
  if constexpr (Config::kDeepStages == Config::kStages) {
    return 0;
  } else {
    return KvCacheTraits<kHeadDim, Element, Config::kDeepStages>::kSmemBytes;
  }
}

// Entry point a generated kernels/kvcache_*.cu file instantiates and
// registers. Assumes can_implement_kvcache(params) passed and
// params.num_splits resolved.
template <int kHeadDim, class Element>
Status run_kvcache(const KvCacheParams& params, cudaStream_t stream) {
  using Config = KvCacheConfig<kHeadDim>;
  if constexpr (Config::kDeepStages != Config::kStages) {
    const bool deep_fits = kvcache_deep_fits(kvcache_deep_smem_bytes<kHeadDim, Element>());
    if (kvcache_takes_deep_pipeline(params, params.num_splits, deep_fits)) {
      return launch_kvcache<KvCacheTraits<kHeadDim, Element, Config::kDeepStages>>(params, stream);
    }
  }
  return launch_kvcache<KvCacheTraits<kHeadDim, Element>>(params, stream);
}

}  // namespace flashtile::sm80
