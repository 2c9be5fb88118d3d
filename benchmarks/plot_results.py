#!/usr/bin/env python3
"""The benchmark results file (<gpu>.csv) and its plot.

    python benchmarks/plot_results.py RESULTS.csv [OUT.png]

redraws the plot from a results file, no GPU needed; OUT defaults to the CSV's
path with a .png suffix. bench_attention.py writes the file through
write_results() and draws it through plot_results(): a row of panels per
direction (fwd, bwd, fwdbwd; whichever the file holds), a column per (hdim,
causal).

The file: one comment line `# gpu=..., torch=..., cuda=..., cudnn=...,
commit=..., date=..., cmd=...` (cmd last: it may hold commas), then a CSV with
COLUMNS, one row per (implementation, case). TFLOP/s count FLOPs the
FlashAttention way (see shared BENCHMARKING.md).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

COLUMNS = (
    "impl", "direction", "dtype", "hdim", "causal", "window_left", "window_right",
    "batch", "nheads", "nheads_k", "seqlen_q", "seqlen_k", "ms", "tflops",
)
_TEXT_COLUMNS = {"impl", "direction", "dtype"}
_FLOAT_COLUMNS = {"ms", "tflops"}

# Plot order and style; impls not listed here still plot, in default colours.
_ATTENTION_STYLE = {
    "flashtile": dict(label="flashtile", color="tab:red", linewidth=2.4, zorder=5),
    "flashtile_deterministic": dict(label="flashtile deterministic", color="tab:red", linestyle="--",
                                    linewidth=1.4, zorder=4),
    "sdpa_flash": dict(label="SDPA flash (FA2)", color="tab:blue"),
    "sdpa_cudnn": dict(label="SDPA cuDNN", color="tab:green"),
    "sdpa_efficient": dict(label="SDPA mem-efficient", color="tab:orange"),
}
_BMM_STYLE = dict(label="cuBLAS bmm, QKᵀ shape", color="black", linestyle="--", linewidth=1.2)
_GEMM_STYLE = dict(color="grey", linestyle=":", linewidth=1.2)
_MATMUL_IMPLS = {"cublas_bmm", "cublas_gemm"}
DIRECTIONS = ("fwd", "bwd", "fwdbwd")  # plot order, top to bottom
_DIRECTION_LABEL = {"fwd": "fwd", "bwd": "bwd", "fwdbwd": "fwd+bwd"}


def format_meta(meta: dict[str, str]) -> str:
    """The comment line for `meta`; its "cmd" entry goes last."""
    items = [f"{key}={value}" for key, value in meta.items() if key != "cmd"]
    if "cmd" in meta:
        items.append(f"cmd={meta['cmd']}")
    return "# " + ", ".join(items)


def parse_meta(line: str) -> dict[str, str]:
    """Inverse of format_meta (a comment line in another form gives {})."""
    body, _, cmd = line.lstrip("#").strip().partition(", cmd=")
    meta = {}
    for item in body.split(", "):
        key, sep, value = item.partition("=")
        if sep:
            meta[key] = value
    if cmd:
        meta["cmd"] = cmd
    return meta


def results_dir() -> Path:
    """Where a benchmark's full run goes by default: $FLASHTILE_RESULTS_DIR,
    else ~/flashtile-results (never the checkout)."""
    return Path(os.environ.get("FLASHTILE_RESULTS_DIR") or Path.home() / "flashtile-results")


def write_table(path: Path, meta: dict[str, str], columns: list[str], rows: list[dict]) -> None:
    """A results CSV of another benchmark's columns: the meta comment line,
    the header, the rows as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write(format_meta(meta) + "\n")
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_results(path: Path, meta: dict[str, str], rows: list[dict]) -> None:
    write_table(path, meta, list(COLUMNS),
                [{**row, "ms": f"{row['ms']:.4f}", "tflops": f"{row['tflops']:.1f}"} for row in rows])


