// Host launcher of the SM90 forward (sm90/fwd_kernel.hpp) for one (head
// dim, dtype, variant): the mask kind and fixed-length or varlen pick the
// instantiation, the TMA descriptors are built once here.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "flashtile/common/attn_probs_kernel.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/device.hpp"
#include "flashtile/sm90/fwd_kernel.hpp"
#include "flashtile/sm90/fwd_traits.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm90 {

template <int kHeadDim, class Element, MaskKind kMask, bool kVarlen, class ScoreModT, bool kDropout>
Status launch_fwd(const FwdParams& params, typename ScoreModT::Arguments const& score_mod, cudaStream_t stream) {
  constexpr bool uniform_tiles = kMask == MaskKind::kNone && !kVarlen;  // (tile_scheduler.hpp)
  constexpr bool kModified = !std::is_same_v<ScoreModT, ScoreMod<false>>;
  using Traits = FwdTraits<kHeadDim, Element,
                           FwdConfig<kHeadDim, uniform_tiles, kMask == MaskKind::kLocal, kDropout, kModified>>;
  auto* kernel = &fwd_kernel<Traits, kMask, kVarlen, ScoreModT, kDropout>;
  constexpr int kSmemBytes = Traits::kSmemBytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) {
    return Status::kCudaError;
  }
  const auto scheduler = TileScheduler::make<Traits::kBlockM>(params, uniform_tiles);
  if (scheduler.num_tiles == 0) return Status::kSuccess;
  if (scheduler.counter != nullptr && cudaMemsetAsync(scheduler.counter, 0, sizeof(int), stream) != cudaSuccess) {
    return Status::kCudaError;
  }
  const FwdKernelParams<Traits, ScoreModT> kernel_params{params, FwdMainloop<Traits>::to_params(params), scheduler,
                                                         score_mod, FwdEpilogue<Traits>::to_params(params)};
  kernel<<<scheduler.grid(uniform_tiles, multiprocessor_count()), Traits::kNThreads, kSmemBytes, stream>>>(
      kernel_params);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;  // cause left set
}

// The instantiation for params' mask kind and batch form (causal folded
// into the window), with dropout's code where dropout_p > 0 (ScoreMod<true>
// only: FwdParams' modifiers are one variant; it also writes the testing-only
// attn_probs, common/attn_probs_kernel.hpp). The softcap/ALiBi kernels
// keep none of it: in them dropout's state and Philox rounds took d64's
// spills (ptxas, nvcc 13.0, bf16) from 0-96 to 4-408 bytes and d256's
// from 0-56 to 36-96.
template <int kHeadDim, class Element, class ScoreModT>
Status launch_fwd_for_mask(const FwdParams& params, typename ScoreModT::Arguments const& score_mod,
                           cudaStream_t stream) {
  FwdParams p = params;
  const MaskKind mask = resolve_mask(p.causal, p.window_left, p.window_right);
  auto launch = [&](auto varlen, auto dropout) {
    constexpr bool kVarlen = decltype(varlen)::value, kDropout = decltype(dropout)::value;
    switch (mask) {
      case MaskKind::kNone:
        return launch_fwd<kHeadDim, Element, MaskKind::kNone, kVarlen, ScoreModT, kDropout>(p, score_mod, stream);
      case MaskKind::kCausal:
        return launch_fwd<kHeadDim, Element, MaskKind::kCausal, kVarlen, ScoreModT, kDropout>(p, score_mod, stream);
      default:
        return launch_fwd<kHeadDim, Element, MaskKind::kLocal, kVarlen, ScoreModT, kDropout>(p, score_mod, stream);
    }
  };
  auto launch_batch = [&](auto dropout) {
    return is_varlen(p) ? launch(std::true_type{}, dropout) : launch(std::false_type{}, dropout);
  };
  if constexpr (std::is_same_v<ScoreModT, ScoreMod<true>>) {
    const Status status = p.dropout_p > 0.f ? launch_batch(std::true_type{}) : launch_batch(std::false_type{});
    // Testing only: the probabilities, from the forward's lse.
    if (status != Status::kSuccess || p.attn_probs == nullptr) return status;
    return launch_attn_probs<Element, 90>(p, stream);
  } else {
    return launch_batch(std::false_type{});
  }
}

// Entry point a generated kernels/fwd_sm90_*.cu file instantiates and
// registers: the plain variant, or with kScoreMod the one that applies
// softcap, ALiBi and dropout. Assumes can_implement_fwd(params) passed and
// fwd_supports(params) (flashtile::fwd asks it before choosing this path).
template <int kHeadDim, class Element, bool kScoreMod = false>
Status run_fwd(const FwdParams& params, cudaStream_t stream) {
  if (!device_is_sm90()) return Status::kUnsupportedDevice;
  if (!fwd_supports(params) || (!kScoreMod && uses_score_mod(params))) return Status::kInvalidArgument;
  return launch_fwd_for_mask<kHeadDim, Element, ScoreMod<kScoreMod>>(params, {}, stream);
}

// The forward with a caller's score modifier in place of softcap and
// ALiBi: any type with ScoreMod's members (common/score_mod.hpp), applied
// to every tile before params' causal or window mask; for example a
// prefix-LM or document mask that writes −inf (examples/cpp/prefix_lm.cu).
// params ask for no softcap, ALiBi, dropout or attn_probs
// (kInvalidArgument otherwise); can_implement_fwd(params) must pass. Every
// key block params' mask leaves is visited, so a modifier that hides whole
// blocks still pays for them. apply() sees a tile's rows outside the
// sequence too (negative ones in causal tiles: FwdTile, fwd_mainloop.hpp),
// whose results are dropped; it must not index memory by them unchecked.
template <int kHeadDim, class Element, class ScoreModT>
Status run_fwd_with(const FwdParams& params, typename ScoreModT::Arguments const& score_mod, cudaStream_t stream) {
  if (!device_is_sm90()) return Status::kUnsupportedDevice;
  if (!fwd_supports(params) || uses_score_mod(params)) return Status::kInvalidArgument;
  return launch_fwd_for_mask<kHeadDim, Element, ScoreModT>(params, score_mod, stream);
}

}  // namespace flashtile::sm90
