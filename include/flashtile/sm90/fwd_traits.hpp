// Tile configuration of the SM90 forward (sm90/fwd_kernel.hpp): one producer
// warpgroup that only issues TMA loads, and kBlockM / 64 consumer warpgroups,
// each owning 64 query rows of the tile, that run both products on wgmma:
//   S = Q·Kᵀ   (kBlockM × kBlockN)   both operands in shared memory (SS)
//   O += P·V   (kBlockM × kHeadDim)  P from registers (RS), V in shared memory
// Q, K and V land in 128-byte-swizzled tiles (64-byte where the head dim is
// not a multiple of 64 elements), written by TMA and read by wgmma through
// descriptors; V is read as the MN-major B operand of the second product
// (its rows are keys, the product's K), so nothing is transposed.
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_types.h>
#include <cutlass/pipeline/sm90_pipeline.hpp>

#include <type_traits>

#include "flashtile/sm90/smem_atoms.hpp"

namespace flashtile::sm90 {

using namespace cute;

// Block shapes per head dim: query rows × keys per step, and K/V stages,
// chosen to fit 227 KB of shared memory and 240 registers per consumer
// thread. On the H200 (benchmarks/NOTES.md), at d128 three K/V stages
// (224 KB) ran no faster than two, and FlashAttention-3's tiles without a
// mask, each on one wgmma, lost: d128 at 128 × 176 1-6 %, d192 at
// 128 × 112 0-8 %.
// kUniform: the kernel without a mask on fixed lengths (every tile the same
// work, no tile counter; tile_scheduler.hpp). At d256 it takes 80 keys a
// step: +6-9 % over 64 on the H200 (1k-16k), with no spill at 240
// registers; the masked and varlen kernels keep 64 (80 spilled 4-100 bytes
// more there).
// kLocal: the kernel for a sliding window (MaskKind::kLocal). kDropout: a
// kernel with dropout's code (sm90/fwd_launch.hpp). kModified: one with a
// score modifier (softcap and ALiBi, or a caller's; kDropout implies it).
template <int kHeadDim, bool kUniform = false, bool kLocal = false, bool kDropout = false, bool kModified = false>
struct FwdConfig {
  static constexpr bool kUniformTiles = kUniform;
  // At d64 three consumer warpgroups (192 rows) share each K/V block: the
  // softmax is a larger share of a small head dim's work, and a third
  // warpgroup's exponentials hide behind two others' products. On the
  // H200 (benchmarks/NOTES.md): +9 % at 1k, +21–23 % from 4k without a mask,
  // +4 % causal from 4k, -7 % causal at 1k. (d32 keeps 128 rows: not
  // measured with 192.)
  static constexpr int kBlockM = kHeadDim == 64 ? 192 : 128;
  // d64's window kernels take 96 keys a step: S then holds 48 registers a
  // thread instead of 64, and at 160 registers a consumer they spill
  // nothing (68-208 bytes at 128; ptxas, nvcc 13.0, sm_90a), and a window's
  // edges waste a third less on masked keys. On the H200 (bf16, d64,
  // benchmarks/NOTES.md): windows of 512 and 2048 keys +2-3 %; the causal
  // kernels at 96 lost 1-5 % (1k-16k), so they keep 128 and their 28-96
  // bytes of spills. Its dropout kernels with a mask or varlen take 96
  // too: at 128 dropout's Philox rounds spilled 156-408 bytes, at 96 0-28.
  // So does its uniform kernel with a score modifier: at 128 ptxas (nvcc
  // 13.0) serializes its wgmma for want of registers (C7512), at 96 not.
  static constexpr bool kD64At96Keys =
      kHeadDim == 64 && (kLocal || (kDropout && !kUniform) || (kModified && kUniform));
  static constexpr int kBlockN = kD64At96Keys       ? 96
                                 : kHeadDim <= 128 ? 128
                                 : kHeadDim <= 192 ? 96
                                 : kUniform        ? 80
                                                   : 64;
  static constexpr int kStages = 2;
  // Registers a producer thread keeps beside two consumer warpgroups. The
  // tile walk from the device counter (every kernel but the uniform one)
  // spills 170-510 bytes at 24 (ptxas, nvcc 13.0, sm_90a, d32-d256) and none
  // at 40, where the consumers' 232 hold d256 with 4-40 bytes of spills.
  // Causal forward on the H200, 1k-16k (benchmarks/NOTES.md): d256 +2-8 % at
  // 40 / 232; d128 and d192 within noise, -1 to -3 % at 16k, so they and the
  // uniform kernel keep FlashAttention-3's 24 / 240.
  static constexpr int kProducerRegisters = kHeadDim == 256 && !kUniform ? 40 : 24;
  // Where a consumer waits for a block's P·V (sm90/fwd_mainloop.hpp): at
  // the start of the next step (true), so that the exponentials run under
  // the product, or right after the exponentials (false), where ptxas
  // (nvcc 13.0) hoists the wait above them. On the H200 (bf16, 1k-16k,
  // alternated processes, benchmarks/NOTES.md): d256 +1-8 % with or without
  // a mask; d64 +2-5 % without a mask but -1 to -4 % causal from 4k; d128
  // within the noise without a mask, -1 to -2 % causal. d32, d96 and d192
  // are not measured; they follow d64 and d256.
  static constexpr bool kRetireProductLate = kUniform || kHeadDim > 128;
  // O written through shared memory (stmatrix, then a TMA store of each
  // warpgroup's 64 rows) instead of straight from the accumulators, where
  // its buffer fits beside the K/V stages (FwdTraits::kStoreOThroughSmem:
  // d96 and d128). On the H200 (bf16, benchmarks/NOTES.md): d128 without a
  // mask 0.94 -> 1.01x cuDNN at 1k, +2-3 % from 4k; d64 0 to -3 %, so it
  // keeps the register store. d96 is not measured; it follows d128.
  static constexpr bool kStoreOThroughSmem = kHeadDim > 64;
  // A consumer warpgroup computes only the key blocks its rows see
  // (sm90/fwd_kernel.hpp; FwdMainloop::skip). ptxas (nvcc 13.0): d128's
  // spills unchanged; d64's uniform kernel 0 -> 40 bytes, its masked ones
  // 76-100 -> 112-168; d256's 12-24 -> 48-120 bytes, for at most 6 % of
  // its causal work at 1k (1.5 % at 4k), so d192 and d256 go without. On
  // the H200 (bf16, with the causal row shift): d64 causal +11 % at 1k,
  // +3 % at 4k; d64 without a mask -9 to -10 % at every length, so the
  // uniform kernels go without too.
  static constexpr bool kSkipUnseenBlocks = !kUniform && kHeadDim <= 128;
};

template <int kHeadDim_, class Element_, class Config_ = FwdConfig<kHeadDim_>>
struct FwdTraits {
  using Element = Element_;
  static_assert(std::is_same_v<Element, cutlass::half_t> || std::is_same_v<Element, cutlass::bfloat16_t>);
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = Config_::kBlockM;
  static constexpr int kBlockN = Config_::kBlockN;
  static constexpr int kStages = Config_::kStages;
  static constexpr bool kRetireProductLate = Config_::kRetireProductLate;
  static constexpr bool kSkipUnseenBlocks = Config_::kSkipUnseenBlocks;
  // Where warpgroups skip, the consumers wait for the first block's V before
  // its Q·Kᵀ (FwdMainloop::clear_tile_keys_past_sequence); the producer loads
  // the next K before that V, so a single stage would wait on itself.
  static_assert(!kSkipUnseenBlocks || kStages >= 2);
  static constexpr bool kUniformTiles = Config_::kUniformTiles;  // FwdConfig's kUniform
  static constexpr int kMmaWarpgroups = kBlockM / 64;  // wgmma's M is 64 rows per warpgroup
  static constexpr int kMmaThreads = 128 * kMmaWarpgroups;
  static constexpr int kNThreads = 128 + kMmaThreads;  // the producer warpgroup first
  // Named barriers (after CUTLASS's reserved ones): the consumer
  // warpgroups' turns take one each (sm90/warpgroup_turns.hpp), a sync of
  // every consumer thread the next.
  static constexpr uint32_t kBarrierConsumers = kMmaWarpgroups;
  // One per consumer warpgroup from here: its threads' epilogue syncs
  // (sm90/fwd_epilogue.hpp).
  static constexpr uint32_t kBarrierEpilogue = kBarrierConsumers + 1;
  static_assert(kBlockM % 64 == 0 && kBlockN % 16 == 0 && kHeadDim % 16 == 0);

