// Views and small operations on mma.sync register fragments.
//
// An SM80 m16n8 accumulator fragment has the per-thread layout
// ((2, 2), MMA_M, MMA_N): value sub-mode 0 steps one column (c0 -> c1),
// sub-mode 1 steps eight rows (c0 -> c2). The four lanes of a quad hold the
// same rows, so a row reduction is a thread-local loop plus two shuffles.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flashtile {

using namespace cute;

// ((2, 2), MMA_M, MMA_N) -> ((2, MMA_M), (2, MMA_N)): a (row, col) view.
// A wgmma (SM90) accumulator has the value mode (2, 2, N / 8): the same
// column pair and row step, then the atom's n8 column tiles, which join the
// column mode: ((2, 2, N / 8), MMA_M, MMA_N) -> ((2, MMA_M), ((2, N / 8), MMA_N)).
template <class Layout>
CUTE_HOST_DEVICE constexpr auto rowcol_layout(Layout acc) {
  static_assert(decltype(rank(acc))::value == 3);
  auto value = get<0>(acc);  // (2, 2) or (2, 2, N / 8)
  static_assert(decltype(size<0>(value))::value == 2 && decltype(size<1>(value))::value == 2);
  if constexpr (decltype(rank(value))::value == 2) {
    return make_layout(make_layout(get<1>(value), get<1>(acc)), make_layout(get<0>(value), get<2>(acc)));
  } else {
    static_assert(decltype(rank(value))::value == 3);
    return make_layout(make_layout(get<1>(value), get<1>(acc)),
                       make_layout(make_layout(get<0>(value), get<2>(value)), get<2>(acc)));
  }
}

template <class Tensor_>
CUTE_HOST_DEVICE auto rowcol_view(Tensor_&& acc) {
  return make_tensor(acc.data(), rowcol_layout(acc.layout()));
}

// ((2, 2), MMA_M, MMA_N) accumulator -> ((2, 2, 2), MMA_M, MMA_N / 2), the
// A-operand layout of an m16n8k16 MMA. Two neighbouring n8 accumulator tiles
// hold exactly the k0..7 and k8..15 halves of one A fragment, so P = softmax(S)
// feeds the P·V product straight from registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto acc_to_operand_a_layout(Layout acc) {
  static_assert(decltype(size<2>(acc))::value % 2 == 0);
  auto split = logical_divide(acc, Shape<Underscore, Underscore, _2>{});  // ((2,2), M, (2, N/2))
  return make_layout(make_layout(get<0, 0>(split), get<0, 1>(split), get<2, 0>(split)),
                     get<1>(split), get<2, 1>(split));
}

// Converts the register fragment src into dst, storage element j to storage
// element j, two at a time: each pair is one packed cvt whose 32-bit result
// lands whole in one register of dst. (A loop over logical 16-bit elements
// made ptxas split each packed result and merge the halves again: on the
// SM90 forward's P, ~150 shift/mask instructions per thread per key block,
// a fifth of the kernel's stall samples; benchmarks/NOTES.md.) Both
// fragments are compact; with the same layout (or, as the SM90 forward's
// P, a layout that regroups the same storage) the logical correspondence
// follows.
template <class TensorSrc, class TensorDst>
CUTE_DEVICE void convert_fragment_into(TensorSrc const& src, TensorDst&& dst) {
  using From = typename std::decay_t<TensorSrc>::value_type;
  using To = typename std::decay_t<TensorDst>::value_type;
  constexpr int kSize = decltype(size(src))::value;
  static_assert(kSize % 2 == 0 && decltype(size(dst))::value == kSize);
  static_assert(decltype(cosize(src.layout()))::value == kSize && decltype(cosize(dst.layout()))::value == kSize,
                "compact fragments");
  const auto* in = reinterpret_cast<const cutlass::Array<From, 2>*>(raw_pointer_cast(src.data()));
  auto* out = reinterpret_cast<cutlass::Array<To, 2>*>(raw_pointer_cast(dst.data()));
  cutlass::NumericArrayConverter<To, From, 2> convert_pair;
  CUTE_UNROLL
  for (int i = 0; i < kSize / 2; ++i) out[i] = convert_pair(in[i]);
}

// A new fragment of src's layout holding src converted to To.
template <class To, class Tensor_>
CUTE_DEVICE auto convert_fragment(Tensor_ const& src) {
  auto dst = make_tensor<To>(src.layout());
  convert_fragment_into(src, dst);
  return dst;
}

// Reduction across the four lanes of a quad (lanes that share a row).
template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 2));
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  return x;
}

struct MaxOp {
  CUTE_DEVICE float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  CUTE_DEVICE float operator()(float a, float b) const { return a + b; }
};

// ex2.approx: one MUFU instruction, what exp2f becomes under --use_fast_math,
// without requiring that flag of every translation unit that includes us.
CUTE_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace flashtile
