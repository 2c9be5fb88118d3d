// The deterministic mode's dQ: the key blocks that see a query block add
// their dQ tiles into its fp32 accumulator one after another, last key
// block first, so every element's sum runs in the same order on every run.
//
// Each 64-row query block of the accumulator has a counter (workspace.hpp's
// dQ turns, zeroed with the accumulator): the number of key blocks that have
// added so far. The key blocks whose walks take query block m are
// [BlockMask::n_block_begin(m), BlockMask::n_block_end(m)) without a
// gap (tests/cpp/host_checks.cu checks this against the walk), so key block
// n's turn comes when the counter reads n_block_end(m) − 1 − n. One
// thread waits for it with acquire loads and the consumers meet on a named
// barrier; after their adds they meet again and one thread bumps the
// counter with a release.
//
// Last first, because each key block walks its query blocks in ascending
// order from its own first one (common/bwd_walk.hpp, kAscending), which lies
// further on the higher the key block: the key block above reached query
// block m a few iterations earlier in its walk. In the other order key block
// n would idle until key block 0 had walked up to n's first query block.
//
// Waiting on a higher key block cannot deadlock: the grid puts a head's key
// blocks last first in this mode, and the GPU starts CTAs in grid order (as
// observed; CUDA does not promise it), so that block's CTA is resident or
// done, and it never waits on a lower one.
#pragma once

#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

#include <cstdint>

namespace flashtile::sm90 {

// Returns once *turn reaches my_turn, for all kThreads threads of the barrier;
// the counter's other writers' dQ adds are visible to them then.
template <int kThreads>
CUTE_DEVICE void wait_for_dq_turn(const int* turn, int my_turn, int thread, uint32_t barrier) {
  if (thread == 0) {
    int seen;
    do {
      asm volatile("ld.global.acquire.gpu.b32 %0, [%1];" : "=r"(seen) : "l"(turn) : "memory");
    } while (seen < my_turn);  // not !=: overlapping varlen sequences (bad cu_seqlens) must not hang
  }
  cutlass::arch::NamedBarrier::sync(kThreads, barrier);
}

// After every thread's dQ adds: hands the query block to the next key block.
// The barrier orders the threads' adds before thread 0's release fence, which
// makes them visible before the counter moves.
template <int kThreads>
CUTE_DEVICE void pass_dq_turn(int* turn, int thread, uint32_t barrier) {
  cutlass::arch::NamedBarrier::sync(kThreads, barrier);
  if (thread == 0) {
    asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.s32 [%0], 1;" ::"l"(turn) : "memory");
  }
}

}  // namespace flashtile::sm90