  // Registers per thread after setmaxnreg: the producer needs few, the
  // consumers hold S, P and O. 128 · (24 + 2 · 240) and 128 · (32 + 3 · 160)
  // fit the 64K-register file at one CTA per SM (FlashAttention-3's splits);
  // 128 · (40 + 2 · 232) as well (FwdConfig).
  static constexpr int kProducerRegisters = kMmaWarpgroups == 3 ? 32 : Config_::kProducerRegisters;
  static constexpr int kMmaRegisters = kMmaWarpgroups == 3 ? 160 : 240 - (kProducerRegisters - 24) / 2;
  // setmaxnreg moves registers within the CTA's launch allocation (168 or
  // 128 a thread at one CTA per SM): what the producer gives back, the
  // consumers take, exactly (a shortfall hangs the kernel).
  static_assert(128 * kProducerRegisters + kMmaThreads * kMmaRegisters == 128 * (24 + 2 * 240) ||
                128 * kProducerRegisters + kMmaThreads * kMmaRegisters == 128 * (32 + 3 * 160));

  using MmaWarpgroups = Layout<Shape<Int<kMmaWarpgroups>, _1, _1>>;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), MmaWarpgroups{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      MmaWarpgroups{}));
  // One wgmma spans the key block. CuTe's selector offers N other than 8,
  // 16, 32, 64, 96, 128, 192 and 256 (80: d256's uniform tile) only where
  // CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is defined before its headers
  // (kernels/generate.py writes it into the d256 files; it costs those files
  // ~20 s of compile time each). Without it the selector splits Sᵀ into
  // 64 × 16 products, each reading Q's tile from shared memory again:
  // 0.76-0.85× on the H200.
  static_assert(size<1>(typename TiledMmaQK::AtomShape_MNK{}) == kBlockN,
                "this tile needs CuTe's extended wgmma shapes: define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED "
                "before including any CuTe header");

  // The widest swizzle whose atom row the contiguous extent holds whole.
  template <int kContiguous>
  using AtomK = GmmaAtomK<Element, kContiguous>;
  template <int kContiguous>
  using AtomMN = GmmaAtomMN<Element, kContiguous>;
  using SmemLayoutQ = decltype(tile_to_shape(AtomK<kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK =
      decltype(tile_to_shape(AtomK<kHeadDim>{}, Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V as the second product's B operand: (kHeadDim, kBlockN), head dim
  // contiguous (MN-major), the atom tiled along the head dim first.
  using SmemLayoutVt = decltype(tile_to_shape(AtomMN<kHeadDim>{}, Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{},
                                              Step<_2, _1, _3>{}));
  using SmemLayoutKStage = decltype(SmemLayoutK{}(_, _, _0{}));    // one stage: TMA's box
  using SmemLayoutVtStage = decltype(SmemLayoutVt{}(_, _, _0{}));

  // O on its way out, one (64, kHeadDim) slab per consumer warpgroup
  // (each warpgroup stores its own rows): (64, kHeadDim, kMmaWarpgroups).
  using SmemLayoutO = decltype(tile_to_shape(AtomK<kHeadDim>{}, Shape<_64, Int<kHeadDim>, Int<kMmaWarpgroups>>{}));
  using SmemLayoutOWarpgroup = decltype(SmemLayoutO{}(_, _, _0{}));  // one slab: TMA's box

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;

  // TMA writes whole boxes, out-of-bounds rows as zeros, so each stage's
  // transaction is the full tile.
  static constexpr uint32_t kBytesQ = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kBytesKV = kBlockN * kHeadDim * sizeof(Element);

  struct NoBuffer {};
  template <bool kWithO>
  struct SharedStorageOf {
    // 1024-byte alignment: the period of the 128-byte swizzle, which TMA
    // and wgmma assume of a tile's base address.
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutQ>> q;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutK>> k;
    alignas(1024) cute::array_aligned<Element, cosize_v<SmemLayoutVt>> v;
    alignas(16) typename PipelineKV::SharedStorage pipeline_k;
    typename PipelineKV::SharedStorage pipeline_v;
    // Q's buffer and the tile it holds: the producer writes the index, then
    // completes barrier_q_full (with Q's bytes, or without a load for a tile
    // with nothing to load and for the end, an index past num_tiles); the
    // consumers read both, then arrive on barrier_q_empty once done with Q.
    uint64_t barrier_q_full;   // a transaction barrier: Q's TMA load
    uint64_t barrier_q_empty;  // the consumers are done reading Q
    int tile_index;
    // Last, so that the members above lie where they do without it.
    alignas(kWithO ? 1024 : 1) std::conditional_t<kWithO, cute::array_aligned<Element, cosize_v<SmemLayoutO>>,
                                                  NoBuffer> o;
  };
  // O goes through shared memory where the config asks and its buffer fits
  // (not at d192 and d256, whose K/V stages leave too little).
  static constexpr bool kStoreOThroughSmem =
      Config_::kStoreOThroughSmem && sizeof(SharedStorageOf<true>) <= 227 * 1024;
  using SharedStorage = SharedStorageOf<kStoreOThroughSmem>;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= 227 * 1024, "sm90 gives a block at most 227 KB of shared memory");
};

}  // namespace flashtile::sm90
