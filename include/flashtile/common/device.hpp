// What the launchers ask of the current GPU before launching.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "flashtile/status.hpp"

namespace flashtile {

// True on compute capability 9.0 (H100, H200), the only one that runs
// sm90a code (wgmma); false elsewhere and when the device cannot be queried.
inline bool device_is_sm90() {
  int device = 0, major = 0, minor = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
}

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

// The CTAs of kKernel (kThreads threads, kSmemBytes of dynamic shared
// memory) that the current GPU runs at once: SMs × CTAs per SM; 0 when the
// device cannot be queried (the error consumed, so the caller just does not
// split). Queried once per device (the launch path's host time).
template <auto kKernel, int kThreads, int kSmemBytes>
int resident_ctas() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cached[kMaxDevices];  // 0: not queried yet
  auto failed = [] {
    (void)cudaGetLastError();
    return 0;
  };
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return failed();
  if (device < kMaxDevices) {
    const int ctas = cached[device].load(std::memory_order_relaxed);
    if (ctas > 0) return ctas;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return failed();
  if (kSmemBytes > 48 * 1024 &&
      cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes) != cudaSuccess) {
    return failed();
  }
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, kSmemBytes) != cudaSuccess) {
    return failed();
  }
  if (device < kMaxDevices) cached[device].store(sms * per_sm, std::memory_order_relaxed);
  return sms * per_sm;
}

}  // namespace flashtile