def read_results(path: Path) -> tuple[dict[str, str], list[dict]]:
    """(meta from the first comment line, rows with ints and floats typed)."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    meta = parse_meta(lines[0]) if lines and lines[0].startswith("#") else {}
    rows = []
    for raw in csv.DictReader(line for line in lines if not line.startswith("#")):
        rows.append({
            key: value if key in _TEXT_COLUMNS else float(value) if key in _FLOAT_COLUMNS else int(value)
            for key, value in raw.items()
        })
    return meta, rows


def _seqlen_label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _direction_order(directions) -> list[str]:
    known = [d for d in DIRECTIONS if d in directions]
    return known + sorted(set(directions) - set(known))


def plot_results(rows: list[dict], meta: dict[str, str], path: Path) -> None:
    """TFLOP/s against seqlen: a row of panels per direction (fwd, bwd, fwdbwd),
    a column per (hdim, causal); a line per attention impl, the QKᵀ-shaped bmm
    of the panel's hdim dashed (a forward matmul, drawn in every row as the
    ceiling), the large square GEMM as a dotted horizontal line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    attention = [r for r in rows if r["impl"] not in _MATMUL_IMPLS]
    bmm = [r for r in rows if r["impl"] == "cublas_bmm"]
    gemm = [r for r in rows if r["impl"] == "cublas_gemm"]
    directions = _direction_order({r["direction"] for r in attention}) or ["fwd"]  # ["fwd"]: cublas_bmm rows only
    hdims = sorted({r["hdim"] for r in attention} | {r["hdim"] for r in bmm})
    if not hdims:
        raise ValueError("nothing to plot against seqlen: no attention or cublas_bmm rows")
    causals = sorted({r["causal"] for r in attention}) or [0]
    columns = [(hdim, causal) for hdim in hdims for causal in causals]
    impls = [i for i in _ATTENTION_STYLE if any(r["impl"] == i for r in attention)]
    impls += sorted({r["impl"] for r in attention} - set(impls))
    seqlens = sorted({r["seqlen_q"] for r in attention + bmm})
    ymax = max((r["tflops"] for r in rows), default=1.0) * 1.12

    fig, axes = plt.subplots(
        len(directions), len(columns), figsize=(4.4 * len(columns), 3.5 * len(directions)),
        squeeze=False, sharex=True, sharey=True,
    )
    handles = {}  # label -> line
    for direction, axes_row in zip(directions, axes):
        for (hdim, causal), ax in zip(columns, axes_row):
            for impl in impls:
                points = sorted(
                    (r["seqlen_q"], r["tflops"]) for r in attention
                    if (r["impl"], r["direction"], r["causal"], r["hdim"]) == (impl, direction, causal, hdim)
                )
                if points:
                    style = _ATTENTION_STYLE.get(impl, dict(label=impl))
                    (line,) = ax.plot(*zip(*points), marker="o", markersize=4, **style)
                    handles[line.get_label()] = line
            points = sorted((r["seqlen_q"], r["tflops"]) for r in bmm if r["hdim"] == hdim)
            if points:
                (line,) = ax.plot(*zip(*points), **_BMM_STYLE)
                handles[line.get_label()] = line
            for r in gemm:
                size = f"{r['seqlen_q']}×{r['seqlen_k']}×{r['hdim']}"
                line = ax.axhline(r["tflops"], label=f"cuBLAS GEMM {size} ({r['tflops']:.0f})", **_GEMM_STYLE)
                handles[line.get_label()] = line
            ax.set_title(f"{_DIRECTION_LABEL.get(direction, direction)} · hdim {hdim} · "
                         f"{'causal' if causal else 'not causal'}", fontsize=10)
            ax.set_xscale("log", base=2)
            ax.set_xticks(seqlens, [_seqlen_label(n) for n in seqlens])
            ax.set_ylim(0, ymax)
            ax.grid(True, alpha=0.3)
    tokens = {r["batch"] * r["seqlen_q"] for r in attention + bmm}
    for ax in axes[-1]:
        ax.set_xlabel(f"seqlen (batch · seqlen = {min(tokens)})" if len(tokens) == 1 else "seqlen")
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOP/s")

    dtypes = "/".join(sorted({r["dtype"] for r in rows}))
    title = f"{meta.get('gpu', 'unknown GPU')} · {dtypes}"
    if set(directions) - {"fwd"}:
        title += " · FLOPs: bwd = 2.5 × fwd, fwd+bwd = 3.5 ×, causal halved"
    details = ", ".join(f"{key} {meta[key][:12]}" for key in ("torch", "cudnn", "commit") if key in meta)
    details += f", {meta['date'][:10]}" if "date" in meta else ""
    fig.suptitle(title + (f"\n{details}" if details else ""), fontsize=11)
    order = [_ATTENTION_STYLE.get(i, dict(label=i))["label"] for i in impls] + [_BMM_STYLE["label"]]
    labels = sorted(handles, key=lambda label: order.index(label) if label in order else len(order))
    fig.legend([handles[label] for label in labels], labels, loc="lower center", ncol=4, fontsize=9, frameon=False)
    legend_lines = -(-len(handles) // 4)
    fig.tight_layout(rect=(0, (0.3 * legend_lines + 0.1) / fig.get_figheight(), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Redraw the benchmark plot from a results CSV (no GPU needed).")
    parser.add_argument("csv", type=Path, help="results file written by bench_attention.py")
    parser.add_argument("png", type=Path, nargs="?", help="output image (default: the CSV's path, .png)")
    args = parser.parse_args(argv)
    meta, rows = read_results(args.csv)
    if not rows:
        print(f"{args.csv}: no result rows", file=sys.stderr)
        return 1
    png = args.png or args.csv.with_suffix(".png")
    plot_results(rows, meta, png)
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
