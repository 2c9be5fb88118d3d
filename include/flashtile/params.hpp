// Argument structs the host passes to the kernels. Named fields only; strides
// are in elements and 64-bit, so offsets stay exact past 2^31 elements.
#pragma once

#include <cstdint>

#ifndef FLASHTILE_HOST_DEVICE
#ifdef __CUDACC__
#define FLASHTILE_HOST_DEVICE __host__ __device__
#else
#define FLASHTILE_HOST_DEVICE
#endif
#endif

namespace flashtile {

enum class DType : int { kFp16 = 0, kBf16 = 1 };

inline const char* dtype_name(DType t) { return t == DType::kFp16 ? "fp16" : "bf16"; }

// Forward attention: out = softmax(q kᵀ · softmax_scale) v, per (batch, head).
// Layout is flash_attn's: q/out (batch, seqlen_q, nheads, head_dim),
// k/v (batch, seqlen_k, nheads_k, head_dim), last dim contiguous, any other
// strides. lse is (batch, nheads, seqlen_q) fp32, contiguous.
struct FwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;

  int batch = 0;
  int nheads = 0;
  int nheads_k = 0;  // nheads % nheads_k == 0 (MQA/GQA); K/V are never repeated
  int seqlen_q = 0;
  int seqlen_k = 0;
  int head_dim = 0;

  float softmax_scale = 0.f;
  // Causal mask aligned to the bottom-right corner (flash_attn >= 2.1):
  // query row i sees key j iff j <= i + seqlen_k - seqlen_q.
  bool causal = false;
  // Sliding window (local attention), bottom-right aligned like causal:
  // query row i sees key j iff
  //   i + seqlen_k - seqlen_q - window_left <= j <= i + seqlen_k - seqlen_q + window_right,
  // each side unbounded when -1. Combined with causal (the visible sets
  // intersect), so causal with window_left = w is a window of w keys back.
  int window_left = -1;
  int window_right = -1;
  // Soft-capping: scores (q·kᵀ·softmax_scale) become softcap · tanh(score /
  // softcap) before the mask; 0 turns it off.
  float softcap = 0.f;
  // ALiBi: score −= slope · |i + seqlen_k − seqlen_q − j| for query row i and
  // key j, after softcap, where slope = alibi_slopes[batch ·
  // alibi_slopes_batch_stride + head · alibi_slopes_head_stride] (fp32, query
  // head; a batch stride of 0 shares one row of slopes). nullptr turns it off.
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0, alibi_slopes_head_stride = 1;
  // Variable-length batches (flash_attn_varlen_func), when cu_seqlens_q is
  // set: q and out are (total_q, nheads, head_dim) and k, v (total_k,
  // nheads_k, head_dim), their batch strides unused; sequence b is rows
  // [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and [cu_seqlens_k[b],
  // cu_seqlens_k[b + 1]) of k and v (int32, batch + 1 entries, on the
  // device), of which it uses the first seqused_k[b] keys when seqused_k is
  // set. seqlen_q and seqlen_k are then the longest sequence's (the grid),
  // total_q is q's row count, and lse is (nheads, total_q). Masks and ALiBi
  // align to each sequence's own bottom-right corner. Lengths are clamped to
  // [0, seqlen_*] and rows to [0, total_*], so malformed offsets give wrong
  // rows, never accesses outside the tensors.
  const int* cu_seqlens_q = nullptr;
  const int* cu_seqlens_k = nullptr;
  const int* seqused_k = nullptr;
  int total_q = 0;
  int total_k = 0;
  DType dtype = DType::kBf16;
  // (Last, so the fields above keep the offsets the kernels were tuned with.)
  // Dropout on the attention probabilities (common/dropout.hpp): each is
  // dropped with probability dropout_p in [0, 1), rounded to a multiple of
  // 1/256, and the kept ones are scaled by 1 / (1 − that); the logsumexp is
  // that of the undropped scores.
  // dropout_seed points to one int64 on the device whose 64 bits are the
  // Philox key (read by the kernels, so a captured CUDA graph can be replayed
  // with a new seed written there); required when dropout_p > 0. The backward
  // must get the same seed.
  float dropout_p = 0.f;
  const int64_t* dropout_seed = nullptr;
  // Testing only: when set, the forward also writes the probabilities P =
  // exp(score − lse) it used, in q's dtype, to attn_probs, contiguous
  // (batch, nheads, attn_probs_rows, attn_probs_cols) with rows >= seqlen_q
  // and cols >= seqlen_k (the longest, when varlen), entry (i, j) for query
  // row i and key j of a sequence, 0 where masked or outside the sequence.
  // Dropped entries are written negated (the sign bit set even where P is
  // 0), as flash_attn's return_attn_probs. A separate, slow kernel
  // (common/attn_probs_kernel.hpp), run after the forward.
  void* attn_probs = nullptr;
  int attn_probs_rows = 0;
  int attn_probs_cols = 0;
  // Optional: one int32 on the device, overwritten by the launch. With it
  // the SM90 forward runs a persistent grid whose CTAs take their next tile
  // from this counter where tiles differ in work (causal, windows, varlen);
  // without it each such tile is a CTA of its own. Each concurrent launch
  // needs its own.
  int* tile_counter = nullptr;
};

