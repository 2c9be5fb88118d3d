// Pieces shared by the backward kernels (sm80/bwd_kernel.hpp, the main dK/dV
// kernel; sm80/bwd_dq_kernel.hpp, the deterministic mode's dQ kernel; the
// convert kernel of bwd_aux_kernels.hpp; and the SM90 kernels, which take
// some of them): the recomputation of P and dS for
// one (kBlockM, kBlockN) tile and the two ways it reads a block's LSE and D
// rows (shared memory or registers), the asynchronous loads of a block's
// rows (Q and dO; LSE and D), the dQ accumulator's layout and its vector
// atomic add, a key block's tiles and their zero store, and the staged
// store of an accumulator tile.
#pragma once

#include <cute/atom/copy_atom.hpp>
#include <cute/tensor.hpp>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "flashtile/common/copy.hpp"
#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/gmem.hpp"

namespace flashtile {

using namespace cute;

// P = exp2(S·scale_log2 − LSE·log2 e) and dS = P ∘ (dP − D), in place in the
// S and dP accumulators. Masked scores must already be −inf (P = 0).
//   acc_s, acc_dp: (MMA, MMA_M, MMA_N) fragments of the tile
//   coords: the same partition of an identity tensor, giving (row, col)
//   lse, dsum: the forward's LSE (natural log) and rowsum(dO ∘ O) of the
//   thread's rows, as callables (mi, row) -> float: mi indexes the rows of
//   rowcol_view(acc_s), row is the tile row (RowsInSmem, RowsInRegs)
//   mod, row0, col0: the score modifiers and the tile's first row and column.
//   With softcap, S holds t = tanh(·) (ScoreMod::apply_softcap, before the
//   mask) and dS gains the chain rule's 1 − t²; ALiBi's bias is added here.
//   rows_valid: the tile's rows inside the sequence. With the modifiers, the
//   rows past it (zero Q, dO, LSE and D) get P = 0: a negative ALiBi slope
//   would otherwise make their P = exp2(bias) overflow, and inf · 0 = NaN in
//   dK and dV (the plain kernels' P there is exp2(0) = 1, times zeros).
//   keep, keep_scale (the dropout kernels only): dropout's keep bits of the
//   tile (Dropout::keep_bits_or_all) and the scale of a kept score. With the
//   mask Z, dS = P ∘ (dP ∘ Z·s − D) and S becomes P ∘ Z·s, the P the forward
//   multiplied V by (for dV).
template <class AccS, class AccDP, class Coords, class RowsLse, class RowsD, class Mod, class Keep = std::nullptr_t>
CUTE_DEVICE void recompute_p_and_ds(AccS& acc_s, AccDP& acc_dp, Coords const& coords, RowsLse const& lse,
                                    RowsD const& dsum, float scale_log2, Mod const& mod, int row0, int col0,
                                    int rows_valid, Keep const& keep = nullptr, float keep_scale = 1.f) {
  static_assert(Mod::kIsEnabled || std::is_same_v<Keep, std::nullptr_t>, "dropout only in the modified kernels");
  Tensor s = rowcol_view(acc_s);      // (rows, cols)
  Tensor dp = rowcol_view(acc_dp);    // (rows, cols)
  Tensor rc = rowcol_view(coords);    // (rows, cols) -> (row, col)
  // The modified kernels take both modifiers' (and in the dropout kernels
  // dropout's) arithmetic on every element, neutral when off (a slope of 0;
  // 1 − 0·t²; every bit kept, scale 1): branching outside the loop instead
  // made copies of it, and the main kernel's query-block body was then no
  // longer inlined (3.8 KB of stack at d128).
  const float dtanh_weight = mod.has_softcap() ? 1.f : 0.f;
  CUTE_UNROLL
  for (int mi = 0; mi < size<0>(s); ++mi) {
    const int row = get<0>(rc(mi, 0));
    // A row that saw no key in the forward has lse = −inf and every score
    // masked; +inf keeps its P at exp2(−inf) = 0 instead of NaN. (A row with a
    // +inf score has lse = +inf: its P is NaN at the +inf scores and 0 at the
    // others, as in tests/reference.py.)
    const float row_lse = lse(mi, row);
    const bool no_p = row_lse == -INFINITY || (Mod::kIsEnabled && row >= rows_valid);
    const float row_lse_log2 = no_p ? INFINITY : row_lse * float(M_LOG2E);
    const float row_dsum = dsum(mi, row);
    CUTE_UNROLL
    for (int ni = 0; ni < size<1>(s); ++ni) {
      if constexpr (!Mod::kIsEnabled) {
        const float p = fast_exp2(s(mi, ni) * scale_log2 - row_lse_log2);
        s(mi, ni) = p;
        dp(mi, ni) = p * (dp(mi, ni) - row_dsum);
      } else {
        const float t = s(mi, ni);
        const float p = fast_exp2((t + mod.bias(row0 + row, col0 + get<1>(rc(mi, ni)))) * scale_log2 - row_lse_log2);
        // d tanh = 1 − t²; the max with 0 turns a masked t = −inf into 0 (its P is 0).
        const float dtanh = fmaxf(0.f, 1.f - dtanh_weight * t * t);
        // (mi, ni) is element (v = ni % 2 + 2 (mi % 2), m = mi / 2, n = ni / 2) of
        // the ((2, 2), MMA_M, MMA_N) fragment: keep bit v + 4 (m + MMA_M n).
        if constexpr (std::is_same_v<Keep, std::nullptr_t>) {
          s(mi, ni) = p;
          dp(mi, ni) = p * (dp(mi, ni) - row_dsum) * dtanh;
        } else {
          constexpr int kMmaM = decltype(size<1>(acc_s))::value;
          const int e = ni % 2 + 2 * (mi % 2) + 4 * (mi / 2 + kMmaM * (ni / 2));
          const float z = (keep[e / 32] >> (e % 32)) & 1 ? keep_scale : 0.f;
          s(mi, ni) = p * z;
          dp(mi, ni) = p * (dp(mi, ni) * z - row_dsum) * dtanh;
        }
      }
    }
  }
}

// A block's LSE or D rows as recompute_p_and_ds reads them: from the
// kBlockM values staged in shared memory, by tile row ...
struct RowsInSmem {
  const float* rows;
  CUTE_DEVICE float operator()(int, int row) const { return rows[row]; }
};
// ... or from the thread's own rows, held in registers (BwdConfig::kRowsInRegs).
template <int kThreadRows>
struct RowsInRegs {
  float values[kThreadRows];
  CUTE_DEVICE float operator()(int mi, int) const { return values[mi]; }
};

// Copies whole rows of a (CPY, CPY_ROWS, CPY_COLS) partition of 16-byte
// chunks with cp.async, the rows at or past rows_valid zero-filled by the
// same instruction (a source size of 0 bytes: nothing is read). The main
// kernel's Q and dO loads use it: with copy_rows_or_zero's separate zero
// stores (common/copy.hpp), predicated off on every full block yet issued, that
// backward ran 3–5 % slower at head dims 128 and 192 and 1–2 % at 96
// (benchmarks/NOTES.md, "Backward: zero-filling cp.async").
template <class Element, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows_async_zfill(Src const& src, Dst&& dst, Coords const& coords, int rows_valid) {
  static_assert(decltype(size<0>(dst))::value * sizeof(Element) == 16, "one 16-byte chunk per copy");
  Copy_Atom<SM80_CP_ASYNC_CACHEGLOBAL_ZFILL<uint128_t>, Element> chunk_copy;
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    const bool valid = get<0>(coords(0, m, 0)) < rows_valid;
    CUTE_UNROLL
    for (int k = 0; k < size<2>(dst); ++k) copy(chunk_copy.with(valid), src(_, m, k), dst(_, m, k));
  }
}

