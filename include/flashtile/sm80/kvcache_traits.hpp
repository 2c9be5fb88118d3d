// Tile configuration of the KV-cache kernel (sm80/kvcache_kernel.hpp): 16
// packed query rows a CTA, warps that split each key block among them, and
// a cp.async pipeline of key/value blocks deep enough to keep HBM busy.
#pragma once

#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "flashtile/common/smem_layout.hpp"

namespace flashtile::sm80 {

using namespace cute;

// Per head dim: warps, how many warps share a key group (each holding its
// own columns of O), and pipeline stages. Every configuration fits 99 KB of
// shared memory (sm86, sm89, sm120), so one instantiation runs on every
// GPU; a stage is one key block of K and V, 16-32 KB. kDeepStages, where it
// differs, is a deeper pipeline for GPUs with more shared memory, run where
// a CTA streams few key blocks (kvcache_params.hpp, kKvCacheDeepMaxBlocks).
template <int kHeadDim>
struct KvCacheConfig {
  static constexpr int kNWarps = 4, kOSplit = 1,
                       kStages = kHeadDim <= 32 ? 6 : kHeadDim <= 64 ? 4 : kHeadDim <= 96 ? 3 : 2;
  static constexpr int kDeepStages = kHeadDim == 128 ? 3 : kStages;
};
template <>
struct KvCacheConfig<192> {
  static constexpr int kNWarps = 2, kOSplit = 1, kStages = 3, kDeepStages = 3;
};
// d256: a warp holding all of O (128 floats a thread) spilled 24 B for
// sm_86 (nvcc 13.0) however Q, K and V were sliced; two warps a key group,
// each with half of O's columns, spill nothing. Both compute the group's
// scores: decoding waits on memory, not on that product.
template <>
struct KvCacheConfig<256> {
  static constexpr int kNWarps = 4, kOSplit = 2, kStages = 2, kDeepStages = 2;
};

// kStages_: KvCacheConfig's kStages or kDeepStages.
template <int kHeadDim_, class Element_, int kStages_ = KvCacheConfig<kHeadDim_>::kStages>
struct KvCacheTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = KvCacheConfig<kHeadDim>::kNWarps;
  static constexpr int kOSplit = KvCacheConfig<kHeadDim>::kOSplit;
  static constexpr int kStages = kStages_;
  static constexpr bool kDeep = kStages != KvCacheConfig<kHeadDim>::kStages;
  static constexpr int kNThreads = 32 * kNWarps;
  // Warp w takes key group w / kOSplit and O's columns part w % kOSplit.
  static constexpr int kKeyGroups = kNWarps / kOSplit;
  static constexpr int kOCols = kHeadDim / kOSplit;  // a warp's columns of O
  static_assert(kNWarps % kOSplit == 0 && kOCols % 32 == 0);
  // Query rows are (query, head of the KV head's group) pairs, packed; 16 of
  // them are one MMA tile. Decoding (one query, groups of 1-8 heads) fills
  // part of it; memory, not the tensor cores, bounds that case.
  static constexpr int kBlockM = 16;
  static constexpr int kKeysPerWarp = 16;
  static constexpr int kBlockN = kKeysPerWarp * kKeyGroups;
  // Head dims above 128 read Q and K from shared memory a slice at a time
  // each key block instead of holding Q's and a block's K fragments whole:
  // beside the O accumulator (96 and 128 floats a thread) those spilled 56
  // and 276 B for sm_86 (nvcc 13.0). The H200's decode runs d128.
  static constexpr bool kStreamQK = kHeadDim > 128;
  static_assert(kHeadDim % 32 == 0, "swizzle atoms tile whole 32- or 64-column rows");

  // One warp's products: S (16 × 16 keys) = Q·Kᵀ, O (16 × kOCols) += P·V.
  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using WarpMma = TiledMMA<MmaAtom, Layout<Shape<_1, _1, _1>>, Tile<_16, _16, _16>>;

  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim>;   // (kBlockM, kHeadDim)
  using SmemLayoutKV = SmemLayoutTile<kBlockN, kHeadDim>;  // (kBlockN, kHeadDim), one stage
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;  // (kHeadDim, kBlockN)

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;

  // 16-byte chunks: a tile's chunks are numbered row by row and dealt to
  // the threads in turn, so a warp reads contiguous row segments.
  static constexpr int kChunksPerRow = kHeadDim * int(sizeof(Element)) / 16;
  static_assert(kBlockN * kChunksPerRow % kNThreads == 0, "every thread loads as many K/V chunks");
  // How many key blocks before its copy a block's rows are located (their
  // block_table reads issued): one on the shallow pipelines, two on the
  // deep one, whose loads run a block further ahead of the compute, so that
  // pages smaller than a block take it too (kvcache_params.hpp). The
  // second block's rows cost registers: d128's deep kernel 216 -> 217
  // (sm_90a, nvcc 13.0; sm_80 220 either way), but on every pipeline d64
  // 130 -> 159 and d96 168 -> 196, a CTA an SM fewer at d96; one ahead
  // leaves the shallow kernels' code as it was.
  static constexpr int kLocateAhead = kDeep ? 2 : 1;

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * int(sizeof(Element));
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * int(sizeof(Element));  // one stage of K or V
  static constexpr int kSmemPipelineBytes = 2 * kStages * kSmemKVBytes;
  // The epilogue reuses the pipeline's bytes for each key group's
  // unnormalized O, row maxima and row sums (fp32), merged across groups.
  static constexpr int kSmemMergeBytes = kKeyGroups * kBlockM * (kHeadDim + 2) * 4;
  static_assert(kSmemMergeBytes <= kSmemPipelineBytes);
  static constexpr int kSmemBytes = kSmemQBytes + kSmemPipelineBytes;
  static_assert(kDeep || kSmemBytes <= 99 * 1024, "runs on every GPU from sm80 up");
  static_assert(kSmemBytes <= 227 * 1024, "fits an sm90 CTA");
};

}  // namespace flashtile::sm80
