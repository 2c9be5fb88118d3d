// The testing-only probabilities of FwdParams::attn_probs (flash_attn's
// return_attn_probs): P(i, j) = exp(score(i, j) − lse(i)) with the forward's
// score modifiers, mask and logsumexp, negated where dropout dropped it.
//
// One warp per 16 × 8 tile of one (batch, head), each lane on the four scores
// it would hold in an m16n8 MMA accumulator, so that its quad's Philox call
// gives its four keep decisions exactly as the attention kernels draw them
// (common/dropout.hpp). The scores are fp32 dot products read straight from
// global memory: slow, and meant for tests on small problems, not for speed.
// Both forwards (sm80/fwd_launch.hpp, sm90/fwd_launch.hpp) launch it after
// their attention kernel, from the logsumexp that kernel wrote.
#pragma once

#include <cuda_runtime_api.h>

#include "flashtile/common/dropout.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/score_mod.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/status.hpp"

namespace flashtile {

// params' window must already have causal folded in (resolve_mask). kPath:
// the arch of the forward that launches it (launch_attn_probs).
template <class Element, int kPath>
__global__ void __launch_bounds__(32) attn_probs_kernel(const __grid_constant__ FwdParams params) {
  const int lane = threadIdx.x;
  const int row = int(blockIdx.y) * 16 + lane / 4;  // the lane's first score: (row, col)
  const int col = int(blockIdx.x) * 8 + 2 * (lane % 4);
  const int head = int(blockIdx.z) % params.nheads;
  const int batch = int(blockIdx.z) / params.nheads;
  const int head_k = head / (params.nheads / params.nheads_k);
  const SeqInfo seq(params, batch);
  // The local kind with the resolved window covers every kind: an unbounded
  // side is capped past any distance (BlockMask).
  const BlockMask<MaskKind::kLocal, 16, 8> mask(seq.seqlen_q, seq.seqlen_k, params.window_left,
                                                params.window_right);
  const ScoreMod<true> mod(params.softmax_scale, params.softcap, seq.seqlen_q, seq.seqlen_k,
                           alibi_slope(params, batch, head));
  const Dropout<true> dropout(params, batch);
  uint32_t keep = 0xFu;
  if (dropout.enabled()) {  // each lane runs its quad's call and takes its own word (no shuffles here)
    uint32_t words[4];
    dropout_words(dropout.key, row, col - 2 * (lane % 4), head, batch, words);
    keep = dropout_keep_nibble(words[lane % 4], dropout.keep_threshold);
  }
  const Element* q = static_cast<const Element*>(params.q) + seq.q_offset(params.q_batch_stride, params.q_row_stride) +
                     head * params.q_head_stride;
  const Element* k = static_cast<const Element*>(params.k) + seq.k_offset(params.k_batch_stride, params.k_row_stride) +
                     head_k * params.k_head_stride;
  Element* probs = static_cast<Element*>(params.attn_probs) +
                   (int64_t(batch) * params.nheads + head) * params.attn_probs_rows * params.attn_probs_cols;
  for (int v = 0; v < 4; ++v) {  // the atom's element order: (row, col), (row, col + 1), (row + 8, ...)
    const int i = row + 8 * (v / 2);
    const int j = col + v % 2;
    if (i >= params.attn_probs_rows || j >= params.attn_probs_cols) continue;
    if (i >= seq.seqlen_q || j >= seq.seqlen_k) {  // outside the sequence: +0, no keep decision
      probs[int64_t(i) * params.attn_probs_cols + j] = Element(0.f);
      continue;
    }
    float p = 0.f;
    if (!mask.hides(i, j)) {
      float s = 0.f;
      for (int d = 0; d < params.head_dim; ++d) {
        s += float(q[i * params.q_row_stride + d]) * float(k[j * params.k_row_stride + d]);
      }
      // In the attention kernels' tile units (common/score_mod.hpp).
      const float t = (mod.has_softcap() ? fast_tanh(s * mod.softcap_mul) : s) + mod.bias(i, j);
      const float lse = params.lse[seq.row_index(params, head) + i];
      p = lse == -INFINITY ? 0.f : expf(t * mod.score_scale() - lse);
    }
    probs[int64_t(i) * params.attn_probs_cols + j] = Element((keep >> v) & 1 ? p : -p);
  }
}

// Launches attn_probs_kernel over attn_probs' (rows, cols) for every (batch,
// head); can_implement_fwd bounds the grid. kPath is the calling forward's
// arch (80: sm80/, 90: sm90/). A build with 90a compiles the two paths'
// files for different archs (CMakeLists.txt), and of a launcher that files
// instantiate alike the linker keeps one copy, which launches its own
// file's kernel: one shared by both paths would lack the other's code.
template <class Element, int kPath>
Status launch_attn_probs(const FwdParams& params, cudaStream_t stream) {
  const dim3 grid((params.attn_probs_cols + 7) / 8, (params.attn_probs_rows + 15) / 16,
                  params.batch * params.nheads);
  attn_probs_kernel<Element, kPath><<<grid, 32, 0, stream>>>(params);
  return cudaPeekAtLastError() == cudaSuccess ? Status::kSuccess : Status::kCudaError;
}

}  // namespace flashtile
