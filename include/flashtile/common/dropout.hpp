// Dropout on the attention probabilities, regenerated wherever P is: the
// forward, the backward's main kernel, the deterministic dQ kernel and the
// testing-only probabilities kernel all draw the same keep/drop decision for
// score (i, j) of (batch, head).
//
// The random numbers come from Philox4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC'11), a counter-based generator:
// output = f(counter, key), no state. The key is the 64-bit seed the caller
// draws per forward (from torch's CUDA generator in the Python layer).
//
// Which call decides which score follows the m16n8 MMA accumulator atom
// (common/fragment.hpp), the one structure every kernel here shares whatever
// its block sizes and warp layout (each tiles S with atoms at rows that are
// multiples of 16 and columns that are multiples of 8; host_checks verifies
// it for every config). In the atom at (R, C), the four lanes of a quad hold
// rows R + q and R + q + 8 (q = 0..7), lane l of the quad columns C + 2l and
// C + 2l + 1. One Philox call per (atom, quad), 128 bits for its 16 scores:
//     counter = (C, R + q, head, batch);  word l -> quad lane l;
//     byte e of that word -> element e of the lane's four:
//         (R + q, C + 2l), (R + q, C + 2l + 1), (R + q + 8, C + 2l), (R + q + 8, C + 2l + 1);
//     kept iff the byte < keep_threshold = round((1 − p) · 256).
// So the mask draws p rounded to a multiple of 1/256 (as FlashAttention-2's
// 8-bit threshold), and the kept scores are scaled by 1 / (1 − p) with p as
// given, as FlashAttention-2 scales them (its test suite's reference does the
// same): the expected output is then the undropped one times
// (keep_threshold / 256) / (1 − p), within 1/512 / (1 − p) of it. In the
// kernels the quad's four lanes share the work: for four of their atoms,
// lane l runs the call of the l-th and the words are exchanged with three
// shuffles (keep_bits), one call per lane per 16 scores (a call per lane,
// 32 bits per score, ran the d128 forward at 0.46 of its rate without
// dropout).
// (i, j) are the row and column inside the sequence (varlen too), batch is
// the sequence's index.
#pragma once

#include <cute/tensor.hpp>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace flashtile {

using namespace cute;

struct PhiloxKey {
  uint32_t lo, hi;
};

// The 32-bit high half of a · b.
CUTE_HOST_DEVICE uint32_t mul_hi_u32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return uint32_t((uint64_t(a) * b) >> 32);
#endif
}

