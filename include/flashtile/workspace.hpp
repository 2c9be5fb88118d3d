// The backward's device workspace: the fp32 dQ accumulator and rowsum(dO ∘ O)
// (batch, nheads, seqlen_q). The caller allocates bwd_workspace_bytes(params)
// bytes. The accumulator is (batch, nheads, bwd_dq_accum_rows, head_dim),
// each query block of it in the main kernel's register order (opaque outside
// the kernels); deterministic mode has none, its dQ kernel writes dq directly.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashtile/params.hpp"

namespace flashtile {

struct BwdWorkspace {
  float* dq_accum;
  size_t dq_accum_bytes;
  float* dsum;
};

#ifndef FLASHTILE_HOST_DEVICE
#ifdef __CUDACC__
#define FLASHTILE_HOST_DEVICE __host__ __device__
#else
#define FLASHTILE_HOST_DEVICE
#endif
#endif

// Every backward kernel's query block divides this.
constexpr int kBwdDqAccumRowAlign = 128;

// seqlen_q rounded up to whole query blocks.
FLASHTILE_HOST_DEVICE inline int64_t bwd_dq_accum_rows(const BwdParams& p) {
  return (int64_t(p.seqlen_q) + kBwdDqAccumRowAlign - 1) / kBwdDqAccumRowAlign * kBwdDqAccumRowAlign;
}

inline size_t bwd_dq_accum_bytes(const BwdParams& p) {
  if (p.deterministic) return 0;
  const size_t bytes = size_t(p.batch) * p.nheads * bwd_dq_accum_rows(p) * p.head_dim * sizeof(float);
  return (bytes + 255) / 256 * 256;  // keeps dsum 256-byte aligned
}

inline size_t bwd_workspace_bytes(const BwdParams& p) {
  return bwd_dq_accum_bytes(p) + size_t(p.batch) * p.nheads * p.seqlen_q * sizeof(float);
}

inline BwdWorkspace bwd_workspace_layout(const BwdParams& p, void* workspace) {
  char* base = static_cast<char*>(workspace);
  return {reinterpret_cast<float*>(base), bwd_dq_accum_bytes(p),
          reinterpret_cast<float*>(base + bwd_dq_accum_bytes(p))};
}

}  // namespace flashtile
