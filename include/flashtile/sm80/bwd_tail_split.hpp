// The main backward kernel's split tail. Without a mask every CTA of the
// main kernel does the same work (one key block, every query block), so the
// grid runs in whole waves of SMs × CTAs-per-SM, and a last, partial wave
// keeps the GPU as long as a full one with most SMs idle. On the H200 that
// cost 2.2–3.3 % at head dim 96's benchmark shapes (2688 CTAs: 20.36 waves
// of 132), against grids of whole waves (benchmarks/NOTES.md, "The main
// kernel's last wave").
//
// When that last wave holds at most half the slots, each of its key blocks
// is split into `parts` CTAs (two) along its query blocks (the walk's
// iterations): the tail then takes half a wave. A split CTA adds its partial dK
// and dV (fp32, unscaled, in the dK/dV product's register order) into the
// workspace's tail accumulator with atomics, and bwd_convert_dkv_tail_kernel
// (at the end of this file) writes them out after the main kernel. Only the
// plain, fixed-length, mask-free kernels with dQ atomics split; causal and
// local CTAs differ in length and are scheduled longest-first instead
// (common/bwd_schedule.hpp).
#pragma once

#include <cute/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "flashtile/common/bwd_schedule.hpp"
#include "flashtile/common/bwd_tile.hpp"
#include "flashtile/common/mask.hpp"
#include "flashtile/common/seqlen.hpp"
#include "flashtile/params.hpp"
#include "flashtile/workspace.hpp"

namespace flashtile::sm80 {

using namespace cute;

// The kernels whose CTAs are all alike, so whose grid can split its tail:
// no mask and no score modifiers. The main kernel adds its own terms
// (fixed-length, dQ atomics), the launcher its own (the SM80 kernel, not
// the deterministic mode, not a varlen batch); neither splits otherwise.
template <MaskKind kMask, bool kScoreMod>
constexpr bool kBwdTailSplittable = kMask == MaskKind::kNone && !kScoreMod;

// One split key block's slot in the tail accumulator: its dK, then its dV,
// each (kBlockN · kHeadDim) fp32 in the dK/dV product's register order.
template <int kBlockN, int kHeadDim>
constexpr int kBwdTailSlotFloats = 2 * kBlockN * kHeadDim;

// At most this many CTAs per split key block (each adds 2 · kBlockN ·
// kHeadDim fp32 atomics and loads K and V once more). Two, so that a split
// block's dK and dV are 0 + a + b, the same bits in either order: the
// default backward then keeps dK and dV bitwise repeatable, as flash_attn's
// does and its test suite checks (test_flash_attn_race_condition); with three
// or more parts the order of the adds would show in the last bits. The
// measured case (d96, 48 blocks left of 132) splits in two anyway.
constexpr int kBwdTailMaxParts = 2;

// Grid blocks [0, first_task) are one key block (task) each; the blocks
// from first_task on are `parts` CTAs per key block, task first_task + j /
// parts taking part j % parts. No split: parts == 1 and first_task the task
// count.
struct BwdTailSplit {
  float* dkv_accum = nullptr;  // slot t − first_task of each split key block t (kBwdTailSlotFloats)
  int first_task = 0;
  int parts = 1;

  CUTE_HOST_DEVICE int grid_blocks(int tasks) const { return first_task + (tasks - first_task) * parts; }
  CUTE_HOST_DEVICE bool is_split() const { return parts > 1; }
  // Split key block `task`'s slot.
  template <int kBlockN, int kHeadDim>
  CUTE_HOST_DEVICE float* slot(int task) const {
    return dkv_accum + int64_t(task - first_task) * kBwdTailSlotFloats<kBlockN, kHeadDim>;
  }
  // The bytes of every slot of a grid of `tasks` key blocks: the range the
  // split CTAs add into, zeroed before the main kernel.
  template <int kBlockN, int kHeadDim>
  size_t slot_bytes(int tasks) const {
    return size_t(tasks - first_task) * kBwdTailSlotFloats<kBlockN, kHeadDim> * sizeof(float);
  }
};

// The split for a grid of `tasks` equal CTAs, of `iterations` query blocks
// each, on `slots` CTAs that run at once; at most `max_tasks` key blocks
// (the workspace's room, bwd_dkv_tail_tasks) are split.
inline BwdTailSplit plan_bwd_tail_split(int tasks, int slots, int iterations, int max_tasks, float* dkv_accum) {
  BwdTailSplit split;
  split.dkv_accum = dkv_accum;
  split.first_task = tasks;
  const int rest = slots > 0 ? tasks % slots : 0;
  if (rest == 0 || 2 * rest > slots || rest > max_tasks) return split;
  int parts = slots / rest;
  if (parts > iterations) parts = iterations;
  if (parts > kBwdTailMaxParts) parts = kBwdTailMaxParts;
  if (parts < 2) return split;
  split.first_task = tasks - rest;
  split.parts = parts;
  return split;
}

// A main-kernel CTA's share of the split: its key block (task) and which
// of `parts` slices of the walk's iterations it runs.
struct BwdTailPart {
  int task;
  int part;
  int parts;