// Philox4x32 with 10 rounds: counter c, key k -> four 32-bit words. Checked
// against the Random123 known-answer vectors in tests/cpp/host_checks.cu.
// kUnroll: rounds per loop iteration (10: straight-line code; fewer: less
// code, for the backward kernels whose query-block body must stay small
// enough to inline, Dropout::keep_bits).
template <int kUnroll = 10>
CUTE_HOST_DEVICE void philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, PhiloxKey key,
                                    uint32_t out[4]) {
  static_assert(10 % kUnroll == 0);
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // the round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // the key schedule's increments
  uint32_t k0 = key.lo, k1 = key.hi;
#pragma unroll(kUnroll)
  for (int round = 0; round < 10; ++round) {
    if (round > 0) k0 += kWeyl0, k1 += kWeyl1;
    const uint32_t hi0 = mul_hi_u32(kMul0, c0), lo0 = kMul0 * c0;
    const uint32_t hi1 = mul_hi_u32(kMul1, c2), lo1 = kMul1 * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

// round((1 − p) · 256), in [0, 256]: a byte below it is a kept score. 256
// (p below 1/512) keeps everything; 0 (p from 1 − 1/512) drops everything.
CUTE_HOST_DEVICE int dropout_keep_threshold(float p) {
  const int threshold = int((1.0 - double(p)) * 256.0 + 0.5);
  return threshold < 0 ? 0 : threshold > 256 ? 256 : threshold;
}

// The four Philox words of the quad whose first row is `row` in the atom
// whose first column is `atom_col` (word l is quad lane l's).
template <int kUnroll = 10>
CUTE_HOST_DEVICE void dropout_words(PhiloxKey key, int row, int atom_col, int head, int batch, uint32_t words[4]) {
  philox4x32_10<kUnroll>(uint32_t(atom_col), uint32_t(row), uint32_t(head), uint32_t(batch), key, words);
}

// Bits 0..3: the keep decisions of a lane's four elements, from its word
// (threshold in [0, 255]: 256, keep all, never reaches here).
CUTE_HOST_DEVICE uint32_t dropout_keep_nibble(uint32_t word, int threshold) {
#if defined(__CUDA_ARCH__)
  // Four byte compares at once (0xff per byte below the threshold), then one
  // bit per byte gathered by a multiply: bit 7 of byte e lands at bit 28 + e.
  const uint32_t below = __vcmpltu4(word, 0x01010101u * uint32_t(threshold));
  return ((below & 0x80808080u) * 0x00204081u) >> 28;
#else
  uint32_t nibble = 0;
  for (int e = 0; e < 4; ++e) nibble |= uint32_t(int((word >> (8 * e)) & 0xFFu) < threshold) << e;
  return nibble;
#endif
}

// Keep decisions of an accumulator fragment, one bit per element (element e
// at bit e % 32 of word e / 32).
template <class Frag>
using KeepBits = cute::array<uint32_t, (decltype(size(std::declval<Frag>()))::value + 31) / 32>;

// A kernel's dropout: Dropout<true> (the scoremod forward's, the dropout
// backward's) reads dropout_p and the seed from FwdParams or BwdParams and is
// on when dropout_p > 0. Dropout<false> (below) is the other kernels': an
// empty object whose enabled() is a constant false.
template <bool kEnabled>
struct Dropout {
  PhiloxKey key{0u, 0u};
  int keep_threshold = 256;
  float keep_scale = 1.f;  // 1 / (1 − p): what a kept probability is multiplied by
  int batch = 0;
  bool on = false;

  template <class Params>
  CUTE_DEVICE Dropout(Params const& params, int batch_)
      : keep_threshold(params.dropout_p > 0.f ? dropout_keep_threshold(params.dropout_p) : 256) {
    on = keep_threshold < 256;  // a p that rounds to 0 drops nothing
    if (on) {
      const uint64_t seed = uint64_t(*params.dropout_seed);
      key = PhiloxKey{uint32_t(seed), uint32_t(seed >> 32)};
      keep_scale = keep_threshold > 0 ? 1.f / (1.f - params.dropout_p) : 0.f;
      batch = batch_;
    }
  }

  CUTE_DEVICE bool enabled() const { return on; }

  // Keep bits of an (MMA = (2, 2), MMA_M, MMA_N) accumulator fragment whose
  // element e sits at (row0, col0) + coords(e): element (v, m, n) is bit
  // 4·(m + MMA_M·n) + v. Atoms four at a time: lane l of the quad runs the
  // Philox call of the group's l-th atom, then for each distance d it sends
  // the word that lane l ^ d needs and receives its own word of atom l ^ d.
  // A fragment of two atoms (the small-budget tiles, sm80/bwd_traits.hpp)
  // takes them two at a time: lanes l and l + 2 both run atom l % 2's call,
  // and each lane keeps the word it receives for atom peer % 2 (twice, the
  // same). The loop over groups is not unrolled: unrolled, the calls made
  // the backward's query-block body too large to inline (3.9 KB of stack at
  // d128, the accumulators in local memory).
  template <int kPhiloxUnroll = 10, class Coords>
  CUTE_DEVICE KeepBits<Coords> keep_bits(Coords const& coords, int row0, int col0, int head) const {
    static_assert(decltype(size<0>(coords))::value == 4, "m16n8 accumulator atoms");
    constexpr int kM = decltype(size<1>(coords))::value;
    constexpr int kAtoms = kM * decltype(size<2>(coords))::value;
    constexpr int kGroup = kAtoms % 4 == 0 ? 4 : 2;  // atoms per group of quad calls
    static_assert(kAtoms % kGroup == 0, "whole groups of two or four atoms");
    constexpr int kGroupsPerWord = 8 / kGroup;       // eight atoms per word of bits
    const int quad_lane = int(threadIdx.x) % 4;
    KeepBits<Coords> bits;
    CUTE_UNROLL
    for (int w = 0; w < int(bits.size()); ++w) {
      uint32_t word_bits = 0;
#pragma unroll 1
      for (int group = kGroupsPerWord * w; group < kGroupsPerWord * (w + 1) && kGroup * group < kAtoms; ++group) {
        const int atom = kGroup * group + quad_lane % kGroup;  // the call this lane runs
        const auto first = coords(0, atom % kM, atom / kM);    // this lane's first score in that atom
        uint32_t words[4];
        dropout_words<kPhiloxUnroll>(key, row0 + get<0>(first), col0 + get<1>(first) - 2 * quad_lane, head, batch,
                                     words);
        uint32_t group_bits = 0;
        CUTE_UNROLL
        for (int d = 0; d < 4; ++d) {
          const int peer = quad_lane ^ d;  // sends to and receives from quad lane `peer`
          const uint32_t send = (peer & 2) ? ((peer & 1) ? words[3] : words[2]) : ((peer & 1) ? words[1] : words[0]);
          // my word of atom kGroup·group + peer % kGroup
          const uint32_t mine = d == 0 ? send : __shfl_xor_sync(0xffffffffu, send, d);
          group_bits |= dropout_keep_nibble(mine, keep_threshold) << (4 * (peer % kGroup));
        }
        word_bits |= group_bits << (4 * kGroup * (group - kGroupsPerWord * w));
      }
      bits[w] = word_bits;
    }
    return bits;
  }

  // keep_bits when on, else every bit set (the backward's recomputation
  // applies the mask on every element without branching, common/bwd_tile.hpp).
  // Two Philox rounds per loop iteration: with straight-line rounds the
  // local-window scoremod backward's query-block body was not inlined (3.9
  // KB of stack, d128).
  template <class Coords>
  CUTE_DEVICE KeepBits<Coords> keep_bits_or_all(Coords const& coords, int row0, int col0, int head) const {
    KeepBits<Coords> all;
    CUTE_UNROLL
    for (int w = 0; w < int(all.size()); ++w) all[w] = 0xFFFFFFFFu;
    return on ? keep_bits<2>(coords, row0, col0, head) : all;
  }

  // frag(e) → 0 where dropped, on a fragment of any element type laid out
  // like the accumulator (the forward's bf16/fp16 P, whose kept values keep
  // their scale until O is normalized).
  template <class Frag, class Bits>
  CUTE_DEVICE static void zero_dropped(Frag& frag, Bits const& bits) {
    using T = typename std::decay_t<Frag>::value_type;
    CUTE_UNROLL
    for (int e = 0; e < size(frag); ++e) {
      if (!((bits[e / 32] >> (e % 32)) & 1)) frag(e) = T(0);
    }
  }
};

// The plain kernels' (and the backward's softcap/ALiBi kernels'): no state,
// and the kernels call nothing of it outside `if constexpr` on their dropout
// flag. With the members above and a run-time
// `if (enabled())` on a constant false, the plain d128 forward's register
// allocation changed (SASS compared with cuobjdump); like this it is the
// same instruction for instruction.
template <>
struct Dropout<false> {
  static constexpr float keep_scale = 1.f;

  template <class Params>
  CUTE_DEVICE Dropout(Params const&, int) {}

  CUTE_DEVICE static constexpr bool enabled() { return false; }
};

}  // namespace flashtile
