// Host launcher of the SM90 forward (sm90/fwd_kernel.hpp) for one (head
// dim, dtype): the mask kind and fixed-length or varlen pick the
// instantiation, the TMA descriptors are built once here.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "flashtile/common/mask.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/device.hpp"
#include "flashtile/sm90/fwd_kernel.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/sm90/fwd_traits.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm90 {

template <int kHeadDim, class Element, MaskKind kMask, bool kVarlen>
Status launch_fwd(const FwdParams& params, cudaStream_t stream) {
  constexpr bool uniform_tiles = kMask == MaskKind::kNone && !kVarlen;  // (tile_scheduler.hpp)
  using Traits = FwdTraits<kHeadDim, Element, FwdConfig<kHeadDim, uniform_tiles>>;
  auto* kernel = &fwd_kernel<Traits, kMask, kVarlen>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) {
    return Status::kCudaError;
  }
  const auto scheduler = TileScheduler::make<Traits::kBlockM>(params, uniform_tiles);
  if (scheduler.num_tiles == 0) return Status::kSuccess;
  if (scheduler.counter != nullptr && cudaMemsetAsync(scheduler.counter, 0, sizeof(int), stream) != cudaSuccess) {
    return Status::kCudaError;
  }
  const FwdKernelParams<Traits> kernel_params{params, FwdMainloop<Traits>::to_params(params), scheduler};
  kernel<<<scheduler.grid(uniform_tiles, multiprocessor_count()), Traits::kNThreads, kSmemBytes, stream>>>(
      kernel_params);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;  // cause left set
}

// Entry point a generated kernels/fwd_sm90_*.cu file instantiates and
// registers (plain variant). Assumes can_implement_fwd(params) passed and
// fwd_supports(params) (flashtile::fwd asks it before choosing this path).
template <int kHeadDim, class Element>
Status run_fwd(const FwdParams& params, cudaStream_t stream) {
  if (!device_is_sm90()) return Status::kUnsupportedDevice;
  if (!fwd_supports(params)) return Status::kInvalidArgument;
  FwdParams p = params;  // with causal folded into the window
  const MaskKind mask = resolve_mask(p.causal, p.window_left, p.window_right);
  auto launch = [&](auto varlen) {
    constexpr bool kVarlen = decltype(varlen)::value;
    switch (mask) {
      case MaskKind::kNone:
        return launch_fwd<kHeadDim, Element, MaskKind::kNone, kVarlen>(p, stream);
      case MaskKind::kCausal:
        return launch_fwd<kHeadDim, Element, MaskKind::kCausal, kVarlen>(p, stream);
      default:
        return launch_fwd<kHeadDim, Element, MaskKind::kLocal, kVarlen>(p, stream);
    }
  };
  return is_varlen(p) ? launch(std::true_type{}) : launch(std::false_type{});
}

}  // namespace flashtile::sm90
