#!/usr/bin/env python3
"""Where a kernel's warps wait, from Nsight Compute's per-instruction samples.

Reads the SASS page of an ncu report exported as CSV and prints the warp
stall samples by reason and the instructions that collect the most of them,
each with its two main reasons. That is the view that found the backward's
LSE loads, generic stores and spilled descriptors (benchmarks/NOTES.md,
"What ncu showed at d128"): a stall reason names the resource, the
instruction names the line of code.

On the GPU host, one kernel launch profiled in full (profile_call.py
makes the call), then exported:

    ncu --clock-control none --set full --import-source no \\
        --kernel-name regex:bwd_ws_kernel --launch-skip 1 --launch-count 1 \\
        -o bwd python3 benchmarks/profile_call.py --direction bwd --hdim 128
    ncu --import bwd.ncu-rep --page source --print-source sass --csv > bwd_sass.csv

Then anywhere (no GPU needed):

    python3 benchmarks/ncu_stalls.py bwd_sass.csv --top 40
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"


def read_sass_csv(path: str) -> list[dict[str, str]]:
    """The instruction rows of an `ncu --page source --print-source sass --csv` export.

    The export starts with a line naming the kernel, then the header row.
    """
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, row in enumerate(rows) if SAMPLES in row), None)
    if header_at is None:
        raise SystemExit(f"{path}: no '{SAMPLES}' column: not an ncu SASS-page export")
    header = rows[header_at]
    return [dict(zip(header, row)) for row in rows[header_at + 1:] if len(row) == len(header)]


def stall_columns(row: dict[str, str]) -> list[str]:
    """The per-reason sample columns (stall_*, all samples, not the not-issued ones)."""
    return [name for name in row if name.startswith("stall_") and "Not Issued" not in name]


def count(value: str) -> int:
    return int(value) if value.strip().isdigit() else 0


def summarize(rows: list[dict[str, str]], top: int) -> str:
    if not rows:
        return "no instructions"
    reasons = stall_columns(rows[0])
    total = sum(count(row[SAMPLES]) for row in rows)
    if total == 0:
        return "no stall samples (was the report taken with --set full?)"
    by_reason = Counter({reason[len("stall_"):]: sum(count(row[reason]) for row in rows) for reason in reasons})
    lines = [f"{total} samples over {len(rows)} instructions", "", "by reason:"]
    lines += [f"  {reason:20s} {n:9d}  {100 * n / total:5.1f} %" for reason, n in by_reason.most_common() if n]
    lines += ["", f"top {top} instructions (samples, % of all, address, instruction, main reasons):"]
    for row in sorted(rows, key=lambda r: -count(r[SAMPLES]))[:top]:
        n = count(row[SAMPLES])
        per_reason = Counter({reason[len("stall_"):]: count(row[reason]) for reason in reasons})
        main = [f"{reason} {k}" for reason, k in per_reason.most_common(2) if k]
        # Samples no exported reason accounts for (seen on HGMMA issue: the
        # tensor pipe not taking more work), shown when they are most.
        other = n - sum(per_reason.values())
        if other > n // 2:
            main.append(f"other {other}")
        lines.append(f"  {n:8d} {100 * n / total:5.1f} %  {row['Address'][-6:]}  "
                     f"{row['Source'].strip()[:64]:64s}  {', '.join(main)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=30, help="instructions to list")
    args = parser.parse_args(argv)
    print(summarize(read_sass_csv(args.csv), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
