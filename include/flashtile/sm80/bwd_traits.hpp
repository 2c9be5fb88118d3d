// Tile configuration of the SM80 backward kernels. The main kernel's CTA owns
// a block of kBlockN keys and walks the query blocks; three TiledMMAs cover
// its five products:
//   SdP: S = Q·Kᵀ and dP = dO·Vᵀ          (kBlockM × kBlockN)
//   dKV: dV += Pᵀ·dO and dK += dSᵀ·Q       (kBlockN × head_dim)
//   dQ:  dQ = dS·K                          (kBlockM × head_dim)
// Operands that enter a product transposed (Pᵀ, dSᵀ, Qᵀ, dOᵀ, Kᵀ) are views of
// the same swizzled shared memory, read with ldmatrix.trans.
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

// Block shapes for the main (dK, dV) kernel per head dim and mask: query
// rows × keys, 8 warps, warps laid out (M × N) as kAtomM* × (8 / kAtomM*) for
// each product. Chosen on the H200 (benchmarks/NOTES.md, "Backward v2" and
// "Backward v3"): d64 at 128 × 128 is 15 % faster than 64 × 128 non-causal
// and 6–10 % causal (1k–16k); its S/dP warps laid out 4 × 2 beat 2 × 4 by
// 0–1 % non-causal and 12–18 % causal (where 2 × 4 spills 20–24 bytes).
// kVInRegs: the dP = dO·Vᵀ product takes V from registers, loaded once per
// CTA, instead of from shared memory every query block. kRowsInRegs: each
// query block's LSE and D rows go from global memory into the registers of
// the threads that use them, instead of through shared memory.
// kDqOwnKernel: dQ by the dQ kernel in every mode (BwdBudgetConfig below).
// kDqChunk: the main kernel's dQ product and atomic adds in chunks of that
// many columns (0: the whole head dim at once).
template <int kHeadDim, bool kIsCausal>
struct BwdConfig;
template <bool kIsCausal>
struct BwdConfig<64, kIsCausal> {
  static constexpr int kBlockM = 128, kBlockN = 128, kNWarps = 8;
  static constexpr int kAtomMSdP = 4, kAtomNdKV = 4, kAtomMdQ = 4;
  static constexpr bool kSingleBufferDo = false;  // see BwdConfig<192>
  static constexpr bool kVInRegs = false;
  static constexpr bool kRowsInRegs = false;
  static constexpr bool kDqOwnKernel = false;
  static constexpr int kDqChunk = 0;
};
template <bool kIsCausal>
struct BwdConfig<128, kIsCausal> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kAtomMSdP = 2, kAtomNdKV = 4, kAtomMdQ = 2;
  static constexpr bool kSingleBufferDo = false;
  static constexpr bool kVInRegs = false;
  static constexpr bool kRowsInRegs = false;
  static constexpr bool kDqOwnKernel = false;
  static constexpr int kDqChunk = 0;
};
// 32: V in registers (16 per thread) measured +1.4–3 % non-causal and +2–3 %
// causal at 1k–16k on the H200; at 96 (48 per thread) it was within ±1 %
// and spilled more, so 96 keeps V in shared memory (benchmarks/NOTES.md,
// "Backward: V in registers").
template <bool kIsCausal>
struct BwdConfig<32, kIsCausal> : BwdConfig<64, kIsCausal> {
  static constexpr bool kVInRegs = true;
};
// 96: as 128, but the dQ product's warps 4 × 2, so its 32-column tile
// divides 96. Without a mask, the S/dP warps 4 × 2 too, dO in one buffer
// and LSE, D in registers: +3.2–3.8 % at 1k–16k on the H200 (+2.3–2.9 %
// without the registers); the same shape costs causal 2–3 %, so causal keeps
// 2 × 4, two dO buffers and the rows in shared memory (benchmarks/NOTES.md,
// "Backward: tile shapes per mask").
template <bool kIsCausal>
struct BwdConfig<96, kIsCausal> {
  static constexpr int kBlockM = 64, kBlockN = 128, kNWarps = 8;
  static constexpr int kAtomMSdP = kIsCausal ? 2 : 4, kAtomNdKV = 4, kAtomMdQ = 4;
  static constexpr bool kSingleBufferDo = !kIsCausal;
  static constexpr bool kVInRegs = false;
  static constexpr bool kRowsInRegs = !kIsCausal;
  static constexpr bool kDqOwnKernel = false;
  static constexpr int kDqChunk = 0;
};
// 192 and 256: the dK and dV accumulators of 64 keys take 96 and 128 floats a
// thread, so keys come in blocks of 64; shared memory is 137 KB (192, one
// dO buffer), 161 KB (192 causal, two) and 209 KB (256) (the H100/H200's
// 227 KB per block; sm80's 163 KB is too little for 256).
template <bool kIsCausal>
struct BwdConfig<192, kIsCausal> {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 8;
  static constexpr int kAtomMSdP = 4, kAtomNdKV = 2, kAtomMdQ = 2;
  // Without a mask, dO in one buffer, loaded after the dV product
  // (bwd_kernel.hpp): 137 instead of 161 KB, 12 instead of 60 bytes of
  // spill, +3 % at 1k–16k on the H200. Causal runs 3 % faster with two
  // (benchmarks/NOTES.md, "Backward: tile shapes per mask").
  static constexpr bool kSingleBufferDo = !kIsCausal;
  static constexpr bool kVInRegs = false;
  static constexpr bool kRowsInRegs = false;
  static constexpr bool kDqOwnKernel = false;
  static constexpr int kDqChunk = 0;
};
// 256 keeps dO double-buffered: single, it ran 6–7 % slower non-causal and
// 2–4 % causal (1k–16k, H200).
template <bool kIsCausal>
struct BwdConfig<256, kIsCausal> : BwdConfig<192, kIsCausal> {
  static constexpr bool kSingleBufferDo = false;
};

