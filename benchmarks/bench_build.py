#!/usr/bin/env python3
"""Build time and size: the wheel built from a clean build directory, once per
arch list, timed on this machine's cores.

    python3 benchmarks/bench_build.py                        # 80;90a (the default) and 90a alone
    python3 benchmarks/bench_build.py --archs 90a --out benchmarks/results/build.csv
    python3 benchmarks/bench_build.py --dry-run              # the commands, nothing built

Each run is `pip wheel --no-build-isolation --no-deps` of this checkout into a
fresh temporary build directory, with CMAKE_BUILD_PARALLEL_LEVEL set to the
cores and no compiler cache (a cache hit would time nothing). The other
FLASHTILE_* variables come from the environment (docs/build.md; unset: every
head dim, dtype and variant), and the head dims and variants a run built are
read back from its CMake cache. Run it where the build's inputs are installed
(the CUDA toolkit, CMake, scikit-build-core, nanobind, the nvidia-cutlass
headers). One row per arch list, columns
archs,head_dims,variants,cores,seconds,so_mb,wheel_mb,commit (MB = 10^6 bytes).
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ["archs", "head_dims", "variants", "cores", "seconds", "so_mb", "wheel_mb", "commit"]
DEFAULT_ARCHS = ["80;90a", "90a"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", nargs="+", default=DEFAULT_ARCHS, metavar="LIST",
                        help=f"FLASHTILE_CUDA_ARCHS values, one build each (default: {' '.join(DEFAULT_ARCHS)})")
    parser.add_argument("--cores", type=int, default=os.cpu_count(), help="parallel compile jobs (default: all)")
    parser.add_argument("--out", type=Path, metavar="CSV", help="write the rows here (default: print only)")
    parser.add_argument("--log-dir", type=Path, help="keep each build's log here (default: discarded)")
    parser.add_argument("--wheel-dir", type=Path, help="keep each built wheel here (default: discarded)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands; build nothing")
    return parser.parse_args(argv)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def build_command(wheel_dir: Path, build_dir: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(wheel_dir),
            str(REPO), "-C", f"build-dir={build_dir}", "-C", "cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=",
            "-C", "cmake.define.CMAKE_CXX_COMPILER_LAUNCHER="]


def cache_value(build_dir: Path, name: str) -> str:
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split("=", 1)[1]
    raise RuntimeError(f"{name} is not in {build_dir / 'CMakeCache.txt'}")


def build_once(archs: str, cores: int, log_dir: Path | None, keep_wheel_dir: Path | None) -> dict[str, str]:
    env = dict(os.environ, FLASHTILE_CUDA_ARCHS=archs, CMAKE_BUILD_PARALLEL_LEVEL=str(cores))
    with tempfile.TemporaryDirectory(prefix="flashtile-build-") as tmp:
        wheel_dir, build_dir = Path(tmp) / "wheel", Path(tmp) / "build"
        log_path = (log_dir or Path(tmp)) / f"build-{archs.replace(';', '_')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        with log_path.open("w") as log:
            result = subprocess.run(build_command(wheel_dir, build_dir), env=env, stdout=log,
                                    stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            tail = "".join(log_path.read_text().splitlines(keepends=True)[-30:])
            raise SystemExit(f"the build for FLASHTILE_CUDA_ARCHS={archs} failed (rc {result.returncode}):\n{tail}")
        (so,) = build_dir.glob("_C*.so")
        (wheel,) = wheel_dir.glob("*.whl")
        if keep_wheel_dir:
            keep_wheel_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, keep_wheel_dir / wheel.name)
        return dict(archs=archs, head_dims=cache_value(build_dir, "FLASHTILE_HEAD_DIMS"),
                    variants=cache_value(build_dir, "FLASHTILE_VARIANTS"), cores=str(cores),
                    seconds=f"{seconds:.0f}", so_mb=f"{so.stat().st_size / 1e6:.1f}",
                    wheel_mb=f"{wheel.stat().st_size / 1e6:.1f}", commit=commit())


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def nvcc_version() -> str:
    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split("release")[1].split(",")[0].strip() for line in out.splitlines() if "release" in line),
                "unknown")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        for archs in args.archs:
            print(f"FLASHTILE_CUDA_ARCHS='{archs}' CMAKE_BUILD_PARALLEL_LEVEL={args.cores} "
                  + shlex.join(build_command(Path("<tmp>/wheel"), Path("<tmp>/build"))))
        return 0
    rows = []
    for archs in args.archs:
        print(f"building FLASHTILE_CUDA_ARCHS={archs} on {args.cores} cores ...", flush=True)
        rows.append(build_once(archs, args.cores, args.log_dir, args.wheel_dir))
        print(",".join(rows[-1][c] for c in COLUMNS), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as f:
            meta = dict(cpu=cpu_model(), nvcc=nvcc_version(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        cmd=shlex.join([Path(sys.executable).name, *sys.argv]))
            f.write("# " + ", ".join(f"{k}={v}" for k, v in meta.items()) + "\n")
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