// Backward attention: given dout = ∂L/∂out, computes dq, dk, dv. Layouts as
// FwdParams; out and lse are the forward's. dk and dv are (batch, seqlen_k,
// nheads_k, head_dim): with GQA each sums over the query heads of its group.
// The launcher needs a device workspace of bwd_workspace_bytes(params) bytes
// (flashtile.hpp), which it overwrites.
struct BwdParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* out = nullptr;
  const void* dout = nullptr;
  const float* lse = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  void* workspace = nullptr;

  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t out_batch_stride = 0, out_row_stride = 0, out_head_stride = 0;
  int64_t dout_batch_stride = 0, dout_row_stride = 0, dout_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  int batch = 0;
  int nheads = 0;
  int nheads_k = 0;
  int seqlen_q = 0;
  int seqlen_k = 0;
  int head_dim = 0;

  float softmax_scale = 0.f;
  bool causal = false;
  int window_left = -1;  // as FwdParams
  int window_right = -1;
  float softcap = 0.f;  // as FwdParams
  const float* alibi_slopes = nullptr;
  int64_t alibi_slopes_batch_stride = 0, alibi_slopes_head_stride = 1;
  const int* cu_seqlens_q = nullptr;  // as FwdParams; dout and dq like q, dk and dv like k
  const int* cu_seqlens_k = nullptr;
  const int* seqused_k = nullptr;
  int total_q = 0;
  int total_k = 0;
  // Sum dQ in a fixed order (a second kernel, no atomics), so that two runs
  // give bitwise-identical gradients. Costs time (benchmarks/NOTES.md) and
  // changes bwd_workspace_bytes().
  bool deterministic = false;
  DType dtype = DType::kBf16;
  float dropout_p = 0.f;  // as FwdParams: the forward's, with the same seed
  const int64_t* dropout_seed = nullptr;
};

// True for a variable-length batch (cu_seqlens).
template <class Params>
constexpr bool is_varlen(const Params& p) {
  return p.cu_seqlens_q != nullptr;
}

// True when params ask for softcap, ALiBi or dropout, which only the kernels
// built with modifiers apply (run_fwd / run_bwd<..., true>, the "scoremod"
// variant).
template <class Params>
constexpr bool uses_score_mod(const Params& p) {
  return p.softcap != 0.f || p.alibi_slopes != nullptr || p.dropout_p != 0.f;
}

// The forward's testing-only probabilities output is the modifier kernels' too.
constexpr bool uses_score_mod(const FwdParams& p) {
  return p.softcap != 0.f || p.alibi_slopes != nullptr || p.dropout_p != 0.f || p.attn_probs != nullptr;
}

}  // namespace flashtile
