// Which key blocks a query block visits (and which query blocks a key block
// is visited by), which of those tiles need masking, and the masking itself.
// Three kinds, each its own instantiation:
//   none    every key; only the columns past seqlen_k of the last, partial
//           key block are hidden (as in every kind);
//   causal  query row i sees key j iff j <= i + seqlen_k - seqlen_q
//           (aligned to the bottom-right corner);
//   local   a sliding window: i + off - window_left <= j <= i + off +
//           window_right, off = seqlen_k - seqlen_q, a side unbounded when
//           its window is -1 (causal with a left window is local with
//           window_right = 0).
// Key blocks wholly outside a query block's window are never visited.
#pragma once

#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

enum class MaskKind { kNone, kCausal, kLocal };

// Folds causal into the window (causal is window_right = 0, whatever the
// window asked on that side) and picks the kernel kind: no mask, causal
// (window_right = 0 and no left edge), or local. window_* are -1 or more.
CUTE_HOST_DEVICE MaskKind resolve_mask(bool causal, int& window_left, int& window_right) {
  if (causal) window_right = 0;
  if (window_left < 0 && window_right < 0) return MaskKind::kNone;
  if (window_left < 0 && window_right == 0) return MaskKind::kCausal;
  return MaskKind::kLocal;
}

// a / b rounded toward −inf (b > 0).
CUTE_HOST_DEVICE constexpr int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

template <MaskKind kKind, int kBlockM, int kBlockN>
struct BlockMask {
  static constexpr bool kIsCausal = kKind == MaskKind::kCausal;
  static constexpr bool kIsLocal = kKind == MaskKind::kLocal;

  int seqlen_q;
  int seqlen_k;
  int offset;  // seqlen_k − seqlen_q: row i's diagonal is column i + offset
  int left;    // local: window_left, capped at seqlen_q + seqlen_k (beyond any distance; also
  int right;   // when unbounded), so no sum below overflows; right likewise

  // can_implement_* bound seqlen_q and seqlen_k by kMaxSeqlen, so sums of a
  // few of them and of the capped windows stay within int.
  CUTE_HOST_DEVICE BlockMask(int seqlen_q_, int seqlen_k_, int window_left = -1, int window_right = -1)
      : seqlen_q(seqlen_q_),
        seqlen_k(seqlen_k_),
        offset(seqlen_k_ - seqlen_q_),
        left(window_left < 0 || window_left > seqlen_q_ + seqlen_k_ ? seqlen_q_ + seqlen_k_ : window_left),
        right(window_right < 0 || window_right > seqlen_q_ + seqlen_k_ ? seqlen_q_ + seqlen_k_ : window_right) {}

  // ---- The forward's (and the dQ kernel's) view, from a query block ----

  // The first key block that query block m_block must visit.
  CUTE_HOST_DEVICE int n_block_begin(int m_block) const {
    if constexpr (!kIsLocal) {
      return 0;
    } else {
      return max(0, floor_div(m_block * kBlockM + offset - left, kBlockN));  // the first row's left edge
    }
  }

  // One past the last key block that query block m_block must visit. At or
  // below n_block_begin: no row of this block sees any key.
  CUTE_HOST_DEVICE int n_block_end(int m_block) const {
    const int n_blocks = ceil_div(seqlen_k, kBlockN);
    if constexpr (kKind == MaskKind::kNone) {
      return n_blocks;
    } else {
      const int last_row_end = min((m_block + 1) * kBlockM, seqlen_q);
      // Columns the block's last row sees, up to its right edge.
      const int visible_cols = last_row_end + offset + (kIsLocal ? right : 0);
      return min(n_blocks, visible_cols > 0 ? ceil_div(visible_cols, kBlockN) : 0);
    }
  }

  // How many of the last visited key blocks may need masking at the right
  // edge: a query block's diagonal spans kBlockM columns, so at most
  // ceil(kBlockM/kBlockN)+1 key blocks (the +1 when the offset is not a
  // multiple of kBlockN); without causal or a window, only the partial block
  // at seqlen_k. Every earlier block is fully visible on that side.
  CUTE_HOST_DEVICE static constexpr int n_masked_blocks() {
    return kKind == MaskKind::kNone ? 1 : ceil_div(kBlockM, kBlockN) + 1;
  }

  // Local: the first key block that every row of query block m_block sees
  // whole on the left (blocks below it need the mask at the left edge).
  CUTE_HOST_DEVICE int n_block_left_unmasked_begin(int m_block) const {
    if constexpr (!kIsLocal) {
      return 0;
    } else {
      const int last_row_left = (m_block + 1) * kBlockM - 1 + offset - left;
      return last_row_left > 0 ? ceil_div(last_row_left, kBlockN) : 0;
    }
  }

