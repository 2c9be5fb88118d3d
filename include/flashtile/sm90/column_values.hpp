// Values per column of a wgmma accumulator (the backward's LSE and D, one
// per query) for the columns a thread holds, read from a row of them in
// shared memory.
//
// In GMMA's accumulator layout lane l of every warp holds columns
// 2·(l mod 4) + 8·j + e (j < kN / 8, e < 2), in rowcol_view's column order
// ni = e + 2·j, so the 8 lanes of equal l mod 4 hold the same kN / 4
// columns. ColumnValues<kN, false> keeps all kN / 4 values in each lane's
// registers. ColumnValues<kN, true> splits them between those 8 lanes:
// lane l keeps kN / 32 of them (the column groups j with j mod 8 = l / 4),
// and each use fetches its value by one shuffle.
// At kN = 128 (the d64 backward) that returns 28 registers a thread, for
// one shuffle per column.
#pragma once

#include <cute/config.hpp>

namespace flashtile::sm90 {

// Column ni of lane `lane` (host and device: tests/cpp/host_checks.cu
// checks it against the wgmma partitions it stands for).
CUTE_HOST_DEVICE constexpr int accumulator_column(int lane, int ni) { return 2 * (lane % 4) + 8 * (ni / 2) + ni % 2; }

template <int kN, bool kSplit>
struct ColumnValues;

template <int kN>
struct ColumnValues<kN, false> {
  static_assert(kN % 8 == 0);
  float values[kN / 4];

  // row: kN floats, 8-byte aligned.
  CUTE_DEVICE void load(const float* row, int lane) {
    CUTE_UNROLL
    for (int j = 0; j < kN / 8; ++j) {
      const float2 pair = *reinterpret_cast<const float2*>(row + accumulator_column(lane, 2 * j));
      values[2 * j] = pair.x;
      values[2 * j + 1] = pair.y;
    }
  }
  CUTE_DEVICE float operator()(int ni) const { return values[ni]; }
};

template <int kN>
struct ColumnValues<kN, true> {
  static_assert(kN % 64 == 0);
  static constexpr int kGroupsPerLane = kN / 64;  // column groups j a lane keeps
  float values[2 * kGroupsPerLane];
  int quad_lane;  // l mod 4: the lanes that hold a column differ in l / 4 only

  // Lane l keeps groups j = l / 4 + 8·g (g < kGroupsPerLane) at values[2·g + e]:
  // for each g the 32 lanes read 64 consecutive floats, without bank conflicts.
  CUTE_HOST_DEVICE static constexpr int held_column(int lane, int index) {
    return accumulator_column(lane, 2 * (lane / 4 + 8 * (index / 2)) + index % 2);
  }
  // Where column ni of lane `lane` is kept: that lane's values[source_index(ni)].
  CUTE_HOST_DEVICE static constexpr int source_lane(int lane, int ni) { return lane % 4 + 4 * (ni / 2 % 8); }
  CUTE_HOST_DEVICE static constexpr int source_index(int ni) { return 2 * (ni / 16) + ni % 2; }

  // row: kN floats, 8-byte aligned.
  CUTE_DEVICE void load(const float* row, int lane) {
    quad_lane = lane % 4;
    CUTE_UNROLL
    for (int g = 0; g < kGroupsPerLane; ++g) {
      const float2 pair = *reinterpret_cast<const float2*>(row + held_column(lane, 2 * g));
      values[2 * g] = pair.x;
      values[2 * g + 1] = pair.y;
    }
  }
  // Every lane of the warp calls it with the same ni (a shuffle).
  CUTE_DEVICE float operator()(int ni) const {
    return __shfl_sync(0xffffffffu, values[source_index(ni)], source_lane(quad_lane, ni));
  }
};

}  // namespace flashtile::sm90
