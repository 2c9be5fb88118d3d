// The SM90 forward kernel: warpgroup 0 is the producer (TMA loads, its
// registers cut to kProducerRegisters with setmaxnreg), warpgroups 1 ..
// kMmaWarpgroups the consumers (raised to kMmaRegisters), which run the
// mainloop (sm90/fwd_mainloop.hpp) and the epilogue (sm90/fwd_epilogue.hpp)
// on each tile the scheduler (sm90/tile_scheduler.hpp) gives the CTA, the
// producer loading the next tile's Q, K and V while they finish the last.
// ScoreModT modifies the scores: ScoreMod<false> not at all, ScoreMod<true>
// by softcap and ALiBi, or a caller's modifier (common/score_mod.hpp).
// kDropout: with params' dropout (common/dropout.hpp; ScoreMod<true> only,
// sm90/fwd_launch.hpp).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <type_traits>

#include "flashtile/common/mask.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/sm90/fwd_epilogue.hpp"
#include "flashtile/sm90/fwd_mainloop.hpp"
#include "flashtile/sm90/fwd_traits.hpp"
#include "flashtile/sm90/tile_scheduler.hpp"
#include "flashtile/sm90/warpgroup_turns.hpp"

namespace flashtile::sm90 {

using namespace cute;

template <class Traits, class ScoreModT>
struct FwdKernelParams {
  FwdParams fwd;
  typename FwdMainloop<Traits>::Params mainloop;
  TileScheduler scheduler;
  typename ScoreModT::Arguments score_mod;
  typename FwdEpilogue<Traits>::Params epilogue;
};

template <class Traits, MaskKind kMask, bool kVarlen, class ScoreModT, bool kDropout = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    fwd_kernel(const __grid_constant__ FwdKernelParams<Traits, ScoreModT> params) {
  constexpr int kBlockM = Traits::kBlockM;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using Mainloop = FwdMainloop<Traits>;
  using Epilogue = FwdEpilogue<Traits>;
  using PipelineKV = typename Traits::PipelineKV;
  using Tile = FwdTile<kMask, kBlockM, kBlockN>;
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  // wgmma, TMA and setmaxnreg exist on sm90a only; run_fwd launches this
  // kernel nowhere else.
  __trap();
#else
  extern __shared__ __align__(1024) char smem[];
  auto& storage = *reinterpret_cast<typename Traits::SharedStorage*>(smem);
  FwdParams const& p = params.fwd;
  const int warp_group = int(threadIdx.x) / 128;

  // The tile of a linear index, as every thread of the CTA sees it; its
  // key blocks empty when its rows see no key (or, varlen, when it lies
  // past its sequence's rows: no rows at all).
  auto tile_at = [&](int index) {
    const TileCoord coord = params.scheduler.template tile<kMask == MaskKind::kCausal>(index);
    const SeqInfo seq(p, coord.batch, std::bool_constant<kVarlen>{});
    // A causal tile is laid from the sequence's last row up (FwdTile). With
    // dropout the shift keeps to whole 16-row atoms: keep_bits draws by
    // them and needs the tile's first row on one (common/dropout.hpp), so up
    // to 15 rows of the last block lie past the sequence (dropped, as a
    // window's partial last block is).
    const int full_shift = ceil_div(seq.seqlen_q, kBlockM) * kBlockM - seq.seqlen_q;
    const int row_shift = kMask != MaskKind::kCausal ? 0 : kDropout ? full_shift - full_shift % 16 : full_shift;
    const BlockMask<kMask, kBlockM, kBlockN> mask(seq.seqlen_q + row_shift, seq.seqlen_k, p.window_left,
                                                  p.window_right);
    Tile tile{coord.m_block, coord.head, coord.head / (p.nheads / p.nheads_k), seq, row_shift, mask,
              mask.n_block_begin(coord.m_block), mask.n_block_end(coord.m_block)};
    if (kVarlen && coord.m_block * kBlockM >= seq.seqlen_q) tile.n_block_end = tile.n_block_begin;
    return tile;
  };
  auto rows_exist = [](Tile const& tile) { return tile.m_block * kBlockM < tile.seq.seqlen_q; };

  // Barriers: Q's full (the producer's arrival plus Q's bytes) and empty
  // (every consumer thread's arrival once the tile's last Q·Kᵀ is done),
  // and the K and V rings (full: the producer's arrival plus a stage's
  // bytes; empty: every consumer thread's arrival). Initialized by thread
  // 0, made visible to the async proxy (fence_barrier_init, in the
  // pipelines' constructors) and to every thread (__syncthreads) before
  // first use.
  if (threadIdx.x == 0) {
    Mainloop::prefetch_descriptors(params.mainloop);
    Epilogue::prefetch_descriptor(params.epilogue);
    cutlass::arch::ClusterTransactionBarrier::init(&storage.barrier_q_full, 1);
    cutlass::arch::ClusterBarrier::init(&storage.barrier_q_empty, Traits::kMmaThreads);
  }
  typename PipelineKV::Params pipeline_params;
  pipeline_params.transaction_bytes = Traits::kBytesKV;
  pipeline_params.role = warp_group == 0 ? PipelineKV::ThreadCategory::Producer : PipelineKV::ThreadCategory::Consumer;
  pipeline_params.is_leader = threadIdx.x == 0;  // the thread that issues every TMA load
  pipeline_params.num_consumers = Traits::kMmaThreads;
  PipelineKV pipeline_k(storage.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
  PipelineKV pipeline_v(storage.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
  __syncthreads();

  // Every tile the CTA takes, and the end, is one use of Q's barriers: the
  // producer thread (the scheduler's only caller) writes the tile's index
  // next to Q's buffer once the consumers are done with the last tile's Q,
  // then completes barrier_q_full with Q's load, or with an arrival alone
  // for a tile with no keys to visit and for the end (an index past
  // num_tiles).
  auto& barrier_q_full = *reinterpret_cast<cutlass::arch::ClusterTransactionBarrier*>(&storage.barrier_q_full);
  if (warp_group == 0) {
    cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
    if (threadIdx.x == 0) {
      auto write = cutlass::make_producer_start_state<PipelineKV>();
      for (int index = blockIdx.x, q_use = 0;; ++q_use) {
        if (q_use > 0) cutlass::arch::ClusterBarrier::wait(&storage.barrier_q_empty, (q_use - 1) & 1);
        storage.tile_index = index;
        if (index >= params.scheduler.num_tiles) {
          barrier_q_full.arrive();
          break;
        }
        const Tile tile = tile_at(index);
        if (tile.empty()) {
          barrier_q_full.arrive();
        } else {
          Mainloop::template load<kMask>(params.mainloop, storage, pipeline_k, pipeline_v, write, tile);
        }
        // Asked once this tile's last loads are issued, two key blocks before
        // its end: the next Q waits for that end anyway.
        index = params.scheduler.template next<kMask == MaskKind::kNone && !kVarlen>(index);
      }
    }
  } else {
    cutlass::arch::warpgroup_reg_alloc<Traits::kMmaRegisters>();
    const int mma_tid = int(threadIdx.x) - 128;
    typename PipelineKV::PipelineState read;
    typename Traits::TiledMmaPV tiled_mma_pv;
    for (int q_use = 0;; ++q_use) {
      barrier_q_full.wait(q_use & 1);
      const int index = storage.tile_index;
      if (index >= params.scheduler.num_tiles) {
        Epilogue::finish(params.epilogue, mma_tid);
        break;
      }
      const Tile tile = tile_at(index);
      if (tile.empty()) {
        cutlass::arch::ClusterBarrier::arrive(&storage.barrier_q_empty);  // index read
        if (rows_exist(tile)) Epilogue::store_zero(p, tile, mma_tid);
        continue;
      }
      const int warpgroup = mma_tid / 128;
      const ProductTurns<Traits::kMmaWarpgroups> turns(warpgroup);
      // The key blocks this warpgroup computes: the tile's, or (where the
      // traits skip unseen blocks) none where it has no rows in the
      // sequence, else those its rows see, at least one (a row that sees no
      // key gets its 0 and −inf from the mainloop).
      int n_block_end = tile.n_block_end;
      if constexpr (Traits::kSkipUnseenBlocks) {
        // Every consumer thread at this one call (fwd_mainloop.hpp's
        // clear_keys_past_sequence says why).
        Mainloop::clear_tile_keys_past_sequence(storage, pipeline_v, read, tile, mma_tid);
        n_block_end = tile.warpgroup_has_rows(warpgroup)
                          ? max(tile.warpgroup_n_block_end(warpgroup), tile.n_block_begin + 1)
                          : tile.n_block_begin;
        if (n_block_end == tile.n_block_begin) {
          Mainloop::walk(storage, pipeline_k, pipeline_v, read, tile, turns);
          continue;
        }
        Mainloop::skip(pipeline_k, pipeline_v, read, turns, tile.n_block_end - n_block_end);
      }
      Tensor acc_o = partition_fragment_C(tiled_mma_pv, Shape<Int<kBlockM>, Int<kHeadDim>>{});  // (MMA, MMA_M, MMA_D)
      const ScoreModT score_mod = ScoreModT::make(params.score_mod, p, tile.seq, tile.head);
      auto lse = Mainloop::template mma<kMask, kDropout>(storage, pipeline_k, pipeline_v, read, tile, n_block_end,
                                                         turns, score_mod, p, acc_o, mma_tid);
      Epilogue::store(params.epilogue, p, storage, tile, acc_o, lse, mma_tid);
    }
  }
#endif
}

}  // namespace flashtile::sm90
