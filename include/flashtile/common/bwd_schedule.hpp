// Which tile a CTA of a backward kernel's 1-D grid owns. The grid is cut into
// bands of a few heads; inside a band the block index is slowest, so
//   - the CTAs in flight belong to few heads, whose streamed operands (the
//     main kernel's Q, dO and dQ accumulator; the dQ kernel's K and V) stay
//     in L2 while every block of the head reads them, and
//   - causal's longest CTAs (block order 0) of a band start first, so the
//     grid's last wave is not left waiting on a long one.
// Measured on the H200 (benchmarks/NOTES.md, "Backward v3"): with the block
// index slowest over the whole grid, L2's hit rate was 24 % and the main
// kernel pulled 1.85 TB/s from DRAM; with it fastest (FlashAttention-2's
// order, 91 %), causal 4k lost 1.5–3.5 % to its tail.
#pragma once

#include <cute/config.hpp>

#include <cstdint>

namespace flashtile {

// The bytes of streamed operands a band's heads may share in L2 (of the
// H100/H200's 50 MB), leaving room for the band in flight before it.
constexpr int64_t kBwdBandBytes = 16 << 20;

struct BwdTileCoord {
  int block_order;  // 0 = the band's first (causal: longest) block of a head
  int head;         // index over heads × batch, head fastest
};

// blocks_per_head: the grid's blocks for one head; heads: heads × batch;
// head_bytes: the bytes one head streams through L2.
CUTE_HOST_DEVICE BwdTileCoord bwd_tile_coord(int block, int blocks_per_head, int heads, int64_t head_bytes) {
  const int64_t fit = kBwdBandBytes / head_bytes;
  const int band_heads = int(fit < 1 ? 1 : fit > heads ? heads : fit);
  const int first_head = block / (blocks_per_head * band_heads) * band_heads;
  const int heads_here = band_heads < heads - first_head ? band_heads : heads - first_head;
  const int within = block - first_head * blocks_per_head;
  return {within / heads_here, first_head + within % heads_here};
}

// The main kernels' (sm80's and sm90's) tile for grid task `task`, one
// key block of one K/V head: its CTA streams the Q, dO (2 bytes each) and
// fp32 dQ accumulator rows of its K/V head's group of query heads.
template <class Params>
CUTE_HOST_DEVICE BwdTileCoord bwd_main_tile_coord(Params const& params, int task, int blocks_per_head, int head_dim) {
  const int group = params.nheads / params.nheads_k;
  return bwd_tile_coord(task, blocks_per_head, params.nheads_k * params.batch,
                        int64_t(group) * params.seqlen_q * head_dim * (2 + 2 + 4));
}

}  // namespace flashtile
