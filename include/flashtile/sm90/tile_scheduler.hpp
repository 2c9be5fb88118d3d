// Which (query block, head, batch) tile an SM90 forward CTA computes: one
// tile per CTA on a (query blocks, heads, batch) grid, the longest tiles
// first where lengths differ (causal: later query blocks see more keys).
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

struct SingleTileScheduler {
  template <int kBlockM>
  static dim3 grid(FwdParams const& params) {
    return dim3((params.seqlen_q + kBlockM - 1) / kBlockM, params.nheads, params.batch);
  }

  template <bool kLongestFirst>
  CUTE_DEVICE static TileCoord tile() {
    const int m_block = kLongestFirst ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);
    return {m_block, int(blockIdx.y), int(blockIdx.z)};
  }
};

}  // namespace flashtile::sm90