// Issues cp.async loads of kRows consecutive fp32 values (a block's LSE or D
// rows) into shared memory, one per thread for `thread` in [0, kRows); rows at or
// past rows_valid are zero-filled. Such rows still get P = exp2(0) = 1 in
// every unmasked column, but they are harmless because their Q, dO and D are
// all zero: dS = P ∘ (dP − D) = 0 and Pᵀ·dO adds 0, so they add nothing to
// dK, dV or dQ. (The zero fill of dO is load-bearing.)
template <int kRows, class CopyOp>
CUTE_DEVICE void load_rows_async(CopyOp, const float* src, float* dst, int rows_valid, int thread) {
  if (thread >= 0 && thread < kRows) {
    const bool valid = thread < rows_valid;
    CopyOp::copy(reinterpret_cast<const uint32_t&>(src[valid ? thread : 0]),
                 reinterpret_cast<uint32_t&>(dst[thread]), valid);
  }
}

// The fp32 dQ accumulator keeps each (kBlockM, kHeadDim) query block in the
// dQ product's register-fragment order, in vectors of kVector values: thread
// t's values kVector·g .. kVector·g + kVector − 1 sit at
// g·(kVector·kNThreads) + kVector·t. One atomic add per vector then covers
// kVector·128 contiguous bytes per warp, where the (row, col) order would
// scatter it over 8 rows. The convert kernel reads it back through the same
// partition and the same kVector.
template <int kNThreads, int kVector>
CUTE_HOST_DEVICE constexpr int dq_accum_offset(int thread, int value) {
  return (value / kVector) * (kVector * kNThreads) + kVector * thread + value % kVector;
}

