// flash_attn's two score modifiers, on tiles of raw scores s = q·kᵀ:
//   softcap > 0  score = softcap · tanh(s · softmax_scale / softcap)
//   ALiBi        score −= slope · |i + seqlen_k − seqlen_q − j|   (query row i, key j)
// The kernels keep a tile in unscaled units and multiply by one constant in
// the softmax (softmax.hpp). With softcap the tile holds t = tanh(s ·
// softmax_scale / softcap) and that constant is softcap instead of
// softmax_scale; score_scale() says which, and ALiBi's bias is divided by it.
// ScoreMod<false> is the plain kernels': every member is a no-op and
// score_scale() is softmax_scale, so they compile to what they were before.
// ScoreMod<true> decides softcap and ALiBi at run time (a uniform branch per
// tile): one more instantiation per kernel, not three.
//
// ScoreMod is also the shape of the SM90 forward's score modifiers
// (sm90/fwd_launch.hpp's run_fwd_with takes any type with these members):
//   Arguments                  what the host passes, by value, to the kernel
//   make(args, params, seq, head)
//                              the modifier of one tile: (batch, head)'s
//                              (seq: common/seqlen.hpp's SeqInfo)
//   score_scale()              what the softmax multiplies the modified
//                              tile by (softmax_scale for a modifier that
//                              keeps the raw q·kᵀ units)
//   apply(acc_s, coords, row0, col0)
//                              modifies a tile of raw scores whose element
//                              i sits at query row0 + get<0>(coords(i)) and
//                              key col0 + get<1>(coords(i)) of the
//                              sequence; −inf hides a key from a query
//                              (before causal and window masks, which
//                              still apply).
#pragma once

#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

// tanh.approx: one MUFU instruction, max relative error 2^-10.99 (PTX ISA),
// about an fp16 rounding, which the scores have already been through.
CUTE_DEVICE float fast_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// (batch, head)'s ALiBi slope from FwdParams or BwdParams, 0 without ALiBi.
template <class Params>
CUTE_DEVICE float alibi_slope(Params const& params, int batch, int head) {
  if (params.alibi_slopes == nullptr) return 0.f;
  return params.alibi_slopes[batch * params.alibi_slopes_batch_stride + head * params.alibi_slopes_head_stride];
}

template <bool kEnabled>
struct ScoreMod {
  static constexpr bool kIsEnabled = kEnabled;
  struct Arguments {};  // everything comes from the params
  float softmax_scale;
  float softcap_mul = 0.f;  // softmax_scale / softcap, 0 without softcap
  float softcap = 0.f;
  int offset = 0;           // seqlen_k − seqlen_q: row i's diagonal is column i + offset
  float slope = 0.f;        // the ALiBi slope over score_scale(), 0 without ALiBi

  // alibi_slope: this (batch, head)'s slope, or 0.
  CUTE_HOST_DEVICE ScoreMod(float softmax_scale_, float softcap_, int seqlen_q, int seqlen_k, float alibi_slope)
      : softmax_scale(softmax_scale_) {
    if constexpr (kEnabled) {
      softcap = softcap_;
      softcap_mul = softcap_ > 0.f ? softmax_scale_ / softcap_ : 0.f;
      offset = seqlen_k - seqlen_q;
      slope = alibi_slope / score_scale();
    }
  }

  // The modifiers of params for the tiles of one (batch, head) of sequence seq.
  template <class Params, class Seq>
  CUTE_DEVICE static ScoreMod make(Arguments const&, Params const& params, Seq const& seq, int head) {
    return ScoreMod(params.softmax_scale, params.softcap, seq.seqlen_q, seq.seqlen_k,
                    kEnabled ? alibi_slope(params, seq.batch, head) : 0.f);
  }

  // The same modifiers with another (batch, head)'s ALiBi slope.
  CUTE_HOST_DEVICE ScoreMod with_alibi_slope(float alibi_slope) const {
    ScoreMod mod = *this;
    if constexpr (kEnabled) mod.slope = alibi_slope / score_scale();
    return mod;
  }

  // What the softmax multiplies the tile by (the LSE is in these units too).
  CUTE_HOST_DEVICE float score_scale() const {
    return kEnabled && softcap_mul != 0.f ? softcap : softmax_scale;
  }
  CUTE_HOST_DEVICE bool has_softcap() const { return kEnabled && softcap_mul != 0.f; }
  CUTE_HOST_DEVICE bool has_alibi() const { return kEnabled && slope != 0.f; }

  // The ALiBi bias of score (row, col), in tile units.
  CUTE_DEVICE float bias(int row, int col) const { return -slope * fabsf(float(row + offset - col)); }

  // s -> tanh(s · softmax_scale / softcap) over a tile, before the mask
  // (whose −inf must survive: tanh would turn it into −1).
  template <class Acc>
  CUTE_DEVICE void apply_softcap(Acc& acc_s) const {
    if constexpr (kEnabled) {
      if (has_softcap()) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) acc_s(i) = fast_tanh(acc_s(i) * softcap_mul);
      }
    }
  }

  // One raw score s -> tanh(s · softmax_scale / softcap) with softcap, s
  // without; a masked −inf stays −inf (tanh would make it −1).
  CUTE_DEVICE float softcapped(float s) const {
    if constexpr (kEnabled) {
      if (has_softcap() && s != -INFINITY) return fast_tanh(s * softcap_mul);
    }
    return s;
  }
  // softcap, then ALiBi (the order of every kernel that applies both).
  template <class Acc, class Coords>
  CUTE_DEVICE void apply(Acc& acc_s, Coords const& coords, int row0, int col0) const {
    apply_softcap(acc_s);
    apply_alibi(acc_s, coords, row0, col0);
  }

  // Adds the ALiBi bias to a tile whose element i sits at row0 + coords(i)[0],
  // col0 + coords(i)[1]; masked −inf stays −inf.
  template <class Acc, class Coords>
  CUTE_DEVICE void apply_alibi(Acc& acc_s, Coords const& coords, int row0, int col0) const {
    if constexpr (kEnabled) {
      if (has_alibi()) {
        CUTE_UNROLL
        for (int i = 0; i < size(acc_s); ++i) {
          acc_s(i) += bias(row0 + get<0>(coords(i)), col0 + get<1>(coords(i)));
        }
      }
    }
  }
};

}  // namespace flashtile
