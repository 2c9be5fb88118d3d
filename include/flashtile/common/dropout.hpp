// Dropout on the attention probabilities, regenerated wherever P is: the
// forward, the backward's main kernel, the deterministic dQ kernel and the
// testing-only probabilities kernel all draw the same keep/drop decision for
// score (i, j) of (batch, head).
//
// The random numbers come from Philox4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC'11), a counter-based generator:
// output = f(counter, key), no state. The key is the 64-bit seed the caller
// draws per forward (from torch's CUDA generator in the Python layer); the
// counter names four scores, the ones a thread of an m16n8 MMA holds in one
// accumulator atom (common/fragment.hpp):
//     (i, j), (i, j + 1), (i + 8, j), (i + 8, j + 1),  i ≡ 0..7 (mod 16), j even,
// as counter = (j, i, head, batch) with (i, j) the first of them, and output
// word v decides element v of that atom. Every kernel here tiles S with
// m16n8 atoms at rows that are multiples of 16 and columns that are multiples
// of 8 of the sequence, so each one rebuilds the same four-score groups
// whatever its block sizes and warp layout. One Philox call per four scores,
// 32 bits each: score (i, j) is kept iff its word < keep_threshold =
// round((1 − p) · 2³²), a keep probability exact to 2⁻³².
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
CUTE_HOST_DEVICE void philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, PhiloxKey key,
                                    uint32_t out[4]) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;  // the round multipliers
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // the key schedule's increments
  uint32_t k0 = key.lo, k1 = key.hi;
  CUTE_UNROLL
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

// round((1 − p) · 2³²), saturated below 2³²: scores whose word is below it
// are kept. p in (0, 1).
CUTE_HOST_DEVICE uint32_t dropout_keep_threshold(float p) {
  const double keep = (1.0 - double(p)) * 4294967296.0;
  return keep >= 4294967295.0 ? 0xFFFFFFFFu : uint32_t(keep + 0.5);
}

// The four keep decisions of the atom group whose first score is (row, col)
// (row ≡ 0..7 mod 16, col even), as bits 0..3 in atom element order.
CUTE_HOST_DEVICE uint32_t dropout_keep_group(PhiloxKey key, uint32_t threshold, int row, int col, int head,
                                             int batch) {
  uint32_t words[4];
  philox4x32_10(uint32_t(col), uint32_t(row), uint32_t(head), uint32_t(batch), key, words);
  return uint32_t(words[0] < threshold) | uint32_t(words[1] < threshold) << 1 |
         uint32_t(words[2] < threshold) << 2 | uint32_t(words[3] < threshold) << 3;
}

// Keep decisions of an accumulator fragment, one bit per element (element e
// at bit e % 32 of word e / 32).
template <class Frag>
using KeepBits = cute::array<uint32_t, (decltype(size(std::declval<Frag>()))::value + 31) / 32>;

// A kernel's dropout: Dropout<true> (the scoremod kernels') reads dropout_p
// and the seed from FwdParams or BwdParams and is on when dropout_p > 0.
// Dropout<false> (below) is the plain kernels': an empty object whose
// enabled() is a constant false.
template <bool kEnabled>
struct Dropout {
  PhiloxKey key{0u, 0u};
  uint32_t keep_threshold = 0xFFFFFFFFu;
  float keep_scale = 1.f;  // 1 / (1 − p): what a kept probability is multiplied by
  int batch = 0;
  bool on = false;

  template <class Params>
  CUTE_DEVICE Dropout(Params const& params, int batch_) : on(params.dropout_p > 0.f) {
    if (on) {
      const uint64_t seed = uint64_t(*params.dropout_seed);
      key = PhiloxKey{uint32_t(seed), uint32_t(seed >> 32)};
      keep_threshold = dropout_keep_threshold(params.dropout_p);
      keep_scale = 1.f / (1.f - params.dropout_p);
      batch = batch_;
    }
  }

  CUTE_DEVICE bool enabled() const { return on; }

  // Keep bits of an (MMA = (2, 2), MMA_M, MMA_N) accumulator fragment whose
  // element e sits at (row0, col0) + coords(e): element (v, m, n) is bit
  // 4·(m + MMA_M·n) + v. One Philox call per atom, eight atoms per word, in
  // a loop that is not unrolled: unrolled, its ~45 instructions per atom
  // made the backward's query-block body too large to inline (3.9 KB of
  // stack at d128, the accumulators in local memory); the loop costs a few
  // instructions per call.
  template <class Coords>
  CUTE_DEVICE KeepBits<Coords> keep_bits(Coords const& coords, int row0, int col0, int head) const {
    static_assert(decltype(size<0>(coords))::value == 4, "m16n8 accumulator atoms");
    constexpr int kM = decltype(size<1>(coords))::value;
    constexpr int kAtoms = kM * decltype(size<2>(coords))::value;
    KeepBits<Coords> bits;
    CUTE_UNROLL
    for (int w = 0; w < int(bits.size()); ++w) {
      uint32_t word = 0;
#pragma unroll 1
      for (int a = 0; a < 8 && 8 * w + a < kAtoms; ++a) {
        const int atom = 8 * w + a;
        const auto first = coords(0, atom % kM, atom / kM);  // the atom group's first score
        word |= dropout_keep_group(key, keep_threshold, row0 + get<0>(first), col0 + get<1>(first), head, batch)
                << (4 * a);
      }
      bits[w] = word;
    }
    return bits;
  }

  // acc(e) → acc(e) · scale where kept, 0 where dropped (bits from keep_bits).
  template <class Acc, class Bits>
  CUTE_DEVICE static void apply(Acc& acc, Bits const& bits, float scale) {
    CUTE_UNROLL
    for (int e = 0; e < size(acc); ++e) acc(e) = (bits[e / 32] >> (e % 32)) & 1 ? acc(e) * scale : 0.f;
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

// The plain kernels': no state, and the kernels call nothing of it outside
// `if constexpr (kScoreMod)`. With the members above and a run-time
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