// Values per dQ atomic add in device code: 4 on sm90 (one red.v4.f32, 512
// contiguous bytes per warp), 1 before it (scalar adds, 128 contiguous bytes
// per warp). The sm90 layout measured on the H200; sm80's has not been timed.
CUTE_DEVICE constexpr int dq_accum_vector() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return 1;
#else
  return 4;
#endif
}

// dst[0, kVector) += acc(i .. i + kVector − 1) atomically: one red.v4.f32
// (sm90 only; dst 16-byte aligned) or one scalar atomicAdd.
template <int kVector, class Acc>
CUTE_DEVICE void atomic_add_vector(float* dst, Acc const& acc, int i) {
  static_assert(kVector == 1 || kVector == 4);
  if constexpr (kVector == 4) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(dst), "f"(acc(i)), "f"(acc(i + 1)),
                 "f"(acc(i + 2)), "f"(acc(i + 3))
                 : "memory");
  } else {
    atomicAdd(dst, acc(i));
  }
}

// thread_dst[kOffsetBytes / 4, + 4) += acc(i .. i + 3): one red.v4.f32 whose
// offset from the thread's address is an immediate.
template <int kOffsetBytes, class Acc>
CUTE_DEVICE void atomic_add_vector_at(float* thread_dst, Acc const& acc, int i) {
  asm volatile("red.global.add.v4.f32 [%0+%5], {%1, %2, %3, %4};" ::"l"(thread_dst), "f"(acc(i)), "f"(acc(i + 1)),
               "f"(acc(i + 2)), "f"(acc(i + 3)), "n"(kOffsetBytes)
               : "memory");
}

template <int kNThreads, class Acc, int... kVectors>
CUTE_DEVICE void add_tile_atomic_v4(float* thread_dst, Acc const& acc, std::integer_sequence<int, kVectors...>) {
  (atomic_add_vector_at<dq_accum_offset<kNThreads, 4>(0, 4 * kVectors) * int(sizeof(float))>(thread_dst, acc,
                                                                                               4 * kVectors),
   ...);
}

// acc's tile += into dst, an fp32 tile in register order (dq_accum_offset;
// the dQ accumulator's blocks, the split tail's dK and dV), with
// dq_accum_vector() values per atomic add. The vector adds address the tile
// from one register pair: with an address per add, ptxas kept eight pairs
// live until the adds had read them.
template <int kNThreads, class Acc>
CUTE_DEVICE void add_tile_atomic(float* dst, Acc const& acc, int tid) {
  constexpr int kVector = dq_accum_vector();
  constexpr int kValues = decltype(size(acc))::value;
  static_assert(kValues % kVector == 0);
  if constexpr (kVector == 4) {
    add_tile_atomic_v4<kNThreads>(dst + dq_accum_offset<kNThreads, kVector>(tid, 0), acc,
                                  std::make_integer_sequence<int, kValues / kVector>{});
  } else {
    CUTE_UNROLL
    for (int i = 0; i < kValues; i += kVector) {
      atomic_add_vector<kVector>(dst + dq_accum_offset<kNThreads, kVector>(tid, i), acc, i);
    }
  }
}

// acc = the tile add_tile_atomic summed into src (the convert kernels).
template <int kNThreads, class Acc>
CUTE_DEVICE void load_tile_accum(Acc& acc, const float* src, int tid) {
  constexpr int kVector = dq_accum_vector();
  static_assert(decltype(size(acc))::value % kVector == 0);
  CUTE_UNROLL
  for (int i = 0; i < size(acc); i += kVector) {
    const float* values = src + dq_accum_offset<kNThreads, kVector>(tid, i);
    if constexpr (kVector == 4) {
      const float4 v = *reinterpret_cast<const float4*>(values);
      acc(i) = v.x, acc(i + 1) = v.y, acc(i + 2) = v.z, acc(i + 3) = v.w;
    } else {
      acc(i) = *values;
    }
  }
}

