// Host entry point of the SM90 backward: the SM80 launcher's sequence
// (sm80/bwd_launch.hpp: rowsum, main kernel, dQ's conversion or the
// deterministic dQ kernel) with the wgmma main kernel (sm90/bwd_kernel.hpp).
// Plain attention only; the deterministic mode's dQ kernel is the SM80 one.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/params.hpp"
#include "flashtile/sm80/bwd_launch.hpp"
#include "flashtile/sm90/bwd_traits.hpp"
#include "flashtile/sm90/device.hpp"
#include "flashtile/status.hpp"

namespace flashtile::sm90 {

template <int kHeadDim, class Element>
struct BwdTraitsFor {
  template <bool kIsCausal>
  using type = BwdTraits<kHeadDim, Element, BwdConfig<kHeadDim, kIsCausal>>;
};

// Entry point a generated kernels/bwd_sm90_*.cu file instantiates and
// registers. Assumes can_implement_bwd(params) passed. Returns
// kUnsupportedDevice, before any launch, on a GPU other than compute
// capability 9.0, and kInvalidArgument for softcap, ALiBi or dropout.
template <int kHeadDim, class Element>
Status run_bwd(const BwdParams& params, cudaStream_t stream) {
  if (!device_is_sm90()) return Status::kUnsupportedDevice;
  return sm80::run_bwd_for_mask<BwdTraitsFor<kHeadDim, Element>::template type,
                                sm80::BwdTraits<kHeadDim, Element, sm80::BwdDqConfig<kHeadDim>>, false>(params,
                                                                                                       stream);
}

}  // namespace flashtile::sm90