// The deterministic mode's dQ kernel (one CTA per query block, walking the
// key blocks with K and V double-buffered): 64 × 64 tiles keep its shared
// memory within sm80's 163 KB. It runs only the S/dP and dQ products;
// kAtomNdKV is there because BwdTraits builds all three TiledMMAs. Of the
// traits' two shared-memory sizes, this kernel uses kSmemDqBytes and the main
// kernel kSmemBytes.
template <int kHeadDim>
struct BwdDqConfig {
  static constexpr int kBlockM = 64, kBlockN = 64, kNWarps = 8;
  // dQ's warps 2 × 4 tile 64 columns, 4 × 2 tile 32 (head dims 32 and 96).
  static constexpr int kAtomMSdP = 2, kAtomNdKV = 4, kAtomMdQ = kHeadDim % 64 == 0 ? 2 : 4;
  static constexpr bool kSingleBufferDo = false;  // the dQ kernel has its own layout
  static constexpr bool kVInRegs = false;          // the dQ kernel streams V
  static constexpr bool kRowsInRegs = false;       // and stages LSE and D in shared memory
  static constexpr bool kDqOwnKernel = true;       // it is that kernel
  static constexpr int kDqChunk = 0;
};

// The tiles for a shared-memory budget (smem_budget.hpp): BwdConfig's and
// BwdDqConfig's where they fit, smaller ones where they do not. Shared memory
// per block in KB, main kernel (no mask / causal) and the dQ kernel:
//   head dim  227 KB (the defaults)     163 KB             99 KB
//   32        114, dQ 32.5              as 227             64 x 128: 65
//   64        162, dQ 56.5              as 227             64 x 128: 97; causal 64 x 64: 65
//   96        116 / 129, dQ 80.5        as 227             128 -> 64 keys: 76 / 89
//   128       161, dQ 104.5             as 227             64 x 64, one dO buffer: 97; dQ 64 x 32: 68.5
//   192       137 / 161, dQ 152.5       as 227             32 x 64, one dO buffer: 92.5; dQ 32 x 32: 74.3
//   256       209, dQ 200.5             32 x 64: 136.5;    32 x 32, 4 warps, one dO buffer: 84.5;
//                                       dQ 64 x 32: 132.5  dQ 32 x 32, 4 warps: 98.3
// Each keeps its head dim's warp layouts where they tile the smaller block.
// Chosen to fit; not yet timed. kDqOwnKernel: dQ always comes from the dQ
// kernel, as in the deterministic mode, instead of atomic adds from the main
// kernel, whose dQ accumulator next to dK and dV spills there: for sm_86
// (nvcc 13.0) up to 840 B at d256, where the main kernel without it spills
// nothing. kDqChunk: at d64, d96 and d128 the
// atomic-dQ kernels spilled 4-32 B for sm_86 with the whole dQ tile at once,
// and 40-108 B at d192; in chunks none do at d128 and d192, and at d64 none
// once causal takes 64 keys a block (its S and dP fragments; 16 B spilled
// with 128). The dQ kernel instead of atomics costs 1.3-1.5x at d192 on the
// H200 (benchmarks/NOTES.md), so d192 takes the chunks.
template <int kHeadDim, bool kIsCausal, SmemBudget kBudget>
struct BwdBudgetConfig : BwdConfig<kHeadDim, kIsCausal> {};
template <bool kIsCausal>
struct BwdBudgetConfig<32, kIsCausal, SmemBudget::k99KB> : BwdConfig<32, kIsCausal> {
  static constexpr int kBlockM = 64;
};
template <bool kIsCausal>
struct BwdBudgetConfig<64, kIsCausal, SmemBudget::k99KB> : BwdConfig<64, kIsCausal> {
  static constexpr int kBlockM = 64;
  static constexpr int kBlockN = kIsCausal ? 64 : 128;
  static constexpr int kDqChunk = 32;
};
template <bool kIsCausal>
struct BwdBudgetConfig<96, kIsCausal, SmemBudget::k99KB> : BwdConfig<96, kIsCausal> {
  static constexpr int kBlockN = 64;
  static constexpr int kDqChunk = 32;
};
template <bool kIsCausal>
struct BwdBudgetConfig<128, kIsCausal, SmemBudget::k99KB> : BwdConfig<128, kIsCausal> {
  static constexpr int kBlockN = 64;
  static constexpr bool kSingleBufferDo = true;
  static constexpr int kDqChunk = 64;
};
template <bool kIsCausal>
struct BwdBudgetConfig<192, kIsCausal, SmemBudget::k99KB> : BwdConfig<192, kIsCausal> {
  static constexpr int kBlockM = 32;
  static constexpr int kAtomMSdP = 2;
  static constexpr bool kSingleBufferDo = true;
  static constexpr int kDqChunk = 64;
};
template <bool kIsCausal>
struct BwdBudgetConfig<256, kIsCausal, SmemBudget::k163KB> : BwdConfig<256, kIsCausal> {
  static constexpr int kBlockM = 32;
  static constexpr int kAtomMSdP = 2;
};
template <bool kIsCausal>
struct BwdBudgetConfig<256, kIsCausal, SmemBudget::k99KB> {
  static constexpr int kBlockM = 32, kBlockN = 32, kNWarps = 4;
  static constexpr int kAtomMSdP = 2, kAtomNdKV = 2, kAtomMdQ = 2;
  static constexpr bool kSingleBufferDo = true;
  static constexpr bool kVInRegs = false;
  static constexpr bool kRowsInRegs = false;
  static constexpr bool kDqOwnKernel = true;
  static constexpr int kDqChunk = 0;
};

