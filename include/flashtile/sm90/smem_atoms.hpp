// The swizzle atoms of the wgmma kernels' shared-memory tiles. For a tile
// whose contiguous extent is kContiguous 16-bit elements: the widest of
// CuTe's GMMA atoms (128-, 64- or 32-byte rows, 8 rows) whose row that
// extent holds whole. A product that reads a column slice of a tile (a
// warpgroup's share of the head dim) needs the slice to start on an atom,
// so such tiles take the atom of the slice's width rather than the tile's.
#pragma once

#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include <type_traits>

namespace flashtile::sm90 {

template <class Element, int kContiguous>
using GmmaAtomK = std::conditional_t<
    kContiguous % 64 == 0, cute::GMMA::Layout_K_SW128_Atom<Element>,
    std::conditional_t<kContiguous % 32 == 0, cute::GMMA::Layout_K_SW64_Atom<Element>,
                       cute::GMMA::Layout_K_SW32_Atom<Element>>>;

template <class Element, int kContiguous>
using GmmaAtomMN = std::conditional_t<
    kContiguous % 64 == 0, cute::GMMA::Layout_MN_SW128_Atom<Element>,
    std::conditional_t<kContiguous % 32 == 0, cute::GMMA::Layout_MN_SW64_Atom<Element>,
                       cute::GMMA::Layout_MN_SW32_Atom<Element>>>;

}  // namespace flashtile::sm90
