// Row-guarded tile copies shared by the SM80 kernels and d192's SM90
// backward: a tile's last block of
// rows may run past the sequence, and those rows must be neither read nor
// written (and, in shared memory, zero so they add nothing to a product).
#pragma once

#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

// Copies whole rows of a (CPY, CPY_ROWS, CPY_COLS) partition, zero-filling the
// destination rows at or past rows_valid (their coordinates from `coords`).
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows_or_zero(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                                   Coords const& coords, int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    } else {
      clear(dst(_, m, _));
    }
  }
}

// Copies the rows of a (CPY, CPY_ROWS, CPY_COLS) partition below rows_valid.
template <class TiledCopy, class Src, class Dst, class Coords>
CUTE_DEVICE void copy_rows(TiledCopy const& tiled_copy, Src const& src, Dst&& dst,
                           Coords const& coords, int rows_valid) {
  CUTE_UNROLL
  for (int m = 0; m < size<1>(dst); ++m) {
    if (get<0>(coords(0, m, 0)) < rows_valid) {
      CUTE_UNROLL
      for (int k = 0; k < size<2>(dst); ++k) copy(tiled_copy, src(_, m, k), dst(_, m, k));
    }
  }
}

}  // namespace flashtile
