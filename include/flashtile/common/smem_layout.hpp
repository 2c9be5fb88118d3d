// Shared-memory tile layouts and global <-> shared tiled copies of the SM80
// kernels (and the SM90 backward's cp.async loads and the layouts it
// transposes), for tiles of 2-byte elements whose column count (a head dim or a
// key block) is a multiple of 32.
//
// A tile is built from 8-row swizzle atoms. With a multiple of 64 columns the
// atom is 64 wide (128-byte rows) and Swizzle<3,3,3> XORs a row's 16-byte
// chunk index (3 bits) with its row in the atom; otherwise (head dims 32 and
// 96) it is 32 wide (64-byte rows, two per 128-byte bank line) and
// Swizzle<2,3,3> XORs the chunk index (2 bits) with the row pair. Either way
// both the row-wise 16-byte cp.async stores and the column-wise ldmatrix
// reads of 8 rows hit 8 distinct groups of 4 banks: no bank conflict.
#pragma once

#include <cute/algorithm/copy.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/tensor.hpp>

namespace flashtile {

using namespace cute;

template <int kCols>
inline constexpr int kSmemAtomCols = kCols % 64 == 0 ? 64 : 32;

template <int kCols>
using SmemLayoutAtomFor = decltype(composition(
    Swizzle<kSmemAtomCols<kCols> == 64 ? 3 : 2, 3, 3>{},
    Layout<Shape<_8, Int<kSmemAtomCols<kCols>>>, Stride<Int<kSmemAtomCols<kCols>>, _1>>{}));

// A (kRows, kCols) tile of swizzle atoms, row-major over atoms.
template <int kRows, int kCols>
using SmemLayoutTile = decltype(tile_to_shape(SmemLayoutAtomFor<kCols>{}, Shape<Int<kRows>, Int<kCols>>{}));

// The transpose of a (kRows, kCols) shared-memory layout, as a (kCols, kRows)
// view of the same bytes (for operands that enter a product transposed).
template <class Layout_, int kRows, int kCols>
using TransposedLayout = decltype(composition(Layout_{}, make_layout(Shape<Int<kCols>, Int<kRows>>{}, GenRowMajor{})));

// kNThreads threads moving tiles of kAtomCols-wide swizzle atoms in 16-byte
// vectors: each atom row (32 or 64 columns) is one group of consecutive
// threads, so a warp moves whole contiguous row segments. CopyOp: cp.async
// for loads, a 16-byte register copy for stores.
template <class CopyOp, class Element, int kNThreads, int kAtomCols>
using GmemTiledCopyForAtom = decltype(make_tiled_copy(
    Copy_Atom<CopyOp, Element>{},
    Layout<Shape<Int<kNThreads / (kAtomCols * int(sizeof(Element)) / 16)>, Int<kAtomCols * int(sizeof(Element)) / 16>>,
           Stride<Int<kAtomCols * int(sizeof(Element)) / 16>, _1>>{},
    Layout<Shape<_1, Int<16 / int(sizeof(Element))>>>{}));

// The same for (rows, kCols) tiles of SmemLayoutTile.
template <class CopyOp, class Element, int kNThreads, int kCols>
using GmemTiledCopyFor = GmemTiledCopyForAtom<CopyOp, Element, kNThreads, kSmemAtomCols<kCols>>;

}  // namespace flashtile