  // True when some (row, col) of this tile must be hidden: the tile straddles
  // seqlen_k, or reaches past the right edge of its first row, or (local)
  // before the left edge of its last row.
  CUTE_HOST_DEVICE bool needs_mask(int m_block, int n_block) const {
    const int col_end = (n_block + 1) * kBlockN;
    bool straddles = col_end > seqlen_k;
    if constexpr (kKind != MaskKind::kNone) {
      const int first_row_right = m_block * kBlockM + offset + (kIsLocal ? right : 0);  // last visible col
      straddles = straddles || col_end - 1 > first_row_right;
    }
    if constexpr (kIsLocal) {
      straddles = straddles || n_block * kBlockN < (m_block + 1) * kBlockM - 1 + offset - left;
    }
    return straddles;
  }

  // ---- The backward's view, from a key block ----

  // The query blocks [m_block_begin, m_block_end) see some key of n_block.
  CUTE_HOST_DEVICE int m_block_begin(int n_block) const {
    if constexpr (kKind == MaskKind::kNone) {
      return 0;
    } else {
      const int m_blocks = ceil_div(seqlen_q, kBlockM);
      // The first row whose right edge reaches the block's first column.
      const int first_row = n_block * kBlockN - offset - (kIsLocal ? right : 0);
      return first_row > 0 ? min(first_row / kBlockM, m_blocks) : 0;
    }
  }
  CUTE_HOST_DEVICE int m_block_end(int n_block) const {
    const int m_blocks = ceil_div(seqlen_q, kBlockM);
    if constexpr (!kIsLocal) {
      return m_blocks;
    } else {
      // The last row whose left edge reaches the block's last column.
      const int last_row = (n_block + 1) * kBlockN - 1 + left - offset;
      return last_row >= 0 ? min(last_row / kBlockM + 1, m_blocks) : 0;
    }
  }

  // Of the query blocks [m_begin, m_end) that visit key block n_block, those
  // whose tile needs the mask at the right edge form a prefix (the diagonal
  // comes first; straddling seqlen_k is every block). Returns that prefix's
  // end.
  CUTE_HOST_DEVICE int m_block_mask_end(int n_block, int m_begin, int m_end) const {
    if ((n_block + 1) * kBlockN > seqlen_k) return m_end;
    if constexpr (kKind == MaskKind::kNone) {
      return m_begin;
    } else {
      // Right edge: needs_mask(m) iff m · kBlockM < last_col − (offset + right).
      const int limit = (n_block + 1) * kBlockN - 1 - offset - (kIsLocal ? right : 0);
      const int first_unmasked = limit > 0 ? ceil_div(limit, kBlockM) : 0;
      return max(m_begin, min(first_unmasked, m_end));
    }
  }

  // Local: those whose tile needs the mask at the left edge form a suffix
  // of [mask_end, m_end) (mask_end from m_block_mask_end). Returns its start.
  CUTE_HOST_DEVICE int m_block_left_mask_begin(int n_block, int mask_end, int m_end) const {
    if constexpr (!kIsLocal) {
      return m_end;
    } else {
      // (m + 1) · kBlockM − 1 + offset − left > n_block · kBlockN
      // iff m >= floor((n_block · kBlockN + left − offset + 1) / kBlockM).
      const int first = floor_div(n_block * kBlockN + left - offset + 1, kBlockM);
      return max(mask_end, min(first, m_end));
    }
  }

  // True when query row `row` does not see key `col` (both in the sequence):
  // apply()'s test, one score at a time (for the testing-only probabilities;
  // apply() keeps its own copy, which the kernels were tuned with).
  CUTE_HOST_DEVICE bool hides(int row, int col) const {
    bool hidden = col >= seqlen_k;
    if constexpr (kIsCausal) hidden = hidden || col > row + offset;
    if constexpr (kIsLocal) hidden = hidden || col > row + offset + right || col < row + offset - left;
    return hidden;
  }

  // hides() for the elements of a thread's fragment, each at an offset
  // (dr, dc) known at compile time from one anchor element (row0, col0):
  // col − row − offset is computed once, at the anchor, and each element
  // compares it with a constant. Computing each element's row and col for
  // hides() kept them all live: 64 coordinates a thread at d64 in the
  // warp-specialized backward, 56-128 bytes of spills there.
  struct Anchored {
    int cols_left;  // seqlen_k − col0: an element is past seqlen_k iff dc >= cols_left
    int diagonal;   // col0 − row0 − offset
    int left;
    int right;
    CUTE_HOST_DEVICE bool hides(int dr, int dc) const {
      const int d = diagonal + (dc - dr);  // col − row − offset
      bool hidden = dc >= cols_left;
      if constexpr (kIsCausal) hidden = hidden || d > 0;
      if constexpr (kIsLocal) hidden = hidden || d > right || d < -left;
      return hidden;
    }
  };
  CUTE_HOST_DEVICE Anchored anchored_at(int row0, int col0) const {
    return {seqlen_k - col0, col0 - row0 - offset, left, right};
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
      if constexpr (kIsCausal) hidden = hidden || col > row + offset;
      if constexpr (kIsLocal) hidden = hidden || col > row + offset + right || col < row + offset - left;
      if (hidden) acc_s(i) = -INFINITY;
    }
  }
};

}  // namespace flashtile
