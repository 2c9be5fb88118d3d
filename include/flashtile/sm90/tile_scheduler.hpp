// Which (query block, head, batch) tiles an SM90 forward CTA computes, and
// in what order.
//
// The grid is persistent, at most one CTA per SM, whenever it can be: a
// CTA's next tile starts loading while its last one is being written out,
// and the per-CTA setup (barriers, descriptors) is paid once per SM. On the
// H200, d128 non-causal: 355 -> 406 TFLOP/s at 512 tokens, 450 -> 473 at 1k,
// unchanged from 4k up.
//   - Every tile the same work (no mask, fixed lengths): CTA c takes tiles
//     c, c + gridDim.x, ... (static round-robin).
//   - Tiles that differ (causal, windows, varlen): a static round-robin left
//     SMs idle (d128 causal 16k: 553 -> 407 TFLOP/s), so each CTA takes its
//     next tile from a device counter (FwdParams::tile_counter) as it frees
//     up. Without a counter each such tile is a CTA of its own and the
//     hardware's block scheduler does the same, less the overlap. Against
//     that, d128 causal: 2k 461 -> 515 TFLOP/s, 4k 528 -> 560, 16k 621 ->
//     626; a varlen batch +3 %.
//
// Linear order: the query block varies fastest, then the head, then the
// batch, so the CTAs running together share the K and V of one or a few
// heads in L2. Under a causal mask the longest tiles (the last query blocks,
// which see the most keys) go first and the short ones fill the end: the
// (batch, head) pairs are cut into sections whose K and V fit in part of L2,
// and within a section the order is every pair's last query block, then
// every pair's one before, and so on.
#pragma once

#include <cute/config.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

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
  int section_pairs;  // (batch, head) pairs per section of the causal order
  int* counter;       // the dynamic hand-out's counter, or nullptr: static

  // The L2 share a section's K and V may take (H100 and H200 have 50 MB).
  // 24 MB cost 2 % at d128 causal 16k (three heads' K and V in flight, not
  // one); 8 MB keeps one head there and gains the same from 2k to 4k.
  static constexpr int64_t kSectionBytes = int64_t(8) << 20;

  template <int kBlockM>
  static TileScheduler make(FwdParams const& params, bool uniform_tiles) {
    const int m_blocks = (params.seqlen_q + kBlockM - 1) / kBlockM;
    const int pairs = params.nheads * params.batch;
    const int64_t kv_bytes_per_pair = int64_t(2) * params.seqlen_k * params.head_dim * 2;
    const int64_t section = kSectionBytes / std::max<int64_t>(kv_bytes_per_pair, 1);
    const int section_pairs = int(std::clamp<int64_t>(section, 1, std::max(pairs, 1)));
    return {m_blocks, params.nheads, m_blocks * pairs, section_pairs, uniform_tiles ? nullptr : params.tile_counter};
  }

  // One CTA per SM (at most one per tile) where the tiles are uniform or
  // handed out dynamically; otherwise one per tile. sm_count 0 (unknown):
  // one per tile.
  dim3 grid(bool uniform_tiles, int sm_count) const {
    const bool persistent_grid = uniform_tiles || counter != nullptr;
    return dim3(persistent_grid && sm_count > 0 && sm_count < num_tiles ? sm_count : num_tiles);
  }

  // The tile a CTA takes after `index` (num_tiles or more: none left). The
  // counter counts the tiles handed out past the grid's first wave. Kernels
  // for uniform tiles compile the static order alone: the atomic costs the
  // producer thread registers it does not have (ptxas: ~300 bytes of
  // spills at d128 with 24 registers).
  template <bool kUniformTiles>
  CUTE_DEVICE int next(int index) const {
    if (kUniformTiles || counter == nullptr) return index + int(gridDim.x);
    return int(gridDim.x) + atomicAdd(counter, 1);
  }

  template <bool kLongestFirst>
  CUTE_DEVICE TileCoord tile(int index) const {
    if constexpr (!kLongestFirst) {
      const int m = index % m_blocks;
      const int pair = index / m_blocks;
      return {m, pair % nheads, pair / nheads};
    } else {
      const int section_tiles = m_blocks * section_pairs;
      const int section = index / section_tiles;
      const int first_pair = section * section_pairs;
      const int pairs_here = min(section_pairs, num_tiles / m_blocks - first_pair);
      const int within = index - section * section_tiles;
      const int pair = first_pair + within % pairs_here;
      return {m_blocks - 1 - within / pairs_here, pair % nheads, pair / nheads};
    }
  }
};

}  // namespace flashtile::sm90
