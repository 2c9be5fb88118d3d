// What the launchers ask of the current GPU before launching.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/status.hpp"

namespace flashtile::sm80 {

// kSuccess when the current device offers `bytes` of shared memory per block
// (opt-in): sm90 227 KB, sm80 163 KB, sm86/sm89/sm120 99 KB. Otherwise
// kUnsupportedDevice, or kCudaError when the device cannot be queried.
inline Status check_smem_per_block(int bytes) {
  int device = 0, smem_per_block = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    return Status::kCudaError;
  }
  return smem_per_block < bytes ? Status::kUnsupportedDevice : Status::kSuccess;
}

}  // namespace flashtile::sm80
