// Which (query block, head, batch) tiles an SM90 forward CTA computes: tiles
// blockIdx.x, blockIdx.x + gridDim.x, ... of one linear order, in which the
// query block varies fastest, then the head, then the batch, so that the
// CTAs running together work on the same one or few heads, whose K and V
// stay in L2. Under a causal mask each head's query blocks come last first:
// the longest tiles (they see the most keys) first, the short ones filling
// the end.
//
// Where every tile is the same work (no mask, fixed lengths) the grid is
// persistent, one CTA per SM: a CTA's next tile starts loading while its
// last one is being written out, and the per-CTA setup (barriers,
// descriptors) is paid once per SM. On the H200, d128 non-causal: 355 ->
// 406 TFLOP/s at 512 tokens, 450 -> 473 at 1k, unchanged from 4k up. Where
// tiles differ (causal, windows, varlen), a static round-robin left SMs idle
// (d128 causal 16k: 553 -> 407), so there each CTA takes one tile and the
// hardware's block scheduler hands out the next as an SM frees up.
#pragma once

#include <cute/config.hpp>
#include <cuda_runtime_api.h>

#include "flashtile/params.hpp"

namespace flashtile::sm90 {

struct TileCoord {
  int m_block;
  int head;
  int batch;
};

struct TileScheduler {
  int m_blocks;  // query blocks per (batch, head): of max_seqlen_q when varlen
  int nheads;
  int num_tiles;

  template <int kBlockM>
  static TileScheduler make(FwdParams const& params) {
    const int m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
    return {m_blocks, params.nheads, m_blocks * params.nheads * params.batch};
  }

  // persistent: one CTA per SM, at most one per tile (sm_count 0, unknown:
  // one per tile); otherwise one per tile.
  dim3 grid(bool persistent, int sm_count) const {
    return dim3(persistent && sm_count > 0 && sm_count < num_tiles ? sm_count : num_tiles);
  }

  template <bool kLongestFirst>
  CUTE_DEVICE TileCoord tile(int index) const {
    const int m = index % m_blocks;
    const int head_batch = index / m_blocks;
    return {kLongestFirst ? m_blocks - 1 - m : m, head_batch % nheads, head_batch / nheads};
  }
};

}  // namespace flashtile::sm90
