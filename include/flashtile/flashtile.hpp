// flashtile's public C++ API: exact attention, FlashAttention-2 style.
//
// Header-only use: include this header, then instantiate the launchers you
// need in your own .cu file, e.g.
//   flashtile::sm80::run_fwd<128, cutlass::bfloat16_t>(params, stream);
// Runtime dispatch over the kernels a build registered: flashtile::fwd().
// Every entry point returns a Status; none throws, aborts or prints.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashtile/params.hpp"
#include "flashtile/registry.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

inline constexpr int kSupportedFwdHeadDims[] = {64, 128};

inline bool is_supported_fwd_head_dim(int head_dim) {
  for (int d : kSupportedFwdHeadDims) {
    if (d == head_dim) return true;
  }
  return false;
}

// Checks everything the kernels assume about params, without touching the GPU.
inline Status can_implement_fwd(const FwdParams& p) {
  if (!p.q || !p.k || !p.v || !p.out || !p.lse) return Status::kInvalidArgument;
  if (p.batch < 1 || p.nheads < 1 || p.nheads_k < 1 || p.seqlen_q < 1 || p.seqlen_k < 1) {
    return Status::kInvalidArgument;
  }
  if (p.nheads % p.nheads_k != 0) return Status::kInvalidArgument;
  // Grid: (query blocks, nheads, batch); y and z are limited to 65535.
  if (p.nheads > 65535 || p.batch > 65535) return Status::kInvalidArgument;
  if (!is_supported_fwd_head_dim(p.head_dim)) return Status::kUnsupportedHeadDim;
  if (!(p.softmax_scale > 0.f)) return Status::kInvalidArgument;
  // cp.async and the epilogue move 16-byte vectors: 8 two-byte elements.
  constexpr int64_t kVector = 8;
  const void* pointers[] = {p.q, p.k, p.v, p.out};
  for (const void* ptr : pointers) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return Status::kMisalignedPointer;
  }
  const int64_t strides[] = {p.q_batch_stride,   p.q_row_stride,   p.q_head_stride,
                             p.k_batch_stride,   p.k_row_stride,   p.k_head_stride,
                             p.v_batch_stride,   p.v_row_stride,   p.v_head_stride,
                             p.out_batch_stride, p.out_row_stride, p.out_head_stride};
  for (int64_t s : strides) {
    if (s % kVector != 0) return Status::kMisalignedPointer;
  }
  return Status::kSuccess;
}

// Runs the forward kernel registered for (sm80 path, head_dim, dtype).
inline Status fwd(const FwdParams& p, cudaStream_t stream) {
  const Status ok = can_implement_fwd(p);
  if (ok != Status::kSuccess) return ok;
  const FwdLauncher launch = KernelRegistry::instance().find_fwd(Arch::kSm80, p.head_dim, p.dtype);
  if (!launch) return Status::kNotBuilt;
  return launch(p, stream);
}

}  // namespace flashtile
