// Which key blocks a query block visits, which of those need masking, and the
// masking itself. Causal is aligned to the bottom-right corner: query row i
// sees key j iff j <= i + seqlen_k - seqlen_q. Every mask also hides the key
// columns past seqlen_k in the last, partial key block.
#pragma once

#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

template <bool kIsCausal, int kBlockM, int kBlockN>
struct BlockMask {
  int seqlen_q;
  int seqlen_k;

  // One past the last key block that query block m_block must visit.
  // Zero or less means no row of this block sees any key.
  CUTE_HOST_DEVICE int n_block_end(int m_block) const {
    const int n_blocks = ceil_div(seqlen_k, kBlockN);
    if constexpr (!kIsCausal) {
      return n_blocks;
    } else {
      const int last_row_end = min((m_block + 1) * kBlockM, seqlen_q);
      const int visible_cols = last_row_end + seqlen_k - seqlen_q;  // of the block's last row
      return min(n_blocks, ceil_div(visible_cols, kBlockN));
    }
  }

  // How many of the last visited key blocks may need masking: a query
  // block's diagonal spans kBlockM columns, so at most ceil(kBlockM/kBlockN)+1
  // key blocks (the +1 when seqlen_k − seqlen_q is not a multiple of kBlockN);
  // without causal, only the partial block at seqlen_k. Every earlier block
  // is fully visible.
  CUTE_HOST_DEVICE static constexpr int n_masked_blocks() {
    return kIsCausal ? ceil_div(kBlockM, kBlockN) + 1 : 1;
  }

  // True when some (row, col) of this tile must be hidden: the tile straddles
  // seqlen_k or, for causal, reaches past the diagonal of its first row.
  CUTE_HOST_DEVICE bool needs_mask(int m_block, int n_block) const {
    const int col_end = (n_block + 1) * kBlockN;
    bool straddles = col_end > seqlen_k;
    if constexpr (kIsCausal) {
      const int first_row_limit = m_block * kBlockM + seqlen_k - seqlen_q;  // last visible col
      straddles = straddles || col_end - 1 > first_row_limit;
    }
    return straddles;
  }

  // The backward's view, from a key block: of the query blocks
  // [m_begin, m_end) that visit key block n_block, those whose tile needs the
  // mask form a prefix (the diagonal comes first; straddling seqlen_k is every
  // block). Returns that prefix's end.
  CUTE_HOST_DEVICE int m_block_mask_end(int n_block, int m_begin, int m_end) const {
    if ((n_block + 1) * kBlockN > seqlen_k) return m_end;
    if constexpr (!kIsCausal) {
      return m_begin;
    } else {
      // needs_mask(m) iff m · kBlockM < last_col − (seqlen_k − seqlen_q).
      const int limit = (n_block + 1) * kBlockN - 1 - (seqlen_k - seqlen_q);
      const int first_unmasked = limit > 0 ? ceil_div(limit, kBlockM) : 0;
      return max(m_begin, min(first_unmasked, m_end));
    }
  }

  // acc_s: this thread's S fragment; coords: the same partition of an
  // identity tensor, giving each element's (row, col) inside the tile.
  template <class Acc, class Coords>
  CUTE_DEVICE void apply(Acc& acc_s, Coords const& coords, int m_block, int n_block) const {
    const int row0 = m_block * kBlockM;
    const int col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int i = 0; i < size(acc_s); ++i) {
      const int row = row0 + get<0>(coords(i));
      const int col = col0 + get<1>(coords(i));
      bool hidden = col >= seqlen_k;
      if constexpr (kIsCausal) hidden = hidden || col > row + seqlen_k - seqlen_q;
      if (hidden) acc_s(i) = -INFINITY;
    }
  }
};

}  // namespace flashtile
