// What the SM90 launchers ask of the current GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/common/device.hpp"
#include "flashtile/device_attribute.hpp"

namespace flashtile::sm90 {

// The current GPU's SM count, queried once per device; 0 when it cannot be
// queried.
inline int multiprocessor_count() { return cached_device_attribute<cudaDevAttrMultiProcessorCount>(); }

}  // namespace flashtile::sm90
