// Which of the SM80 backward's kernels a compile for compute capability 9.0
// (sm_90a, for the H100/H200) builds, and which the launcher runs there.
//
// On an H100/H200 the wgmma backward (sm90/) takes every call but those with
// dropout, strides TMA cannot step, or a dispatch limited to sm80 (tests).
// The sm80 scoremod backward serves them; its kernels with dropout's code
// serve them all, since dropout_p = 0 keeps every probability (common/
// dropout.hpp). A 9.0 compile therefore builds only those and compiles the
// scoremod kernels without dropout to a trap that the launcher never
// reaches: bwd_sm80_hdim128_bf16_scoremod.cu for 90a takes 75-78 s instead
// of 105 on the 2-core CI machine (nvcc 13.0; benchmarks/NOTES.md). The plain
// kernels stay whole: a build without the scoremod variant runs them there.
// FLASHTILE_SM80_ON_SM90 (the CMake option of that name defines it) builds
// every kernel for 9.0 as well, so that tests can compare them there.
#pragma once

#include "flashtile/common/device.hpp"
#include "flashtile/params.hpp"

namespace flashtile::sm80 {

// Whether this compile pass builds the backward kernel with kScoreMod and
// kDropout; the host pass and the compiles for other archs build them all.
template <bool kScoreMod, bool kDropout>
constexpr bool bwd_kernel_built_here() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && !defined(FLASHTILE_SM80_ON_SM90)
  return !kScoreMod || kDropout;
#else
  return true;
#endif
}

// Whether the scoremod backward runs its dropout kernels for params: when
// params ask for dropout, and on a 9.0 device for every call (the others are
// not built for it). A build whose code for 9.0 is the driver's compile of
// compute_80 PTX (no 90a in its archs) has them all but runs these too.
inline bool bwd_runs_dropout_kernels(const BwdParams& params) {
#if defined(FLASHTILE_SM80_ON_SM90)
  return params.dropout_p > 0.f;
#else
  return params.dropout_p > 0.f || device_is_sm90();
#endif
}

}  // namespace flashtile::sm80
