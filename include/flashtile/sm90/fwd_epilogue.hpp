// The SM90 forward's epilogue: O from the consumers' accumulators to global
// memory in the output dtype, and the row logsumexps (the quad lane holding
// column 0 of a row writes its logsumexp). O goes one of two ways:
//   through shared memory (Traits::kStoreOThroughSmem, fixed-length
//     batches whose out TMA can step): each consumer warpgroup writes its
//     64 rows to a slab of its own with stmatrix, then one of its threads
//     stores the slab with TMA, which drops the rows past the sequence;
//     the slab is written again only once that store has read it;
//   from registers: each thread stores its accumulator's column pairs as
//     4-byte words, rows outside the sequence left alone.
// Host-side, to_params() builds out's TMA descriptor once per launch.
#pragma once

#include <cute/arch/copy_sm90.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/array.h>

#include <cmath>

#include "flashtile/common/fragment.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/fwd_mainloop.hpp"
#include "flashtile/sm90/tma_support.hpp"

namespace flashtile::sm90 {

using namespace cute;

template <class Traits>
struct FwdEpilogue {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeO = Shape<Int<kBlockM>, Int<kHeadDim>>;
  using ShapeOWarpgroup = Shape<_64, Int<kHeadDim>>;

  // out as TMA sees it: (rows, head dim, heads, batch), fixed-length batches.
  using ShapeRows = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
  static auto make_tma_o(Element* ptr, ShapeRows shape, StrideRows stride) {
    return make_tma_copy(SM90_TMA_STORE{}, make_tensor(make_gmem_ptr(ptr), shape, stride),
                         typename Traits::SmemLayoutOWarpgroup{}, ShapeOWarpgroup{}, _1{});
  }
  using TmaO = decltype(make_tma_o(nullptr, ShapeRows{}, StrideRows{}));

  struct Params {
    TmaO tma_o;         // built where through_smem
    ShapeRows shape_o;  // (seqlen_q, kHeadDim, nheads, batch)
    bool through_smem;
  };

  // O through shared memory where the traits take that way, the batch is
  // fixed-length and TMA can step out's strides (a mode of extent 1 gets
  // tma_stride's harmless one).
  static Params to_params(FwdParams const& p) {
    Params params{};
    params.through_smem = Traits::kStoreOThroughSmem && !is_varlen(p) &&
                          tma_tensor_ok(p.out_row_stride, p.out_head_stride, p.out_batch_stride, p.seqlen_q,
                                        p.nheads, p.batch);
    if (params.through_smem) {
      params.shape_o = ShapeRows{p.seqlen_q, kHeadDim, p.nheads, p.batch};
      const StrideRows stride_o{tma_stride(p.out_row_stride, p.seqlen_q), _1{}, tma_stride(p.out_head_stride, p.nheads),
                                tma_stride(p.out_batch_stride, p.batch)};
      params.tma_o = make_tma_o(static_cast<Element*>(p.out), params.shape_o, stride_o);
    }
    return params;
  }

  CUTE_DEVICE static void prefetch_descriptor(Params const& params) {
    if constexpr (Traits::kStoreOThroughSmem) {
      if (params.through_smem) prefetch_tma_descriptor(params.tma_o.get_tma_descriptor());
    }
  }

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
  template <MaskKind kMask, int kBlockN, class SharedStorage, class AccO, class Lse>
  CUTE_DEVICE static void store(Params const& ep, FwdParams const& params, SharedStorage& storage,
                                FwdTile<kMask, kBlockM, kBlockN> const& tile, AccO const& acc_o, Lse const& lse,
                                int mma_tid) {
    if constexpr (Traits::kStoreOThroughSmem) {
      // TMA's store takes no box that starts before row 0 (an illegal
      // instruction on the H200), so the warpgroup of a causal block that
      // starts before the sequence (FwdTile::row_shift) stores from
      // registers, as does one whose rows all lie past it (it writes
      // nothing; a box that starts past the tensor's end is not needed).
      const int warpgroup_row = tile.row_begin() + 64 * (mma_tid / 128);
      if (!tile.seq.varlen && ep.through_smem && warpgroup_row >= 0 && warpgroup_row < tile.seq.seqlen_q) {
        store_through_smem(ep, params, storage, tile, acc_o, lse, mma_tid);
        return;
      }
    }
    store_from_registers(params, tile, acc_o, lse, mma_tid);
  }

