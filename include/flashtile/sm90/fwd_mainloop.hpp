// The SM90 forward's mainloop, in its two halves:
//   load()  the producer: one thread issues TMA loads of Q (once per tile,
//           once the tile before has done with it) and of K and V (per key
//           block, into kStages-deep rings that complete on mbarriers,
//           PipelineTmaAsync);
//   mma()   the consumer warpgroups: for each visible key block j, last to
//           first,
//             S_j = Q·K_jᵀ (wgmma, SS), then O += P_{j+1}·V_{j+1} (wgmma,
//               RS: the block before's probabilities from registers)
//             once S_j is done: release K's stage; the score modifier
//               (softcap and ALiBi, or a caller's: common/score_mod.hpp);
//               mask (tiles on a boundary only); the online softmax's
//               exponentials
//             once the product is done: release V's stage, rescale O,
//               P_j = S_j converted in registers, dropout's zeros set
//               (at the end of the step, or at the start of the next:
//               Traits::kRetireProductLate)
//           then the last block's product, and return the row logsumexp.
// Host-side, to_params() builds the three TMA descriptors from FwdParams
// once per launch; they travel in the kernel's __grid_constant__ parameters.
#pragma once

#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/atom/copy_traits_sm90_tma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

#include "flashtile/common/dropout.hpp"
#include "flashtile/common/fragment.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/common/softmax.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/fwd_traits.hpp"
#include "flashtile/sm90/gemm.hpp"
#include "flashtile/sm90/tma_support.hpp"
#include "flashtile/sm90/warpgroup_turns.hpp"

namespace flashtile::sm90 {

using namespace cute;

// What a CTA works on: one query block of one (batch, head), its sequence
// and the key blocks [n_block_begin, n_block_end) its rows see.
//
// Query block m holds the sequence's rows [m · kBlockM − row_shift, (m +
// 1) · kBlockM − row_shift). A causal tile is laid from the sequence's last
// row up (row_shift = the padding of seqlen_q to whole blocks, less its
// remainder mod 16 in the dropout kernels: fwd_kernel.hpp), so that the
// partial block is the first one, which sees the fewest keys, and not the
// last, which sees them all: d64's 192-row blocks at 1k left 128 of the
// last block's rows out of the sequence. mask is built for seqlen_q +
// row_shift rows, whose blocks start at multiples of kBlockM (row i of the
// sequence is its row i + row_shift: the same diagonal). Other tiles have
// row_shift 0, their partial block the last.
template <MaskKind kMask, int kBlockM, int kBlockN>
struct FwdTile {
  int m_block;
  int head;
  int head_k;
  SeqInfo seq;
  int row_shift;
  BlockMask<kMask, kBlockM, kBlockN> mask;
  int n_block_begin;
  int n_block_end;

  CUTE_DEVICE bool empty() const { return n_block_end <= n_block_begin; }
  // The sequence's row at the tile's row 0 (negative where the tile starts
  // before the sequence).
  CUTE_DEVICE int row_begin() const { return m_block * kBlockM - row_shift; }
  // Whether sequence row `row` exists.
  CUTE_DEVICE bool has_row(int row) const { return row >= 0 && row < seq.seqlen_q; }
  // Whether some of consumer warpgroup w's 64 rows exist.
  CUTE_DEVICE bool warpgroup_has_rows(int w) const {
    const int first = row_begin() + 64 * w;
    return first + 64 > 0 && first < seq.seqlen_q;
  }
  // One past the last key block that some of consumer warpgroup w's rows
  // see (at most n_block_end): on a causal or window diagonal the upper
  // warpgroups' rows see fewer keys than the block's last row (at d64, 9 of
  // the 81 warpgroup-blocks of a causal 1k sequence).
  CUTE_DEVICE int warpgroup_n_block_end(int w) const {
    if constexpr (kMask == MaskKind::kNone) {
      return n_block_end;
    } else {
      const int last_row_end = min(m_block * kBlockM + 64 * (w + 1), mask.seqlen_q);  // in mask's rows
      const int visible_cols = last_row_end + mask.offset + (kMask == MaskKind::kLocal ? mask.right : 0);
      return min(n_block_end, visible_cols > 0 ? ceil_div(visible_cols, kBlockN) : 0);
    }
  }
};

template <class Traits>
struct FwdMainloop {
  using Element = typename Traits::Element;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;

