// The SM90 forward's epilogue: O from the consumers' accumulators to global
// memory in the output dtype, and the row logsumexps. Each thread stores its
// accumulator's column pairs as 4-byte words, rows outside the sequence left
// alone; the quad lane holding column 0 of a row writes its logsumexp.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/array.h>

#include <cmath>

#include "flashtile/common/fragment.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/fwd_mainloop.hpp"

namespace flashtile::sm90 {

using namespace cute;

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeO = Shape<Int<kBlockM>, Int<kHeadDim>>;

  // The sequence's rows of out: (seqlen_q, kHeadDim), and of the lse.
  template <MaskKind kMask, int kBlockN>
  CUTE_DEVICE static auto sequence_of_out(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile) {
    Element* out = static_cast<Element*>(params.out) +
                   tile.seq.q_offset(params.out_batch_stride, params.out_row_stride) +
                   int64_t(tile.head) * params.out_head_stride;
    return make_tensor(make_gmem_ptr(out), make_shape(tile.seq.seqlen_q, Int<kHeadDim>{}),
                       make_stride(params.out_row_stride, _1{}));  // (seqlen_q, kHeadDim)
  }

  template <MaskKind kMask, int kBlockN>
  CUTE_DEVICE static float* sequence_lse(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile) {
    return params.lse + tile.seq.row_index(params, tile.head);
  }

  // The tile's rows of the sequence (FwdTile::row_begin on), rows outside
  // it left alone.
  template <MaskKind kMask, int kBlockN, class AccO, class Lse>
  CUTE_DEVICE static void store(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile,
                                AccO const& acc_o, Lse const& lse, int mma_tid) {
    Tensor mO = sequence_of_out(params, tile);  // (seqlen_q, kHeadDim)
    float* lse_out = sequence_lse(params, tile);
    typename Traits::TiledMmaPV tiled_mma_pv;
    Tensor tOcO = tiled_mma_pv.get_thread_slice(mma_tid).partition_C(make_identity_tensor(ShapeO{}));
    Tensor rO = convert_fragment<Element>(acc_o);
    Tensor rO_rowcol = rowcol_view(rO);      // (rows, cols)
    Tensor cO_rowcol = rowcol_view(tOcO);    // (rows, cols) -> (row, col)
    using Pair = cutlass::Array<Element, 2>;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(rO_rowcol); ++r) {
      const int row = tile.row_begin() + get<0>(cO_rowcol(r, 0));
      if (!tile.has_row(row)) continue;
      // Columns c and c + 1 of the view are neighbours (the value mode's
      // innermost pair), 4-byte aligned.
      CUTE_UNROLL
      for (int c = 0; c < size<1>(rO_rowcol); c += 2) {
        Pair pair;
        pair[0] = rO_rowcol(r, c);
        pair[1] = rO_rowcol(r, c + 1);
        *reinterpret_cast<Pair*>(&mO(row, get<1>(cO_rowcol(r, c)))) = pair;
      }
      if (get<1>(cO_rowcol(r, 0)) == 0) lse_out[row] = lse(r);
    }
  }

  // A tile whose rows see no key: out 0 and logsumexp −inf on its rows of
  // the sequence, written by the kMmaThreads consumer threads in 16-byte
  // vectors.
  template <MaskKind kMask, int kBlockN>
  CUTE_DEVICE static void store_zero(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile,
                                     int mma_tid) {
    Tensor mO = sequence_of_out(params, tile);  // (seqlen_q, kHeadDim)
    const int row_begin = max(tile.row_begin(), 0);
    const int rows = min(tile.row_begin() + kBlockM, tile.seq.seqlen_q) - row_begin;
    constexpr int kVectors = kHeadDim / 8;  // 16-byte vectors per row
    for (int i = mma_tid; i < rows * kVectors; i += Traits::kMmaThreads) {
      *reinterpret_cast<uint4*>(&mO(row_begin + i / kVectors, (i % kVectors) * 8)) = make_uint4(0, 0, 0, 0);
    }
    float* lse_out = sequence_lse(params, tile);
    for (int i = mma_tid; i < rows; i += Traits::kMmaThreads) lse_out[row_begin + i] = -INFINITY;
  }
};

}  // namespace flashtile::sm90
