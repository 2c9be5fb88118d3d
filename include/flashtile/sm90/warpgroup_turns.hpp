// The consumer warpgroups taking turns at issuing their wgmma products
// ("ping-pong", round robin with three): while one issues its products the
// others run their softmax, so the tensor cores see one warpgroup's
// products at a time and each warpgroup's exponentials hide behind the
// others' products.
//
// Warpgroup w waits on a named barrier of its own (256 threads: its 128
// waiting, the previous warpgroup's 128 arriving) and, once its products
// are issued, arrives on the next one's. The last warpgroup arrives on
// warpgroup 0's once at the start, so warpgroup 0 goes first; from there
// the turns go round strictly, and each barrier has at most one arrival
// outstanding. Every warpgroup takes the same number of turns on a tile
// (they share its key blocks), so the last warpgroup's last turn passes to
// no one: every arrival is then waited for, and no barrier is left
// half-arrived at exit.
#pragma once

#include <cute/config.hpp>
#include <cutlass/arch/barrier.h>

namespace flashtile::sm90 {

template <int kWarpgroups>
struct ProductTurns {
  static_assert(kWarpgroups >= 1 && kWarpgroups <= 3, "turns among one to three consumer warpgroups");
  static constexpr bool kEnabled = kWarpgroups > 1;
  static constexpr uint32_t kThreads = 256;
  static constexpr uint32_t kFirstBarrier = 0;  // after CUTLASS's reserved ones (NamedBarrier adds them)
  static constexpr uint32_t kBarriers = kEnabled ? kWarpgroups : 0;  // named barriers taken

  int warpgroup;  // this consumer warpgroup, 0 .. kWarpgroups - 1

  CUTE_DEVICE explicit ProductTurns(int warpgroup_) : warpgroup(warpgroup_) {
    if constexpr (kEnabled) {
      if (warpgroup == kWarpgroups - 1) cutlass::arch::NamedBarrier::arrive(kThreads, kFirstBarrier + 0);
    }
  }

  CUTE_DEVICE void wait() const {
    if constexpr (kEnabled) cutlass::arch::NamedBarrier::sync(kThreads, kFirstBarrier + warpgroup);
  }

  CUTE_DEVICE void pass() const {
    if constexpr (kEnabled) {
      cutlass::arch::NamedBarrier::arrive(kThreads, kFirstBarrier + (warpgroup + 1) % kWarpgroups);
    }
  }

  // The tile's last turn: the last warpgroup's goes to no one (see above).
  CUTE_DEVICE void pass_last() const {
    if constexpr (kEnabled) {
      if (warpgroup != kWarpgroups - 1) pass();
    }
  }
};

}  // namespace flashtile::sm90