template <int kHeadDim, SmemBudget kBudget>
struct BwdDqBudgetConfig : BwdDqConfig<kHeadDim> {};
template <>
struct BwdDqBudgetConfig<128, SmemBudget::k99KB> : BwdDqConfig<128> {
  static constexpr int kBlockN = 32;
  static constexpr int kAtomMSdP = 4, kAtomNdKV = 2;
};
template <int kHeadDim>
struct BwdDqSmallConfig : BwdDqConfig<kHeadDim> {
  static constexpr int kBlockM = 32, kBlockN = 32, kNWarps = 4;
  static constexpr int kAtomMSdP = 2, kAtomNdKV = 2, kAtomMdQ = 2;
};
template <>
struct BwdDqBudgetConfig<192, SmemBudget::k99KB> : BwdDqSmallConfig<192> {};
template <>
struct BwdDqBudgetConfig<256, SmemBudget::k99KB> : BwdDqSmallConfig<256> {};
template <>
struct BwdDqBudgetConfig<256, SmemBudget::k163KB> : BwdDqConfig<256> {
  static constexpr int kBlockN = 32;
  static constexpr int kAtomMSdP = 4, kAtomNdKV = 2;
};

template <int kHeadDim_, class Element_, class Config_>
struct BwdTraits {
  using Config = Config_;
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> ||
                std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Config::kBlockM;
  static constexpr int kBlockN = Config::kBlockN;
  static constexpr int kNWarps = Config::kNWarps;
  static constexpr int kNThreads = kNWarps * 32;
  static_assert(kHeadDim % 32 == 0 && kBlockN % 32 == 0, "swizzle atoms tile whole rows (common/smem_layout.hpp)");

