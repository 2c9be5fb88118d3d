// What the SM90 launchers ask of the current GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

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

// The current GPU's SM count, queried once per device (the launch path's
// host time); 0 when it cannot be queried (the error consumed).
inline int multiprocessor_count() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not queried yet
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return (void)cudaGetLastError(), 0;
  if (device < kMaxDevices && (sms = cached[device].load(std::memory_order_relaxed)) > 0) return sms;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return (void)cudaGetLastError(), 0;
  }
  if (device < kMaxDevices) cached[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace flashtile::sm90