// A backward CTA's key block: its K and V tiles (the attended keys, seqlen_k
// rows) and its dK and dV outputs (the sequence's rows, seqlen_k_rows), each
// (kBlockN, kHeadDim).
template <int kHeadDim, int kBlockN, class Element, class Params, class Seq>
CUTE_DEVICE auto key_block_tiles(Params const& params, Seq const& seq, int head_k, int n_block) {
  using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  auto tile = [&](auto* base, int64_t batch_stride, int64_t row_stride, int64_t head_stride, int rows) {
    return local_tile(head_rows<kHeadDim>(base, seq.k_offset(batch_stride, row_stride), row_stride, head_stride,
                                          head_k, rows),
                      ShapeKV{}, make_coord(n_block, 0));
  };
  return make_tuple(
      tile(static_cast<const Element*>(params.k), params.k_batch_stride, params.k_row_stride, params.k_head_stride,
           seq.seqlen_k),
      tile(static_cast<const Element*>(params.v), params.v_batch_stride, params.v_row_stride, params.v_head_stride,
           seq.seqlen_k),
      tile(static_cast<Element*>(params.dk), params.dk_batch_stride, params.dk_row_stride, params.dk_head_stride,
           seq.seqlen_k_rows),
      tile(static_cast<Element*>(params.dv), params.dv_batch_stride, params.dv_row_stride, params.dv_head_stride,
           seq.seqlen_k_rows));
}

// seqused_k: the keys of a sequence that no query attends get dK = dV = 0;
// writes zeros to the rows below rows_valid of gdK and gdV.
template <class Traits, class TileDK, class TileDV>
CUTE_DEVICE void store_zero_dkdv(TileDK&& gdK, TileDV&& gdV, int rows_valid, int tid) {
  typename Traits::GmemTiledCopyStore gmem_copy_zero;
  auto gmem_thr_copy_zero = gmem_copy_zero.get_thread_slice(tid);
  Tensor tZgdK = gmem_thr_copy_zero.partition_D(gdK);  // (CPY, CPY_N, CPY_K)
  Tensor tZgdV = gmem_thr_copy_zero.partition_D(gdV);  // (CPY, CPY_N, CPY_K)
  Tensor tZc = gmem_thr_copy_zero.partition_D(make_identity_tensor(shape(gdK)));  // (CPY, CPY_N, CPY_K) -> (row, col)
  Tensor tZr = make_fragment_like(tZgdK);  // (CPY, CPY_N, CPY_K)
  clear(tZr);
  copy_rows(gmem_copy_zero, tZr, tZgdK, tZc, rows_valid);
  copy_rows(gmem_copy_zero, tZr, tZgdV, tZc, rows_valid);
}

// Writes a (rows, kHeadDim) fp32 register accumulator, times `scale` and
// converted to Element, to the rows below rows_valid of the global tile
// `out`. It is staged in `stage`, a shared-memory tile of the same shape and
// the Traits' swizzled layout, so each thread stores 16-byte row segments:
// straight from the fragment, a warp's 4-byte stores would scatter over 8
// rows. `stage` must be free on entry (the caller's barrier) and is still
// being read on return. `acc` is scaled in place.
template <class Traits, class TiledMma, class Acc, class Stage, class Out>
CUTE_DEVICE void store_tile_staged(TiledMma const& tiled_mma, Acc& acc, Stage&& stage, Out&& out,
                                   int rows_valid, float scale, int tid) {
  using Element = typename Traits::Element;
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) *= scale;
  auto smem_copy = make_tiled_copy_C(typename Traits::SmemCopyAtomPdS{}, tiled_mma);
  auto smem_thr_copy = smem_copy.get_thread_slice(tid);
  copy(smem_copy, smem_thr_copy.retile_S(convert_fragment<Element>(acc)), smem_thr_copy.partition_D(stage));
  __syncthreads();
  typename Traits::GmemTiledCopyStore gmem_copy;
  auto gmem_thr_copy = gmem_copy.get_thread_slice(tid);
  Tensor tSs = gmem_thr_copy.partition_S(stage);                                  // (CPY, CPY_M, CPY_K)
  Tensor tSr = make_fragment_like(tSs);                                           // (CPY, CPY_M, CPY_K)
  Tensor tSc = gmem_thr_copy.partition_S(make_identity_tensor(make_shape(size<0>(stage), size<1>(stage))));  // (CPY, CPY_M, CPY_K) -> (row, col)
  copy(gmem_copy, tSs, tSr);
  copy_rows(gmem_copy, tSr, gmem_thr_copy.partition_D(out), tSc, rows_valid);
}

}  // namespace flashtile