  using MmaAtom = std::conditional_t<std::is_same_v<Element, cutlass::half_t>,
                                     MMA_Atom<SM80_16x8x16_F32F16F16F32_TN>,
                                     MMA_Atom<SM80_16x8x16_F32BF16BF16F32_TN>>;
  template <int kAtomM>
  using TiledMmaFor =
      TiledMMA<MmaAtom, Layout<Shape<Int<kAtomM>, Int<kNWarps / kAtomM>, _1>>,
               Tile<Int<16 * kAtomM>, Int<16 * kNWarps / kAtomM>, _16>>;
  // Each product's warp tile (16·kAtomM rows, 16·kNWarps/kAtomM columns)
  // must divide its operand shape, or the partitions run past the tiles.
  static constexpr bool tiles(int rows, int cols, int atom_m) {
    return rows % (16 * atom_m) == 0 && cols % (16 * kNWarps / atom_m) == 0;
  }
  static_assert(tiles(kBlockM, kBlockN, Config::kAtomMSdP), "S, dP: (kBlockM, kBlockN)");
  static_assert(tiles(kBlockN, kHeadDim, Config::kAtomNdKV), "dK, dV: (kBlockN, kHeadDim)");
  static_assert(tiles(kBlockM, kHeadDim, Config::kAtomMdQ), "dQ: (kBlockM, kHeadDim)");
  using TiledMmaSdP = TiledMmaFor<Config::kAtomMSdP>;
  using TiledMmadKV = TiledMmaFor<Config::kAtomNdKV>;
  using TiledMmadQ = TiledMmaFor<Config::kAtomMdQ>;

  using SmemLayoutQ = SmemLayoutTile<kBlockM, kHeadDim>;    // Q and dO: (kBlockM, kHeadDim)
  using SmemLayoutKV = SmemLayoutTile<kBlockN, kHeadDim>;   // K and V: (kBlockN, kHeadDim)
  using SmemLayoutPdS = SmemLayoutTile<kBlockM, kBlockN>;   // P and dS: (kBlockM, kBlockN)
  using SmemLayoutQt = TransposedLayout<SmemLayoutQ, kBlockM, kHeadDim>;      // (kHeadDim, kBlockM)
  using SmemLayoutKt = TransposedLayout<SmemLayoutKV, kBlockN, kHeadDim>;     // (kHeadDim, kBlockN)
  using SmemLayoutPdSt = TransposedLayout<SmemLayoutPdS, kBlockM, kBlockN>;   // (kBlockN, kBlockM)

  static constexpr int kSmemQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kSmemKVBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemPdSBytes = kBlockM * kBlockN * sizeof(Element);
  static constexpr int kSmemRowsBytes = kBlockM * int(sizeof(float));  // one LSE or D block
  // Main kernel: Q, dO, LSE and D rows double-buffered (the next query block
  // loads while this one computes; dO single with kSingleBufferDo), K, V, P,
  // dS single.
  static constexpr bool kSingleBufferDo = Config::kSingleBufferDo;
  static constexpr bool kVInRegs = Config::kVInRegs;
  static constexpr bool kRowsInRegs = Config::kRowsInRegs;
  static constexpr bool kDqOwnKernel = Config::kDqOwnKernel;
  static constexpr int kDqChunk = Config::kDqChunk > 0 ? Config::kDqChunk : kHeadDim;
  static_assert(kHeadDim % kDqChunk == 0 && tiles(kBlockM, kDqChunk, Config::kAtomMdQ),
                "dQ's column chunks tile the head dim and its warp tile");
  static constexpr int kSmemBytes = (kSingleBufferDo ? 3 : 4) * kSmemQBytes + 2 * kSmemKVBytes +
                                    2 * kSmemPdSBytes + (kRowsInRegs ? 0 : 4 * kSmemRowsBytes);
  // dQ kernel: Q, dO, LSE, D single, K and V double-buffered, dS.
  static constexpr int kSmemDqBytes =
      2 * kSmemQBytes + 4 * kSmemKVBytes + kSmemPdSBytes + 2 * kSmemRowsBytes;

  using GmemTiledCopy = GmemTiledCopyFor<SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>, Element, kNThreads, kHeadDim>;
  // Shared -> global, 16 bytes per thread (dK, dV and the convert kernel's dQ).
  using GmemTiledCopyStore = GmemTiledCopyFor<UniversalCopy<uint128_t>, Element, kNThreads, kHeadDim>;

  using SmemCopyAtom = Copy_Atom<SM75_U32x4_LDSM_N, Element>;
  using SmemCopyAtomTransposed = Copy_Atom<SM75_U16x8_LDSM_T, Element>;
  using SmemCopyAtomPdS = Copy_Atom<AutoVectorizingCopyWithAssumedAlignment<128>, Element>;
  // One fp32 (LSE or D) per thread, zero-filled past seqlen_q.
  using RowCopyAtom = SM80_CP_ASYNC_CACHEALWAYS_ZFILL<uint32_t>;
};

}  // namespace flashtile::sm80
