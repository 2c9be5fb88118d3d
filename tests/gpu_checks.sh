#!/usr/bin/env bash
# What a kernel change runs on a GPU before it lands, in one call, against
# the installed flashtile: the suite, a sample of flash_attn's own tests
# (../shared/conformance in this project's workspace; FLASH_ATTN_TESTS names
# its test_flash_attn.py, and without it that part is left out), the
# fuzzer's long tier for a while, and compute-sanitizer over a driver built
# for a few head dims. Logs go to $GPU_CHECKS_OUT (default
# build/gpu-checks), one summary line per part to its summary.txt.
#   tests/gpu_checks.sh                          # every part
#   GPU_CHECKS="suite fuzz" tests/gpu_checks.sh  # some of them
# Knobs: JOBS (pytest and fuzz workers, 14 at most), CONFORMANCE_SAMPLE (keep 1 test
# in N, 100), FUZZ_SECONDS (100), FUZZ_SEED (random), SANITIZER_HEAD_DIMS
# ("64;128"). On the H200 with every head dim built: the suite took 179 s,
# the 1/100 sample 100 s. The conformance sample and the fuzzer run at most
# one worker per 10 GiB of GPU memory (14 on the H200, 7 on an 80 GB H100):
# with 14 workers on the H100, conformance's 100k-token split-KV cases and a
# fuzz case's float64 reference ran out of memory.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${GPU_CHECKS_OUT:-build/gpu-checks}
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"
jobs=${JOBS:-14}
gpu_gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | awk '{print int($1 / 1024)}')
memory_jobs=$(( jobs < gpu_gib / 10 ? jobs : gpu_gib / 10 ))
memory_jobs=$(( memory_jobs > 0 ? memory_jobs : 1 ))
status=0
note() { echo "$1" | tee -a "$summary"; }
last_line() { grep -v '^[[:space:]]*$' "$1" | tail -1; }

for part in ${GPU_CHECKS:-suite conformance fuzz sanitizer}; do
  case $part in
  suite)
    python3 -m pytest -q -n "$jobs" -p no:cacheprovider tests >"$out/suite.log" 2>&1 || status=1
    note "suite: $(last_line "$out/suite.log")"
    ;;
  conformance)
    if [ -z "${FLASH_ATTN_TESTS:-}" ]; then
      note "conformance: left out (FLASH_ATTN_TESTS unset)"
      continue
    fi
    tests_file=$(realpath "$FLASH_ATTN_TESTS")
    (cd /tmp && SUITE_SAMPLE=${CONFORMANCE_SAMPLE:-100} python3 -m pytest -q -n "$memory_jobs" --tb=line -rf \
      -p no:cacheprovider -p flashtile.compat.as_flash_attn -k "not kvcache and not paged_kv" \
      "$tests_file") >"$out/conformance.log" 2>&1 || status=1
    note "conformance (1/${CONFORMANCE_SAMPLE:-100}): $(last_line "$out/conformance.log")"
    ;;
  fuzz)
    seed=${FUZZ_SEED:-$RANDOM}
    python3 tests/fuzz.py --cases 100000 --seed "$seed" --workers "$memory_jobs" --time-limit "${FUZZ_SECONDS:-100}" \
      --summary "$out/fuzz.txt" >"$out/fuzz.log" 2>&1 || status=1
    note "fuzz: $(grep -m1 '^cases:' "$out/fuzz.txt" 2>/dev/null || echo 'no summary')"
    ;;
  sanitizer)
    build=$out/sanitizer-build
    cmake -S . -B "$build" -G Ninja -DFLASHTILE_BUILD_SANITIZER=ON -DFLASHTILE_CUDA_ARCHS="${FLASHTILE_CUDA_ARCHS:-90a}" \
      -DFLASHTILE_INSTALL=OFF -DFLASHTILE_LINEINFO=ON -DFLASHTILE_HEAD_DIMS="${SANITIZER_HEAD_DIMS:-64;128}" \
      -DFLASHTILE_DTYPES=bf16 -DFLASHTILE_VARIANTS=scoremod >"$out/sanitizer-build.log" 2>&1 &&
      cmake --build "$build" --target flashtile_sanitize_kernels >>"$out/sanitizer-build.log" 2>&1
    if [ $? -ne 0 ]; then
      status=1
      note "sanitizer: build failed ($out/sanitizer-build.log)"
      continue
    fi
    SANITIZER_BIN=$build/tests/sanitizer/flashtile_sanitize_kernels SANITIZER_OUT=$out/sanitizer \
      SANITIZER_TOOLS="${SANITIZER_TOOLS:-memcheck racecheck synccheck}" tests/sanitizer/run.sh >/dev/null 2>&1 || status=1
    while read -r line; do note "sanitizer $line"; done < <(grep -v '^#' "$out/sanitizer/summary.txt")
    ;;
  *)
    note "$part: no such part (suite, conformance, fuzz, sanitizer)"
    status=1
    ;;
  esac
done
exit $status