  // Global tensors as TMA sees them: (rows, head dim, heads, batch) for Q
  // and K, and V transposed, (head dim, rows, heads, batch). A varlen batch
  // is one packed sequence of batch 1 (rows: total_q or total_k).
  using ShapeRows = Shape<int32_t, int32_t, int32_t, int32_t>;
  using StrideRows = Stride<int64_t, _1, int64_t, int64_t>;
  using StrideRowsT = Stride<_1, int64_t, int64_t, int64_t>;

  template <class SmemLayout, class Tile, class StrideT>
  static auto make_tma(const Element* ptr, ShapeRows shape, StrideT stride) {
    return make_tma_copy(SM90_TMA_LOAD{}, make_tensor(make_gmem_ptr(ptr), shape, stride), SmemLayout{}, Tile{}, _1{});
  }
  using TmaQ = decltype(make_tma<typename Traits::SmemLayoutQ, Shape<Int<kBlockM>, Int<kHeadDim>>>(
      nullptr, ShapeRows{}, StrideRows{}));
  using TmaK = decltype(make_tma<typename Traits::SmemLayoutKStage,
                                 Shape<Int<kBlockN>, Int<kHeadDim>>>(nullptr, ShapeRows{}, StrideRows{}));
  using TmaV = decltype(make_tma<typename Traits::SmemLayoutVtStage,
                                 Shape<Int<kHeadDim>, Int<kBlockN>>>(nullptr, ShapeRows{}, StrideRowsT{}));

  struct Params {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    ShapeRows shape_q;   // (rows, kHeadDim, nheads, batch)
    ShapeRows shape_k;   // (rows, kHeadDim, nheads_k, batch)
    ShapeRows shape_vt;  // (kHeadDim, rows, nheads_k, batch)
  };

  // The descriptors for params' q, k and v (16-byte aligned pointers and
  // strides: can_implement_fwd checked them; fwd_supports, that TMA can step
  // them; a mode of extent 1 gets tma_stride's harmless one, and a heads or
  // batch mode of stride 0 extent 1: tma_extent).
  static Params to_params(FwdParams const& p) {
    const bool varlen = is_varlen(p);
    const int32_t batch = varlen ? 1 : p.batch;
    const int32_t rows_q = varlen ? p.total_q : p.seqlen_q;
    const int32_t rows_k = varlen ? p.total_k : p.seqlen_k;
    const int32_t heads_q = tma_extent(p.q_head_stride, p.nheads), batch_q = tma_extent(p.q_batch_stride, batch);
    const int32_t heads_k = tma_extent(p.k_head_stride, p.nheads_k), batch_k = tma_extent(p.k_batch_stride, batch);
    const int32_t heads_v = tma_extent(p.v_head_stride, p.nheads_k), batch_v = tma_extent(p.v_batch_stride, batch);
    const ShapeRows shape_q{rows_q, kHeadDim, heads_q, batch_q};
    const ShapeRows shape_k{rows_k, kHeadDim, heads_k, batch_k};
    const ShapeRows shape_vt{kHeadDim, rows_k, heads_v, batch_v};
    const StrideRows stride_q{tma_stride(p.q_row_stride, rows_q), _1{}, tma_stride(p.q_head_stride, heads_q),
                              tma_stride(p.q_batch_stride, batch_q)};
    const StrideRows stride_k{tma_stride(p.k_row_stride, rows_k), _1{}, tma_stride(p.k_head_stride, heads_k),
                              tma_stride(p.k_batch_stride, batch_k)};
    const StrideRowsT stride_vt{_1{}, tma_stride(p.v_row_stride, rows_k), tma_stride(p.v_head_stride, heads_v),
                                tma_stride(p.v_batch_stride, batch_v)};
    return {make_tma<typename Traits::SmemLayoutQ, Shape<Int<kBlockM>, Int<kHeadDim>>>(
                static_cast<const Element*>(p.q), shape_q, stride_q),
            make_tma<typename Traits::SmemLayoutKStage, Shape<Int<kBlockN>, Int<kHeadDim>>>(
                static_cast<const Element*>(p.k), shape_k, stride_k),
            make_tma<typename Traits::SmemLayoutVtStage, Shape<Int<kHeadDim>, Int<kBlockN>>>(
                static_cast<const Element*>(p.v), shape_vt, stride_vt),
            shape_q, shape_k, shape_vt};
  }

