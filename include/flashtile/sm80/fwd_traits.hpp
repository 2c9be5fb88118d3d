// Tile configuration of the SM80 forward kernel: block shape, warps,
// shared-memory layouts and swizzles, the TiledMMA and every copy atom, all
// as types. FwdConfig maps a head dim and mask to its shape, FwdBudgetConfig
// that shape to one within a shared-memory budget; FwdShortConfig gives the
// plain kernel without a mask a second shape for short key sequences.
#pragma once

#include <cute/algorithm/copy.hpp>
#include <cute/atom/copy_atom.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>

#include <type_traits>

#include "flashtile/common/smem_layout.hpp"
#include "flashtile/smem_budget.hpp"

namespace flashtile::sm80 {

using namespace cute;

// Block shapes per head dim. Each warp owns 16-row slices of the query
// block (split-Q: no cross-warp softmax). Shared memory per CTA:
// (kBlockM + 2·kBlockN) · head_dim · 2 B, e.g. 32 KB (d64), 64 KB (d128);
// d64 and d128 use 4 warps at ~235 and 255 registers a thread, so two CTAs
// share an SM.
// Measured on the H200 (bf16, seqlen 16k, benchmarks/NOTES.md): d64 128×64
// beats FlashAttention-2's 128×128 (329 vs 290 TFLOP/s with the first
// kernel, 333 vs 325 with today's; S needs half the registers, 128×128
// spills); d128 128×64 beats 128×32 (382 vs 358), 64×64 and 8 warps. Short
// key sequences can switch tiles (FwdShortConfig below).
template <int kHeadDim, bool kIsCausal>
struct FwdConfig;
template <bool kIsCausal>
struct FwdConfig<64, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};
template <bool kIsCausal>
struct FwdConfig<128, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};
template <bool kIsCausal>
struct FwdConfig<32, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 4;
};
template <bool kIsCausal>
struct FwdConfig<96, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};
// 192 and 256: 8 warps of 16 rows, so the O accumulator is 96 and 128 floats
// a thread.
template <bool kIsCausal>
struct FwdConfig<192, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8;
};
template <>
struct FwdConfig<256, false> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 8;
};
// Causal 256: 64 × 64 with 4 warps, two CTAs an SM. Against 128 × 64 with 8
// warps (H200, bf16, TFLOP/s at 1k / 4k / 16k): 260 / 297 / 334 vs 239 / 296
// / 357; the short, unequal causal rows leave the 8-warp CTAs' last wave
// half empty at 1k, where FlashAttention-2 (128 × 64) was 246.
template <>
struct FwdConfig<256, true> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 4;
};

// Short key sequences: the plain kernel without a mask switches to this
// tile when seqlen_k <= kMaxSeqlenK (run_fwd). A CTA there walks few key
// blocks, so its fixed costs (the prologue's loads, the epilogue) weigh
// more; a wider key block halves the blocks and their barriers (the
// measured gain; its cause is not profiled). Head dims without a measured
// gain have kMaxSeqlenK = 0.
template <int kHeadDim>
struct FwdShortConfig {
  static constexpr int kMaxSeqlenK = 0;
};
// d64: 128 × 128 (FlashAttention-2's d64 tile; 48 KB of shared memory,
// 255 registers and 120 B of stack for sm_90a with nvcc 13.0) against
// FwdConfig's 128 × 64, H200, bf16, seqlen_q = seqlen_k, batch · seqlen =
// 16k tokens, 32 heads, TFLOP/s, three interleaved runs of
// bench_attention.py (benchmarks/NOTES.md, "The d64 forward at short
// sequences"): 512 258 -> 266, 1k 292 -> 297, 2k 313 -> 313, 4k 326 ->
// 322, 8k 324 -> 316, 16k 333 -> 325. fp16 and seqlen_q != seqlen_k take
// the same switch unmeasured. The softcap/ALiBi/dropout kernels lost 1-9 %
// on it at 1k, 4k and 16k and keep FwdConfig's tile. A varlen batch
// switches on its max_seqlen_k, so a looser bound can change a sequence's
// rounding (not its correctness).
template <>
struct FwdShortConfig<64> {
  static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 4;
  static constexpr int kMaxSeqlenK = 2048;
};

