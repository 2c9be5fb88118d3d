// Where one sequence of a batch lives: its lengths and the offsets of its
// rows, for fixed-length batches (batch strides, every sequence seqlen_q by
// seqlen_k) and variable-length ones (cu_seqlens, params.hpp).
#pragma once

#include <cstdint>
#include <type_traits>

#include "flashtile/params.hpp"

namespace flashtile {

FLASHTILE_HOST_DEVICE constexpr int clamp_int(int x, int lo, int hi) { return x < lo ? lo : x > hi ? hi : x; }

struct SeqInfo {
  int batch;
  bool varlen;
  int seqlen_q;       // this sequence's query rows
  int seqlen_k;       // the keys it attends (seqused_k[batch] when given)
  int seqlen_k_rows;  // its rows of k, v, dk, dv (>= seqlen_k; dk, dv are 0 past seqlen_k)
  int q_start = 0;    // varlen: its first row in the packed q, out, dout, dq
  int k_start = 0;    // varlen: its first row in the packed k, v, dk, dv

  // Varlen offsets are clamped into the tensors (params.hpp). The kind of
  // batch is read from params, or fixed at compile time by the third
  // argument (std::bool_constant<kVarlen>), which lets a kernel instantiated
  // for fixed-length batches fold every varlen branch away: with it decided
  // at run time, the d128 forward ran 6–8 % slower (non-causal, H200).
  template <class Params>
  FLASHTILE_HOST_DEVICE SeqInfo(Params const& p, int batch_) : SeqInfo(p, batch_, p.cu_seqlens_q != nullptr) {}
  template <class Params, bool kVarlen>
  FLASHTILE_HOST_DEVICE SeqInfo(Params const& p, int batch_, std::bool_constant<kVarlen>) : SeqInfo(p, batch_, kVarlen) {}

 private:
  template <class Params>
  FLASHTILE_HOST_DEVICE SeqInfo(Params const& p, int batch_, bool varlen_) : batch(batch_), varlen(varlen_) {
    if (!varlen) {
      seqlen_q = p.seqlen_q;
      seqlen_k = seqlen_k_rows = p.seqlen_k;
      return;
    }
    q_start = clamp_int(p.cu_seqlens_q[batch], 0, p.total_q);
    seqlen_q = clamp_int(p.cu_seqlens_q[batch + 1] - q_start, 0, min_int(p.seqlen_q, p.total_q - q_start));
    k_start = clamp_int(p.cu_seqlens_k[batch], 0, p.total_k);
    seqlen_k_rows = clamp_int(p.cu_seqlens_k[batch + 1] - k_start, 0, min_int(p.seqlen_k, p.total_k - k_start));
    seqlen_k = p.seqused_k != nullptr ? clamp_int(p.seqused_k[batch], 0, seqlen_k_rows) : seqlen_k_rows;
  }

 public:
  // Element offset of this sequence's row 0 in a tensor laid out like q
  // (q, out, dout, dq) or like k (k, v, dk, dv), given its strides.
  FLASHTILE_HOST_DEVICE int64_t q_offset(int64_t batch_stride, int64_t row_stride) const {
    return varlen ? int64_t(q_start) * row_stride : int64_t(batch) * batch_stride;
  }
  FLASHTILE_HOST_DEVICE int64_t k_offset(int64_t batch_stride, int64_t row_stride) const {
    return varlen ? int64_t(k_start) * row_stride : int64_t(batch) * batch_stride;
  }

  // Index of (head, row 0) in the fp32 row arrays, lse and the backward's
  // dsum: (batch, nheads, seqlen_q), or (nheads, total_q) when varlen.
  template <class Params>
  FLASHTILE_HOST_DEVICE int64_t row_index(Params const& p, int head) const {
    return varlen ? int64_t(head) * p.total_q + q_start : (int64_t(batch) * p.nheads + head) * p.seqlen_q;
  }

 private:
  FLASHTILE_HOST_DEVICE static constexpr int min_int(int a, int b) { return a < b ? a : b; }
};

}  // namespace flashtile