  CUTE_DEVICE static void prefetch_descriptors(Params const& params) {
    prefetch_tma_descriptor(params.tma_q.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_k.get_tma_descriptor());
    prefetch_tma_descriptor(params.tma_v.get_tma_descriptor());
  }

  // A sequence's rows of a (rows, d, heads, batch) coordinate tensor, at
  // one head, from its row -row_shift on: its batch slice, or (varlen) its
  // rows of the packed one. TMA fills rows before the tensor's first with
  // zeros; a varlen sequence's rows before its own are the sequence
  // before's, whose results the epilogue drops as well. A heads or batch
  // mode of extent 1 is read at 0 whatever the index: the tensor's only
  // one, or one expanded along it (tma_extent).
  template <class Tensor_>
  CUTE_DEVICE static auto sequence_rows(Tensor_ const& m, int head, SeqInfo const& seq, int row_start,
                                        int row_shift = 0) {
    const int h = size<2>(m) == 1 ? 0 : head;
    if (seq.varlen) return domain_offset(make_coord(row_start - row_shift, _0{}), m(_, _, h, 0));
    return domain_offset(make_coord(-row_shift, _0{}), m(_, _, h, size<3>(m) == 1 ? 0 : seq.batch));
  }
  template <class Tensor_>
  CUTE_DEVICE static auto sequence_cols(Tensor_ const& m, int head, SeqInfo const& seq, int row_start) {
    const int h = size<2>(m) == 1 ? 0 : head;
    if (seq.varlen) return domain_offset(make_coord(_0{}, row_start), m(_, _, h, 0));
    return domain_offset(make_coord(_0{}, 0), m(_, _, h, size<3>(m) == 1 ? 0 : seq.batch));
  }

