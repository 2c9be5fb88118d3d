// A CUDA device attribute of the current GPU, queried once per device (the
// launch path's host time).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

namespace flashtile {

// kAttr of the current device; 0 when it cannot be queried (the error
// consumed, so that a caller can fall back) or is 0.
template <cudaDeviceAttr kAttr>
int cached_device_attribute() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not queried yet
  int device = 0, value = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return (void)cudaGetLastError(), 0;
  if (device < kMaxDevices && (value = cached[device].load(std::memory_order_relaxed)) > 0) return value;
  if (cudaDeviceGetAttribute(&value, kAttr, device) != cudaSuccess) return (void)cudaGetLastError(), 0;
  if (device < kMaxDevices) cached[device].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace flashtile