// The tiles for a shared-memory budget, which is also a class of GPU
// (smem_budget.hpp), per variant (kScoreMod: softcap, ALiBi, dropout):
// FwdConfig's where they fit and do not spill there. On 99 KB GPUs they
// fit everywhere but d256 without a mask (128 KB), yet ptxas (nvcc 13.0)
// spills for sm_86 in FwdConfig's kernels at d32 (4 B; 164-216 B with the
// modifiers), d64 (the short 128 x 128 tile 164-184 B; 8-16 B with the
// modifiers), d96 (8 B; 28-96 B), d128 (up to 180 B) and d256 at 64 x 64
// (8-16 B; 8-40 B). Their 99 KB tiles halve the keys a block (the S
// fragment) and, with the modifiers, give each warp 16 rows instead of 32
// (8 warps: half the O fragment); d256 keeps 64 rows on 4 warps, whose O
// fragment is 128 floats a thread whatever the tile, and with the
// modifiers takes 16 keys a block (at 32 it spilled 4-8 B). d128 is
// FlashAttention-2's sm86/sm89 tile. None of them spills for sm_86.
template <int kHeadDim, bool kIsCausal, SmemBudget kBudget, bool kScoreMod = false>
struct FwdBudgetConfig : FwdConfig<kHeadDim, kIsCausal> {};
template <bool kIsCausal, bool kScoreMod>
struct FwdBudgetConfig<32, kIsCausal, SmemBudget::k99KB, kScoreMod> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = 4;
};
template <bool kIsCausal, bool kScoreMod>
struct FwdBudgetConfig<64, kIsCausal, SmemBudget::k99KB, kScoreMod> {
  static constexpr int kBlockM = 128, kBlockN = 64, kNWarps = kScoreMod ? 8 : 4;
};
// (With the modifiers d96 keeps 64 keys: 8 warps copy 64 rows of its
// 32-column swizzle atoms at a time.)
template <bool kIsCausal, bool kScoreMod>
struct FwdBudgetConfig<96, kIsCausal, SmemBudget::k99KB, kScoreMod> {
  static constexpr int kBlockM = 128, kBlockN = kScoreMod ? 64 : 32, kNWarps = kScoreMod ? 8 : 4;
};
template <bool kIsCausal, bool kScoreMod>
struct FwdBudgetConfig<128, kIsCausal, SmemBudget::k99KB, kScoreMod> {
  static constexpr int kBlockM = 128, kBlockN = 32, kNWarps = kScoreMod ? 8 : 4;
};
template <bool kIsCausal, bool kScoreMod>
struct FwdBudgetConfig<256, kIsCausal, SmemBudget::k99KB, kScoreMod> {
  static constexpr int kBlockM = 64, kBlockN = kScoreMod ? 16 : 32, kNWarps = 4;
};

// FwdShortConfig's tile runs where it was measured to pay and does not
// spill: not on 99 KB GPUs (d64's 128 x 128 spills 164-184 B for sm_86).
template <int kHeadDim, SmemBudget kBudget>
constexpr bool kFwdShortTile = FwdShortConfig<kHeadDim>::kMaxSeqlenK > 0 && kBudget != SmemBudget::k99KB;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, class Element_>
struct FwdTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0, "swizzle atoms tile whole 32- or 64-column rows");

  // m16n8k16, fp32 accumulate. Warps tile M; the 16-wide N tile lets one
  // ldmatrix.x4 feed two n8 MMAs.
  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  using TiledMma = TiledMMA<MmaAtom, Layout<Shape<Int<kNWarps>, _1, _1>>,
                            Tile<Int<16 * kNWarps>, _16, _16>>;

  // Shared memory: swizzled tiles (common/smem_layout.hpp), conflict-free for the
  // cp.async stores and the ldmatrix reads.
  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim>;   // (kBlockM, kHeadDim)
  using SmemLayoutKV = SmemLayoutTile<kBlockN, kHeadDim>;  // (kBlockN, kHeadDim)
  // Vᵀ as a view of the same bytes, for the P·V product's B operand.
  using SmemLayoutVt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;  // (kHeadDim, kBlockN)
  using SmemLayoutVtNoSwizzle = decltype(get_nonswizzle_portion(SmemLayoutVt{}));
  using SmemLayoutO = SmemLayoutQ;  // O is staged in Q's buffer

  static constexpr int kSmemQBytes = cosize_v<SmemLayoutQ> * sizeof(Element);
  static constexpr int kSmemKVBytes = cosize_v<SmemLayoutKV> * sizeof(Element);
  static constexpr int kSmemBytes = kSmemQBytes + 2 * kSmemKVBytes;

  // Global <-> shared: 16-byte vectors, one thread group per swizzle-atom row.
  // CACHEGLOBAL: K/V tiles are re-read by other CTAs through L2, not L1.
  using GmemTiledCopyQKV = GmemTiledCopyFor<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element, kNThreads, kHeadDim>;
  using GmemTiledCopyO = GmemTiledCopyFor<UniversalCopy<uint128_t>, Element, kNThreads, kHeadDim>;

  // Shared -> registers: ldmatrix (transposed for Vᵀ); registers -> shared for O.
  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomO = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
};

template <int kHeadDim, bool kIsCausal, class Element, SmemBudget kBudget = SmemBudget::k227KB,
          bool kScoreMod = false>
using FwdTraitsFor = FwdTraits<kHeadDim, FwdBudgetConfig<kHeadDim, kIsCausal, kBudget, kScoreMod>::kBlockM,
                               FwdBudgetConfig<kHeadDim, kIsCausal, kBudget, kScoreMod>::kBlockN,
                               FwdBudgetConfig<kHeadDim, kIsCausal, kBudget, kScoreMod>::kNWarps, Element>;
template <int kHeadDim, class Element>
using FwdShortTraitsFor = FwdTraits<kHeadDim, FwdShortConfig<kHeadDim>::kBlockM, FwdShortConfig<kHeadDim>::kBlockN,
                                    FwdShortConfig<kHeadDim>::kNWarps, Element>;

}  // namespace flashtile::sm80
