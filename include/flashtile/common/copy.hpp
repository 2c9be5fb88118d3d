// Row-guarded tile copies shared by the SM80 kernels and d192's SM90
// backward: a tile's last block of
// rows may run past the sequence, and those rows must be neither read nor
// written (and, in shared memory, zero so they add nothing to a product).
#pragma once

#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

// Copies the rows of a (CPY, CPY_ROWS, CPY_COLS) partition below rows_valid
// (their coordinates from `coords`); with kZeroFill also clears the
// destination's other rows.
template <bool kZeroFill, class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows_below(TiledCopy const& tiled_copy, Src const& src, Dst&& dst, Coords const& coords,
                                 int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    } else if constexpr (kZeroFill) {
      clear(dst(_, m, _));
    }
  }
}

// Shared memory's rows past the sequence must be zero (they enter products).
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows_or_zero(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                   Coords const& coords, int rows_valid) {
  copy_rows_below<true>(tiled_copy, src, dst, coords, rows_valid);
}

// Global memory's rows past the sequence belong to others: left alone.
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                           Coords const& coords, int rows_valid) {
  copy_rows_below<false>(tiled_copy, src, dst, coords, rows_valid);
}

}  // namespace flashtile