  // A CTA of a kernel that does not split: the whole of key block `block`.
  CUTE_HOST_DEVICE explicit BwdTailPart(int block) : task(block), part(0), parts(1) {}
  CUTE_HOST_DEVICE BwdTailPart(BwdTailSplit const& split, int block) : task(block), part(0), parts(1) {
    if (block >= split.first_task) {
      const int j = block - split.first_task;
      task = split.first_task + j / split.parts;
      part = j % split.parts;
      parts = split.parts;
    }
  }
  // This part's iterations [begin, end) of a key block's `iterations`.
  CUTE_HOST_DEVICE int begin(int iterations) const { return int(int64_t(part) * iterations / parts); }
  CUTE_HOST_DEVICE int end(int iterations) const { return int(int64_t(part + 1) * iterations / parts); }
};

// dk = softmax_scale · Σ dK and dv = Σ dV of each key block the main kernel
// split (fixed-length, bwd_tail_split.hpp), from the tail accumulator, in
// the input dtype with dk's and dv's strides. One CTA per split key block:
// block b is task tail.first_task + b. Each thread reads back the values it
// would hold in the dK/dV product, as the main kernel's unsplit epilogue
// writes them.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNThreads)
    bwd_convert_dkv_tail_kernel(const __grid_constant__ BwdParams params, const BwdTailSplit tail) {
  using Element = typename Traits::Element;
  constexpr int kBlockN = Traits::kBlockN;
  constexpr int kHeadDim = Traits::kHeadDim;
  using ShapeKV = Shape<Int<kBlockN>, Int<kHeadDim>>;
  const int task = tail.first_task + int(blockIdx.x);
  const BwdTileCoord tile = bwd_main_tile_coord(params, task, ceil_div(params.seqlen_k, kBlockN), kHeadDim);
  const int n_block = tile.block_order;
  const int head_k = tile.head % params.nheads_k;
  const int batch = tile.head / params.nheads_k;
  const int tid = threadIdx.x;
  const SeqInfo seq(params, batch, std::false_type{});
  auto [gK, gV, gdK, gdV] = key_block_tiles<kHeadDim, kBlockN, Element>(params, seq, head_k, n_block);
  const int rows_valid = seq.seqlen_k_rows - n_block * kBlockN;
  __shared__ __align__(128) Element smem_stage[kBlockN * kHeadDim];
  Tensor sStage = make_tensor(make_smem_ptr(smem_stage), typename Traits::SmemLayoutKV{});  // (kBlockN, kHeadDim)

  typename Traits::TiledMmadKV mma_dkv;
  Tensor acc = partition_fragment_C(mma_dkv, ShapeKV{});  // (MMA, MMA_N, MMA_D)
  const float* slot = tail.slot<kBlockN, kHeadDim>(task);
  load_tile_accum<Traits::kNThreads>(acc, slot, tid);
  store_tile_staged<Traits>(mma_dkv, acc, sStage, gdK, rows_valid, params.softmax_scale, tid);
  __syncthreads();  // every thread's dK row segments are out of the stage
  load_tile_accum<Traits::kNThreads>(acc, slot + kBlockN * kHeadDim, tid);
  store_tile_staged<Traits>(mma_dkv, acc, sStage, gdV, rows_valid, 1.f, tid);
}

}  // namespace flashtile::sm80