  // Before the CTA exits: its last TMA stores have read their slabs.
  CUTE_DEVICE static void finish(Params const& ep, int mma_tid) {
    if constexpr (Traits::kStoreOThroughSmem) {
      if (ep.through_smem && mma_tid % 128 == 0) tma_store_wait<0>();
    }
  }

  template <MaskKind kMask, int kBlockN, class SharedStorage, class AccO, class Lse>
  CUTE_DEVICE static void store_through_smem(Params const& ep, FwdParams const& params, SharedStorage& storage,
                                             FwdTile<kMask, kBlockM, kBlockN> const& tile, AccO const& acc_o,
                                             Lse const& lse, int mma_tid) {
    const int warpgroup = mma_tid / 128;
    const int wg_tid = mma_tid % 128;
    const uint32_t barrier = Traits::kBarrierEpilogue + warpgroup;
    Tensor sO = make_tensor(make_smem_ptr(storage.o.data()),
                            typename Traits::SmemLayoutO{})(_, _, warpgroup);  // (64, kHeadDim)

    // The warpgroup's accumulator is that of one warpgroup's product over
    // its 64 rows (the tile's products split along M only).
    using TiledMmaWarpgroup = decltype(make_tiled_mma(typename Traits::TiledMmaPV::Atom{}));
    auto tiled_copy = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, TiledMmaWarpgroup{});
    auto thr_copy = tiled_copy.get_thread_slice(wg_tid);
    Tensor rO = convert_fragment<Element>(acc_o);
    Tensor tOrO = thr_copy.retile_S(rO);   // (CPY, CPY_M, CPY_D)
    Tensor tOsO = thr_copy.partition_D(sO);  // (CPY, CPY_M, CPY_D)

    // The slab's last store has read it.
    if (wg_tid == 0) tma_store_wait<0>();
    cutlass::arch::NamedBarrier::sync(128, barrier);
    copy(tiled_copy, tOrO, tOsO);
    store_lse(params, tile, lse, mma_tid);
    cutlass::arch::fence_view_async_shared();  // stmatrix's writes, to TMA (the async proxy)
    cutlass::arch::NamedBarrier::sync(128, barrier);
    if (wg_tid == 0) {
      Tensor mO = ep.tma_o.get_tma_tensor(ep.shape_o)(_, _, tile.head, tile.seq.batch);  // (seqlen_q, kHeadDim)
      Tensor gO = local_tile(domain_offset(make_coord(-tile.row_shift, _0{}), mO), ShapeOWarpgroup{},
                             make_coord(tile.m_block * Traits::kMmaWarpgroups + warpgroup, _0{}));  // (64, kHeadDim)
      auto tma_o = ep.tma_o.get_slice(_0{});
      copy(ep.tma_o, tma_o.partition_S(sO), tma_o.partition_D(gO));
      tma_store_arrive();
    }
  }

  template <MaskKind kMask, int kBlockN, class Lse>
  CUTE_DEVICE static void store_lse(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile,
                                    Lse const& lse, int mma_tid) {
    float* lse_out = sequence_lse(params, tile);
    typename Traits::TiledMmaPV tiled_mma_pv;
    Tensor cO_rowcol = rowcol_view(tiled_mma_pv.get_thread_slice(mma_tid).partition_C(
        make_identity_tensor(ShapeO{})));  // (rows, cols) -> (row, col)
    CUTE_UNROLL
    for (int r = 0; r < size<0>(cO_rowcol); ++r) {
      const int row = tile.row_begin() + get<0>(cO_rowcol(r, 0));
      if (tile.has_row(row) && get<1>(cO_rowcol(r, 0)) == 0) lse_out[row] = lse(r);
    }
  }

  // The logsumexps are written in the same pass as O's rows: a pass of
  // their own spilled at d256.
  template <MaskKind kMask, int kBlockN, class AccO, class Lse>
  CUTE_DEVICE static void store_from_registers(FwdParams const& params, FwdTile<kMask, kBlockM, kBlockN> const& tile,
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
