// Online softmax over key blocks, on (row, col) views of register fragments.
//
// Scores stay in the raw q·kᵀ scale; the softmax scale is folded into one
// log2-domain constant so each probability costs one FFMA and one exp2:
//   p = exp2(s · scale_log2 − m · scale_log2),  scale_log2 = softmax_scale · log2(e).
// The output accumulator stays unnormalized; it is divided by the row sum once,
// in finalize(). Row sums stay thread-local partials until then.
#pragma once

#include <cute/tensor.hpp>

#include "flashtile/common/fragment.hpp"

namespace flashtile {

template <int kRows>
struct OnlineSoftmax {
  Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_max;  // (kRows)
  Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> row_sum;  // (kRows)
  float scale_log2;

  CUTE_DEVICE explicit OnlineSoftmax(float scale_log2_) : scale_log2(scale_log2_) {
    fill(row_max, -INFINITY);
    fill(row_sum, 0.f);
  }

  using RowFactors = Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>>;  // (kRows)

  // scores: (kRows, cols) view of this key block's S, masked entries = −inf.
  // out:    (kRows, head_dim cols) view of the O accumulator.
  // Updates the running max, rescales out and the running sums by
  // exp2((m_old − m_new) · scale_log2) where the max moved, and overwrites
  // scores with the unnormalized probabilities.
  template <class Scores, class Out>
  CUTE_DEVICE void update(Scores& scores, Out& out) {
    rescale(out, to_probabilities(scores));
  }

  // update() in two halves, for a kernel whose O is still being written by
  // the previous block's P·V product while this block's exponentials run
  // (sm90/fwd_mainloop.hpp): to_probabilities() does everything but touch
  // O and returns each row's factor (1 where the max did not move);
  // rescale() applies them to O afterwards.
  template <class Scores>
  CUTE_DEVICE RowFactors to_probabilities(Scores& scores) {
    static_assert(decltype(size<0>(scores))::value == kRows);
    // Phase by phase over all rows, not row by row, so the rows' shuffles and
    // exp2s are independent work for the scheduler: causal seqlen 16k on the
    // H200 went 327 -> 337 TFLOP/s (d128) and 328 -> 338 (d64).
    float block_max[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      block_max[r] = row_max(r);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) block_max[r] = fmaxf(block_max[r], scores(r, c));
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) block_max[r] = quad_allreduce(block_max[r], MaxOp{});
    RowFactors factors;
    float max_scaled[kRows];
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      // A row that has seen only masked keys keeps max = −inf; subtracting 0
      // instead keeps its probabilities exp2(−inf) = 0 rather than NaN.
      max_scaled[r] = block_max[r] == -INFINITY ? 0.f : block_max[r] * scale_log2;
      // On a row's first visible block the factor is exp2(−inf) = 0,
      // multiplying zeros.
      factors(r) = 1.f;
      if (block_max[r] != row_max(r)) {
        factors(r) = fast_exp2(row_max(r) * scale_log2 - max_scaled[r]);
        row_max(r) = block_max[r];
        row_sum(r) *= factors(r);
      }
    }
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      CUTE_UNROLL
      for (int c = 0; c < size<1>(scores); ++c) {
        scores(r, c) = fast_exp2(scores(r, c) * scale_log2 - max_scaled[r]);
        row_sum(r) += scores(r, c);
      }
    }
    return factors;
  }

  // O's rows times their factors. Only where the max moved (once it
  // settles, most blocks skip it): d64 seqlen 16k went 309 -> 329 TFLOP/s
  // against rescaling by an exact 1.0.
  template <class Out>
  CUTE_DEVICE static void rescale(Out& out, RowFactors const& factors) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if (factors(r) != 1.f) {
        CUTE_UNROLL
        for (int c = 0; c < size<1>(out); ++c) out(r, c) *= factors(r);
      }
    }
  }

  // Divides out by the row sums and multiplies it by out_scale (dropout's
  // 1 / (1 − p)); returns each row's natural-log logsumexp of the scaled
  // scores (−inf for a row that saw no key, whose out stays 0; +inf for a row
  // with a +inf score).
  template <class Out>
  CUTE_DEVICE auto finalize(Out& out, float softmax_scale, float out_scale = 1.f) {
    Tensor<ArrayEngine<float, kRows>, Layout<Shape<Int<kRows>>>> lse;  // (kRows)
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const float sum = quad_allreduce(row_sum(r), SumOp{});
      const float inv_sum = sum == 0.f ? 0.f : out_scale / sum;
      // A +inf score makes the row's max +inf and its sum NaN (exp2(inf − inf)):
      // its logsumexp is +inf, as the reference's, not m + log(NaN).
      lse(r) = sum == 0.f              ? -INFINITY
               : row_max(r) == INFINITY ? INFINITY
                                        : row_max(r) * softmax_scale + __logf(sum);
      CUTE_UNROLL
      for (int c = 0; c < size<1>(out); ++c) out(r, c) *= inv_sum;
    }
    return lse;
  }
};

}  // namespace flashtile
