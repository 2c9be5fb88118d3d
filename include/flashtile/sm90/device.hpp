// What the SM90 launchers ask of the current GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/device_attribute.hpp"

namespace flashtile::sm90 {

// True on compute capability 9.0 (H100, H200), the only one that runs
// sm90a code (wgmma); false elsewhere and when the device cannot be queried.
inline bool device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
}

// The current GPU's SM count, queried once per device; 0 when it cannot be
// queried.
inline int multiprocessor_count() { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(); }

}  // namespace flashtile::sm90
