// The backward's device workspace: the fp32 dQ accumulator, the
// deterministic mode's dQ turn counters, the fp32 dK/dV accumulator of the
// main kernel's split tail (sm80/bwd_tail_split.hpp), and rowsum(dO ∘ O)
// (batch, nheads, seqlen_q), or (nheads, total_q) when varlen, as lse. The
// caller allocates bwd_workspace_bytes(params) bytes.
// The dQ accumulator is (batch, nheads, bwd_dq_accum_rows, head_dim), or
// (nheads, bwd_dq_accum_rows, head_dim) when varlen, each query block of it
// in the main kernel's register order (opaque outside the kernels). In the
// deterministic mode the SM80 path's dQ kernel writes dq directly and leaves
// it unused; the warp-specialized SM90 backward adds into it key block after
// key block, each 64-row query block's turn counted in one int
// (sm90/dq_turns.hpp). The tail
// accumulator holds up to kBwdTailMaxTasks key blocks' dK and dV, only for
// the backward that can split its tail (fixed-length, no mask, not
// deterministic).
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"

namespace flashtile {

struct BwdWorkspace {
  float* dq_accum;
  size_t dq_accum_bytes;
  int* dq_turns;  // one per kBwdDqTurnRows accumulator rows, deterministic mode only
  size_t dq_turn_bytes;
  float* dkv_tail;  // bwd_dkv_tail_tasks slots of 2 · kBwdTailMaxBlockN · head_dim floats, or none
  size_t dkv_tail_bytes;
  float* dsum;
};

// Every backward kernel's query block divides this.
constexpr int kBwdDqAccumRowAlign = 128;

// The accumulator's rows per (batch, head): seqlen_q rounded up to whole
// query blocks. Varlen: per head, each sequence's rows start on a multiple
// of kBwdDqAccumRowAlign (bwd_dq_accum_row), which takes at most
// kBwdDqAccumRowAlign more rows per sequence.
FLASHTILE_HOST_DEVICE inline int64_t bwd_dq_accum_rows(const BwdParams& p, bool varlen) {
  const int64_t rows = varlen ? int64_t(p.total_q) + int64_t(kBwdDqAccumRowAlign) * p.batch : p.seqlen_q;
  return (rows + kBwdDqAccumRowAlign - 1) / kBwdDqAccumRowAlign * kBwdDqAccumRowAlign;
}
FLASHTILE_HOST_DEVICE inline int64_t bwd_dq_accum_rows(const BwdParams& p) { return bwd_dq_accum_rows(p, is_varlen(p)); }

// The accumulator row of (this sequence, head, row 0). Varlen: sequence b
// starts at (q_start + 128 b) rounded down to a multiple of 128, which is
// past the previous sequence's rounded-up rows. (seq.varlen, not params,
// decides: a kernel instantiated for one kind folds the other away.)
FLASHTILE_HOST_DEVICE inline int64_t bwd_dq_accum_row(const BwdParams& p, const SeqInfo& seq, int head) {
  if (!seq.varlen) return (int64_t(seq.batch) * p.nheads + head) * bwd_dq_accum_rows(p, false);
  const int64_t start = (int64_t(seq.q_start) + int64_t(kBwdDqAccumRowAlign) * seq.batch) / kBwdDqAccumRowAlign *
                        kBwdDqAccumRowAlign;
  return int64_t(head) * bwd_dq_accum_rows(p, true) + start;
}

// Rows of lse and dsum: batch · seqlen_q, or total_q when varlen.
inline int64_t bwd_query_rows(const BwdParams& p) {
  return is_varlen(p) ? int64_t(p.total_q) : int64_t(p.batch) * p.seqlen_q;
}

// The accumulator's rows over every (batch, head).
inline int64_t bwd_dq_accum_total_rows(const BwdParams& p) {
  const int64_t heads_rows = is_varlen(p) ? int64_t(p.nheads) : int64_t(p.batch) * p.nheads;
  return heads_rows * bwd_dq_accum_rows(p);
}

inline size_t bwd_dq_accum_bytes(const BwdParams& p) {
  const size_t bytes = size_t(bwd_dq_accum_total_rows(p)) * p.head_dim * sizeof(float);
  return (bytes + 255) / 256 * 256;  // keeps what follows 256-byte aligned
}

// The deterministic mode's turn counters: one per kBwdDqTurnRows rows of
// the accumulator (the smallest query block that adds into it in turns).
constexpr int kBwdDqTurnRows = 64;
static_assert(kBwdDqAccumRowAlign % kBwdDqTurnRows == 0);

inline size_t bwd_dq_turn_bytes(const BwdParams& p) {
  if (!p.deterministic) return 0;
  const size_t bytes = size_t(bwd_dq_accum_total_rows(p) / kBwdDqTurnRows) * sizeof(int);
  return (bytes + 255) / 256 * 256;
}

// The split tail's key blocks (sm80/bwd_tail_split.hpp): at most this many
// per backward, each of at most kBwdTailMaxBlockN keys. A tail is split
// only when it fills at most half a wave; 64 is a little under half the
// H100/H200's 132 SMs, so there a last wave of 65 or 66 blocks stays whole.
// The room is reserved for every backward that may split; the softcap/ALiBi/
// dropout kernels, the sm90 kernel and head dims whose kBlockN is 64 use
// less of it or none.
constexpr int kBwdTailMaxTasks = 64;
constexpr int kBwdTailMaxBlockN = 128;

// Key blocks the tail accumulator has room for: none unless the main kernel
// may split its tail (fixed-length, no mask, dQ by atomics), and never more
// than the grid's key blocks counted in blocks of 64 keys (the 32-key blocks
// of d256's 99 KB tiles may find too little room then, and not split).
inline int bwd_dkv_tail_tasks(const BwdParams& p) {
  const bool no_mask = !p.causal && p.window_left < 0 && p.window_right < 0;
  if (p.deterministic || is_varlen(p) || !no_mask) return 0;
  const int64_t key_blocks = int64_t(p.batch) * p.nheads_k * ((int64_t(p.seqlen_k) + 63) / 64);
  return int(key_blocks < kBwdTailMaxTasks ? key_blocks : kBwdTailMaxTasks);
}

inline size_t bwd_dkv_tail_bytes(const BwdParams& p) {
  // A multiple of 256 bytes (2 · 128 · head_dim · 4), so dsum stays aligned.
  return size_t(bwd_dkv_tail_tasks(p)) * 2 * kBwdTailMaxBlockN * p.head_dim * sizeof(float);
}

inline size_t bwd_workspace_bytes(const BwdParams& p) {
  return bwd_dq_accum_bytes(p) + bwd_dq_turn_bytes(p) + bwd_dkv_tail_bytes(p) +
         size_t(bwd_query_rows(p)) * p.nheads * sizeof(float);
}

// [dQ accumulator | dQ turns | tail accumulator | dsum]: the first three are
// contiguous (the turns and the tail are never both there), so the rowsum
// kernel zeroes what a launch uses in one range.
inline BwdWorkspace bwd_workspace_layout(const BwdParams& p, void* workspace) {
  char* base = static_cast<char*>(workspace);
  const size_t dq_bytes = bwd_dq_accum_bytes(p), turn_bytes = bwd_dq_turn_bytes(p),
               tail_bytes = bwd_dkv_tail_bytes(p);
  return {reinterpret_cast<float*>(base),
          dq_bytes,
          reinterpret_cast<int*>(base + dq_bytes),
          turn_bytes,
          reinterpret_cast<float*>(base + dq_bytes + turn_bytes),
          tail_bytes,
          reinterpret_cast<float*>(base + dq_bytes + turn_bytes + tail_bytes)};
}

}  // namespace flashtile