  // The producer (one thread, the pipelines' leader): Q, then K and V of
  // each key block the consumers will visit. write is K's ring state and
  // V's alike (both advance one stage per block).
  template <MaskKind kMask, class SharedStorage>
  CUTE_DEVICE static void load(Params const& params, SharedStorage& storage, typename Traits::PipelineKV& pipeline_k,
                               typename Traits::PipelineKV& pipeline_v,
                               typename Traits::PipelineKV::PipelineState& write,
                               FwdTile<kMask, kBlockM, kBlockN> const& tile) {
    Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});    // (kBlockM, kHeadDim)
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});    // (kBlockN, kHeadDim, kStages)
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, kStages)

    Tensor mQ = sequence_rows(params.tma_q.get_tma_tensor(params.shape_q), tile.head, tile.seq, tile.seq.q_start,
                               tile.row_shift);
    Tensor mK = sequence_rows(params.tma_k.get_tma_tensor(params.shape_k), tile.head_k, tile.seq, tile.seq.k_start);
    Tensor mVt = sequence_cols(params.tma_v.get_tma_tensor(params.shape_vt), tile.head_k, tile.seq, tile.seq.k_start);
    Tensor gQ = local_tile(mQ, Shape<Int<kBlockM>, Int<kHeadDim>>{}, make_coord(tile.m_block, _0{}));  // (kBlockM, kHeadDim)
    Tensor gK = local_tile(mK, Shape<Int<kBlockN>, Int<kHeadDim>>{}, make_coord(_, _0{}));     // (kBlockN, kHeadDim, n)
    Tensor gVt = local_tile(mVt, Shape<Int<kHeadDim>, Int<kBlockN>>{}, make_coord(_0{}, _));   // (kHeadDim, kBlockN, n)

    auto tma_q = params.tma_q.get_slice(_0{});
    auto tma_k = params.tma_k.get_slice(_0{});
    auto tma_v = params.tma_v.get_slice(_0{});
    Tensor tQgQ = tma_q.partition_S(gQ);   // (TMA, TMA_M, TMA_D)
    Tensor tQsQ = tma_q.partition_D(sQ);   // (TMA, TMA_M, TMA_D)
    Tensor tKgK = tma_k.partition_S(gK);   // (TMA, TMA_N, TMA_D, n)
    Tensor tKsK = tma_k.partition_D(sK);   // (TMA, TMA_N, TMA_D, kStages)
    Tensor tVgV = tma_v.partition_S(gVt);  // (TMA, TMA_D, TMA_N, n)
    Tensor tVsV = tma_v.partition_D(sVt);  // (TMA, TMA_D, TMA_N, kStages)

    // Q's buffer is free (the kernel waited for the consumers' last Q·Kᵀ
    // of the tile before).
    auto& barrier_q = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&storage.barrier_q_full);
    barrier_q.arrive_and_expect_tx(Traits::kBytesQ);
    copy(params.tma_q.with(storage.barrier_q_full), tQgQ, tQsQ);
    // In the order the consumers use them: K of the first block visited,
    // then per block K of the next with V of this one (they issue Q·K_jᵀ
    // with P_{j+1}·V_{j+1}), then the last V. Waiting for V's stage (freed
    // only once the block after it is done) then never holds back the next
    // K, whose stage is freed as soon as its S is.
    auto write_v = write;
    auto load_k = [&](int n_block) {
      pipeline_k.producer_acquire(write);
      copy(params.tma_k.with(*pipeline_k.producer_get_barrier(write)), tKgK(_, _, _, n_block),
           tKsK(_, _, _, write.index()));
      ++write;
    };
    auto load_v = [&](int n_block) {
      pipeline_v.producer_acquire(write_v);
      copy(params.tma_v.with(*pipeline_v.producer_get_barrier(write_v)), tVgV(_, _, _, n_block),
           tVsV(_, _, _, write_v.index()));
      ++write_v;
    };
    int n_block = tile.n_block_end - 1;
    load_k(n_block);
    if constexpr (Traits::kUniformTiles) {
      for (; n_block > tile.n_block_begin; --n_block) {
        load_k(n_block - 1);
        load_v(n_block);
      }
    } else {
      // Not unrolled where the tile walk takes registers of its own (the
      // tile counter, the causal order): unrolled, the producer's 24 or 40
      // held several blocks' pipeline states and TMA operands and spilled
      // (ptxas, nvcc 13.0, bf16: d128 260-304 bytes -> 0, d96 340-420 ->
      // 0-20, d192 352-492 -> 0-44, d32 160-188 -> 0). The thread waits on
      // the stages anyway. (The uniform kernels' producers spill nothing
      // unrolled; their SASS stays as measured.)
#pragma unroll 1
      for (; n_block > tile.n_block_begin; --n_block) {
        load_k(n_block - 1);
        load_v(n_block);
      }
    }
    load_v(n_block);
  }

  // A varlen batch's last key block of a sequence is loaded whole: its rows
  // past the sequence's keys (past seqused_k where given) hold the next
  // sequence's keys or unwritten cache slots. Their probabilities are 0,
  // but 0 · Inf and 0 · NaN are NaN, so before the first product with that
  // block's V the consumers zero those rows of its stage, each thread a
  // share, then make the writes visible to wgmma (the async proxy) and wait
  // for each other. Only the first block visited can hold the sequence's
  // end; a fixed-length batch's rows past it are TMA's zero fill. Every
  // consumer thread calls this at the same instruction: the barrier is
  // bar.sync, which requires that (compute-sanitizer's synccheck reported
  // the d64 kernels when warpgroups that skip reached it from skip() and
  // the others from mma()). So where warpgroups skip unseen blocks the
  // kernel calls it once at the tile's start (clear_tile_keys_past_sequence),
  // else mma() does, once the first block's probabilities are set.
  template <MaskKind kMask, class TensorVt>
  CUTE_DEVICE static void clear_keys_past_sequence(TensorVt sVt_stage, typename Traits::PipelineKV& pipeline_v,
                                                   typename Traits::PipelineKV::PipelineState const& read_v,
                                                   FwdTile<kMask, kBlockM, kBlockN> const& tile, int mma_tid) {
    const int n_keys = tile.seq.seqlen_k - (tile.n_block_end - 1) * kBlockN;  // keys of the block
    if (n_keys >= kBlockN) return;
    pipeline_v.consumer_wait(read_v);
    for (int i = mma_tid; i < kHeadDim * (kBlockN - n_keys); i += Traits::kMmaThreads) {
      sVt_stage(i % kHeadDim, n_keys + i / kHeadDim) = Element(0);  // (head dim, key): head dim contiguous
    }
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(Traits::kMmaThreads, Traits::kBarrierConsumers);
  }

  // The above for the tile's first block visited (at `read`), for a varlen
  // tile, by every consumer warpgroup before it skips or computes.
  template <MaskKind kMask, class SharedStorage>
  CUTE_DEVICE static void clear_tile_keys_past_sequence(SharedStorage& storage,
                                                        typename Traits::PipelineKV& pipeline_v,
                                                        typename Traits::PipelineKV::PipelineState const& read,
                                                        FwdTile<kMask, kBlockM, kBlockN> const& tile, int mma_tid) {
    if (!tile.seq.varlen) return;
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, kStages)
    clear_keys_past_sequence(sVt(_, _, read.index()), pipeline_v, read, tile, mma_tid);
  }

  // A consumer warpgroup walks past the first n_skip key blocks the tile
  // visits (last to first) without computing where its rows see none of
  // them, and past all of them where none of its rows exists (at d64 two
  // of the three warpgroups of a causal 1k sequence's first block). It
  // keeps its place in the pipelines, waiting for each stage before
  // releasing it (so that its arrivals count toward the stage's use at
  // hand), and in the turns, and leaves the tensor cores to the others.
  template <class Turns>
  CUTE_DEVICE static void skip(typename Traits::PipelineKV& pipeline_k, typename Traits::PipelineKV& pipeline_v,
                               typename Traits::PipelineKV::PipelineState& read, Turns const& turns, int n_skip) {
    for (int i = 0; i < n_skip; ++i) {
      // V's wait after the turn: the warpgroups that compute need only V of
      // the block before at this turn.
      pipeline_k.consumer_wait(read);
      turns.wait();
      turns.pass();
      pipeline_v.consumer_wait(read);
      pipeline_k.consumer_release(read);
      pipeline_v.consumer_release(read);
      ++read;
    }
  }
  template <MaskKind kMask, class SharedStorage, class Turns>
  CUTE_DEVICE static void walk(SharedStorage& storage, typename Traits::PipelineKV& pipeline_k,
                               typename Traits::PipelineKV& pipeline_v, typename Traits::PipelineKV::PipelineState& read,
                               FwdTile<kMask, kBlockM, kBlockN> const& tile, Turns const& turns) {
    skip(pipeline_k, pipeline_v, read, turns, tile.n_block_end - tile.n_block_begin);
    cutlass::arch::ClusterBarrier::arrive(&storage.barrier_q_empty);
    turns.wait();  // the tile's last turn, mma()'s last product's
    turns.pass_last();
  }

  // The consumers (kMmaThreads, thread index mma_tid): O and the row
  // logsumexps of the tile into acc_o and the returned fragment, over the
  // key blocks [tile.n_block_begin, n_block_end) (the warpgroup's: skip()
  // walked past the tile's others). score_mod: the tile's score modifier
  // (common/score_mod.hpp), which also gives the softmax's scale. With
  // kDropout, params' dropout (common/dropout.hpp) where dropout_p > 0.
  // turns: the consumer warpgroups' turns at issuing their products
  // (ping-pong).
  template <MaskKind kMask, bool kDropout, class SharedStorage, class Turns, class ScoreModT, class AccO>
  CUTE_DEVICE static auto mma(SharedStorage& storage, typename Traits::PipelineKV& pipeline_k,
                              typename Traits::PipelineKV& pipeline_v, typename Traits::PipelineKV::PipelineState& read,
                              FwdTile<kMask, kBlockM, kBlockN> const& tile, int n_block_end, Turns const& turns,
                              ScoreModT const& score_mod, FwdParams const& params, AccO& acc_o, int mma_tid) {
    using ShapeS = Shape<Int<kBlockM>, Int<kBlockN>>;
    Tensor sQ = make_tensor(make_smem_ptr(storage.q.data()), typename Traits::SmemLayoutQ{});    // (kBlockM, kHeadDim)
    Tensor sK = make_tensor(make_smem_ptr(storage.k.data()), typename Traits::SmemLayoutK{});    // (kBlockN, kHeadDim, kStages)
    Tensor sVt = make_tensor(make_smem_ptr(storage.v.data()), typename Traits::SmemLayoutVt{});  // (kHeadDim, kBlockN, kStages)

    typename Traits::TiledMmaQK tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(mma_tid);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(mma_tid);
    Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_D) descriptors
    Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);   // (MMA, MMA_N, MMA_D, kStages) descriptors
    Tensor tOrV = thr_mma_pv.partition_fragment_B(sVt);  // (MMA, MMA_D, MMA_N, kStages) descriptors
    Tensor tScS = thr_mma_qk.partition_C(make_identity_tensor(ShapeS{}));  // (MMA, MMA_M, MMA_N) -> (row, col)

    constexpr int kRowsPerThread = decltype(size<0>(rowcol_layout(acc_o.layout())))::value;
    OnlineSoftmax<kRowsPerThread> softmax(score_mod.score_scale() * float(M_LOG2E));
    clear(acc_o);
    Tensor acc_o_rowcol = rowcol_view(acc_o);  // (rows, head-dim cols)

    // Q is in (the kernel waited for it).

    // P of the block before, as the A operand of O += P·V: ((2, 2, 2), MMA_M, MMA_N)
    Tensor tOrP = make_tensor<Element>(acc_to_rs_operand_a_layout(
        partition_fragment_C(tiled_mma_qk, ShapeS{}).layout()));
    // P of key block n_block from its probabilities acc_s; with dropout on
    // (the tile's first row a multiple of 16: fwd_kernel.hpp's row_shift),
    // the dropped ones zeroed after the row sums took them (they are of the
    // undropped P; the kept ones' 1 / (1 − p) joins O's normalization).
    // The dropout state is made here from params (the seed is one cached
    // load per block): held through the loop, it added up to 28 bytes to
    // d128's spills (ptxas, nvcc 13.0, bf16), made here up to 12. Two
    // Philox rounds per loop iteration, as in the backward: 4-8 bytes less
    // than ten.
    auto set_probabilities = [&](auto const& acc_s, int n_block) {
      convert_fragment_into(acc_s, tOrP);
      if constexpr (kDropout) {
        const Dropout<true> dropout(params, tile.seq.batch);
        if (dropout.enabled()) {
          Tensor tOrP_atoms = make_tensor(tOrP.data(), acc_to_m16n8_atoms_layout(acc_s.layout()));
          Tensor tScS_atoms = make_tensor(tScS.data(), acc_to_m16n8_atoms_layout(tScS.layout()));
          dropout.zero_dropped(tOrP_atoms, dropout.template keep_bits<2>(tScS_atoms, tile.row_begin(),
                                                                         n_block * kBlockN, tile.head));
        }
      }
    };
    // The scores of key block n_block as the softmax takes them: modified
    // (every block), then masked (masked blocks on a boundary only).
    auto modify_and_mask = [&](auto& acc_s, int n_block, auto masked) {
      score_mod.apply(acc_s, tScS, tile.row_begin(), n_block * kBlockN);
      if constexpr (decltype(masked)::value) {
        if (tile.mask.needs_mask(tile.m_block, n_block)) tile.mask.apply(acc_s, tScS, tile.m_block, n_block);
      }
    };

    // The first block visited: S, its mask and its probabilities, with no
    // product of O to wait for. With kRetireProductLate acc_s then holds
    // each step's scores until the next step retires its product (below).
    Tensor acc_s = partition_fragment_C(tiled_mma_qk, ShapeS{});  // (MMA, MMA_M, MMA_N)
    int n_block = n_block_end - 1;
    {
      pipeline_k.consumer_wait(read);
      turns.wait();
      gemm_async<true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read.index()), acc_s);
      turns.pass();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);  // its reads stay after the wait
      pipeline_k.consumer_release(read);
      modify_and_mask(acc_s, n_block, cute::true_type{});
      Tensor scores = rowcol_view(acc_s);  // (rows, block cols)
      softmax.to_probabilities(scores);   // O is zero: nothing to rescale
      set_probabilities(acc_s, n_block);
    }
    typename Traits::PipelineKV::PipelineState read_v = read;  // V of the block P belongs to
    if constexpr (!Traits::kSkipUnseenBlocks) {  // else the kernel cleared them at the tile's start
      if (tile.seq.varlen) clear_keys_past_sequence(sVt(_, _, read_v.index()), pipeline_v, read_v, tile, mma_tid);
    }
    ++read;
    --n_block;

    // A block's P·V retires: its V stage is released, then O is rescaled by
    // the factors of the block whose probabilities acc_s holds and P is set
    // from them (O and P's registers are the product's operands until the
    // product has retired).
    typename decltype(softmax)::RowFactors factors;
    auto retire_product = [&](auto const& acc_s_step, int n_block_s) {
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      warpgroup_fence_operand(tOrP);
      pipeline_v.consumer_release(read_v);
      softmax.rescale(acc_o_rowcol, factors);
      set_probabilities(acc_s_step, n_block_s);
      read_v = read;
      ++read;
    };
    // With kRetireProductLate the product of a step retires at the start of
    // the next one (and before the last block's product) instead of at its
    // end: ptxas places a wait that follows the exponentials above them, so
    // the exponentials would run only once the product was done; the loop's
    // back edge keeps the next step's wait below them.
    bool product_in_flight = false;

    // Each next block: S = Q·Kᵀ issued, then O += P·V of the block before;
    // the exponentials of S run while the tensor cores finish that product,
    // and only the rescale of O waits for it.
    auto step = [&](auto& acc_s_step, int n_block, auto masked) {
      pipeline_k.consumer_wait(read);
      pipeline_v.consumer_wait(read_v);
      turns.wait();
      gemm_async<true>(tiled_mma_qk, tSrQ, tSrK(_, _, _, read.index()), acc_s_step);
      gemm_rs_async(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), acc_o);
      turns.pass();
      warpgroup_wait<1>();  // S (committed first) done; P·V may still run
      warpgroup_fence_operand(acc_s_step);
      pipeline_k.consumer_release(read);
      modify_and_mask(acc_s_step, n_block, masked);
      Tensor scores = rowcol_view(acc_s_step);  // (rows, block cols)
      factors = softmax.to_probabilities(scores);
    };
    auto process_key_block = [&](int n_block, auto masked) {
      if constexpr (Traits::kRetireProductLate) {
        if (product_in_flight) retire_product(acc_s, n_block + 1);  // acc_s: the block before's
        step(acc_s, n_block, masked);
        product_in_flight = true;
      } else {
        // A fragment of the step's own: stepping in the shared acc_s
        // compiled these kernels differently, and d64 causal ran 1-4 %
        // slower from 4k on the H200.
        Tensor acc_s_step = partition_fragment_C(tiled_mma_qk, ShapeS{});  // (MMA, MMA_M, MMA_N)
        step(acc_s_step, n_block, masked);
        retire_product(acc_s_step, n_block);
      }
    };

    // As the SM80 kernel (sm80/fwd_kernel.hpp): the first blocks visited
    // may need the mask, the long middle never does; a window's left edge
    // also masks the last ones visited (one loop, two call sites, there).
    const int n_block_unmasked_end = n_block_end - tile.mask.n_masked_blocks();
    if constexpr (kMask != MaskKind::kLocal) {
      for (; n_block >= tile.n_block_begin && n_block >= n_block_unmasked_end; --n_block) {
        process_key_block(n_block, cute::true_type{});
      }
      for (; n_block >= tile.n_block_begin; --n_block) {
        process_key_block(n_block, cute::false_type{});
      }
    } else {
      const int n_block_unmasked_begin = tile.mask.n_block_left_unmasked_begin(tile.m_block);
      for (; n_block >= tile.n_block_begin; --n_block) {
        if (n_block >= n_block_unmasked_end || n_block < n_block_unmasked_begin) {
          process_key_block(n_block, cute::true_type{});
        } else {
          process_key_block(n_block, cute::false_type{});
        }
      }
    }

    // Every Q·Kᵀ of the tile is done: Q's buffer may take the next tile's.
    cutlass::arch::ClusterBarrier::arrive(&storage.barrier_q_empty);

    // The last block's product.
    if (product_in_flight) retire_product(acc_s, n_block + 1);  // the last block visited
    pipeline_v.consumer_wait(read_v);
    turns.wait();
    gemm_rs_async(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), acc_o);
    turns.pass_last();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc_o);
    pipeline_v.consumer_release(read_v);
    return softmax.finalize(acc_o_rowcol, score_mod.score_scale(),
                            kDropout ? Dropout<kDropout>(params, tile.seq.batch).keep_scale : 1.f);
  }
};

}  // namespace flashtile::sm90
