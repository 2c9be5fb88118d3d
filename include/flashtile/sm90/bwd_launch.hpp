// Host entry point of the SM90 backward: the warp-specialized kernel
// (sm90/bwd_ws_kernel.hpp) on tensors TMA can describe (bwd_supports;
// flashtile::bwd sends the others to the SM80 kernels, sm90/tma_support.hpp):
// rowsum, that kernel, dQ's conversion (in the deterministic
// mode too: its key blocks add dQ in turns). d32 to d128 keep a key block's
// dK and dV in one warpgroup's registers (sm90/bwd_ws_traits.hpp); d192 and
// d256 split them by head dim and stage P and dS in shared memory
// (sm90/bwd_ws_staged_traits.hpp). Softcap and ALiBi run the kernel's
// kScoreMod instantiations; dropout the SM80 kernels.
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "flashtile/common/bwd_aux_kernels.hpp"
#include "flashtile/common/device.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/bwd_ws_kernel.hpp"
#include "flashtile/sm90/bwd_ws_staged_traits.hpp"
#include "flashtile/sm90/bwd_ws_traits.hpp"
#include "flashtile/sm90/device.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/status.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm90 {

// The kernel's tiles per head dim: dK and dV in registers up to d128, P
// and dS staged above (the traits' static_asserts say which head dims each
// takes: multiples of 32 up to 128; 192 and 256).
template <int kHeadDim, class Element>
using BwdWsTraitsFor =
    std::conditional_t<(kHeadDim > 128), BwdWsStagedTraits<kHeadDim, Element>, BwdWsTraits<kHeadDim, Element>>;

// The warp-specialized backward for mask kMask (what resolve_mask makes of
// params' causal flag and window), with softcap and ALiBi where kScoreMod.
template <int kHeadDim, class Element, MaskKind kMask, bool kScoreMod>
Status run_bwd_ws(const BwdParams& params, cudaStream_t stream) {
  using Traits = BwdWsTraitsFor<kHeadDim, Element>;
  // The conversion kernel reads dq_accum back in the consumers' order.
  using ConvertTraits = BwdWsConvertTraits<Traits>;
  const Status fits = check_smem_per_block(Traits::kSmemBytes);
  if (fits != Status::kSuccess) return fits;
  const BwdWorkspace ws = bwd_workspace_layout(params, params.workspace);
  // The accumulator and (deterministic mode) the turn counters after it.
  if (launch_bwd_rowsum<Element, kHeadDim>(params, ws, ws.dq_accum_bytes + ws.dq_turn_bytes, stream) !=
      cudaSuccess) {
    return Status::kCudaError;
  }

  const bool deterministic = params.deterministic, varlen = is_varlen(params);
  auto* kernel = deterministic ? (varlen ? &bwd_ws_kernel<Traits, kMask, true, true, kScoreMod>
                                         : &bwd_ws_kernel<Traits, kMask, true, false, kScoreMod>)
                               : (varlen ? &bwd_ws_kernel<Traits, kMask, false, true, kScoreMod>
                                         : &bwd_ws_kernel<Traits, kMask, false, false, kScoreMod>);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes) != cudaSuccess) {
    return Status::kCudaError;
  }
  const BwdWsParams<Traits> kernel_params =
      BwdWsParams<Traits>::make(params, ws.dq_accum, deterministic ? ws.dq_turns : nullptr, ws.dsum);
  // One CTA per key block of one K/V head (common/bwd_schedule.hpp's order);
  // can_implement_bwd bounds the grid.
  const dim3 grid(unsigned(ceil_div(params.seqlen_k, Traits::kBlockN) * params.nheads_k * params.batch));
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(kernel_params);
  if (cudaPeekAtLastError() != cudaSuccess) return Status::kCudaError;

  const dim3 convert_grid(unsigned(ceil_div(params.seqlen_q, ConvertTraits::kBlockM) * params.nheads * params.batch));
  bwd_convert_dq_kernel<ConvertTraits><<<convert_grid, ConvertTraits::kNThreads, 0, stream>>>(params, ws.dq_accum);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;
}

// Entry point a generated kernels/bwd_sm90_*.cu file instantiates and
// registers. Assumes can_implement_bwd(params) passed. Returns
// kUnsupportedDevice, before any launch, on a GPU other than compute
// capability 9.0, and kInvalidArgument for params bwd_supports refuses
// (sm90/tma_support.hpp: dropout, strides TMA cannot step) and for softcap
// or ALiBi without kScoreMod.
template <int kHeadDim, class Element, bool kScoreMod = false>
Status run_bwd(const BwdParams& params, cudaStream_t stream) {
  if (!device_is_sm90()) return Status::kUnsupportedDevice;
  if (!bwd_supports(params) || (!kScoreMod && uses_score_mod(params))) return Status::kInvalidArgument;
  BwdParams p = params;  // with causal folded into the window
  switch (resolve_mask(p.causal, p.window_left, p.window_right)) {
    case MaskKind::kNone:
      return run_bwd_ws<kHeadDim, Element, MaskKind::kNone, kScoreMod>(p, stream);
    case MaskKind::kCausal:
      return run_bwd_ws<kHeadDim, Element, MaskKind::kCausal, kScoreMod>(p, stream);
    default:
      return run_bwd_ws<kHeadDim, Element, MaskKind::kLocal, kScoreMod>(p, stream);
  }
}

}  // namespace flashtile::sm90
