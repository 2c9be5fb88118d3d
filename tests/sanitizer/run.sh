#!/usr/bin/env bash
# compute-sanitizer's four tools over every prebuilt kernel (forward, backward,
# deterministic backward, KV cache) on the small problems of sanitize_kernels.cu. Needs
# a GPU, the CUDA toolkit, CMake, Ninja and CUTLASS (see README). Writes each
# tool's log and a summary to $SANITIZER_OUT (default build-sanitizer/logs).
#   tests/sanitizer/run.sh                      # build for FLASHTILE_CUDA_ARCHS (default 90a), run
#   SANITIZER_BIN=path/to/binary tests/sanitizer/run.sh   # run a binary built elsewhere
#   SANITIZER_TOOLS="memcheck initcheck" tests/sanitizer/run.sh   # some of the tools
#   SANITIZER_ARGS=kvcache tests/sanitizer/run.sh  # the KV-cache kernels only
#   SANITIZER_ARGS=no-dropout tests/sanitizer/run.sh  # no dropout problems (mma.sync kernels on sm90)
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${SANITIZER_BUILD:-build-sanitizer}
out=${SANITIZER_OUT:-$build/logs}
mkdir -p "$out"
bin=${SANITIZER_BIN:-}
if [ -z "$bin" ]; then
  cmake -S . -B "$build" -G Ninja -DFLASHTILE_BUILD_SANITIZER=ON \
    -DFLASHTILE_CUDA_ARCHS="${FLASHTILE_CUDA_ARCHS:-90a}" -DFLASHTILE_INSTALL=OFF -DFLASHTILE_LINEINFO=ON >"$out/build.log" 2>&1 &&
    cmake --build "$build" --target flashtile_sanitize_kernels >>"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; exit 1; }
  bin=$build/tests/sanitizer/flashtile_sanitize_kernels
fi
status=0
summary=$out/summary.txt
{
  echo "# compute-sanitizer over $(basename "$bin"), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null)"
  echo "# $(compute-sanitizer --version 2>/dev/null | tail -1)"
} >"$summary"
for tool in ${SANITIZER_TOOLS:-memcheck racecheck initcheck synccheck}; do
  log=$out/$tool.log
  compute-sanitizer --tool "$tool" --error-exitcode 3 "$bin" ${SANITIZER_ARGS:-} >"$log" 2>&1
  rc=$?
  problems=$(grep -E '^[0-9]+ problems' "$log" | tail -1)
  result=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/^========= //')
  echo "$tool: exit $rc; ${problems:-driver did not finish}; ${result:-no sanitizer summary}" | tee -a "$summary"
  [ "$rc" -eq 0 ] || status=1
done
exit $status
