// The backward's device workspace: the fp32 dQ accumulator (contiguous
// batch, seqlen_q, nheads, head_dim; none in deterministic mode, whose dQ
// kernel writes dq directly) and rowsum(dO ∘ O) (batch, nheads, seqlen_q).
// The caller allocates bwd_workspace_bytes(params) bytes.
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

inline size_t bwd_dq_accum_bytes(const BwdParams& p) {
  if (p.deterministic) return 0;
  const size_t bytes = size_t(p.batch) * p.seqlen_q * p.nheads * p.head_dim * sizeof(float);
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
