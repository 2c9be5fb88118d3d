#!/usr/bin/env python3
"""Attention forward throughput: flashtile beside torch SDPA's backends and cuBLAS.

Every implementation runs in this one process on the same inputs; for each case
all of them are checked, then timed back to back, so that the ratios between
them hold on a shared, noisy machine. The sweep is the standard one (shared
BENCHMARKING.md): batch · seqlen = 16384 tokens, nheads = 2048 / hdim, seqlen
512 … 16k, hdim 64 and 128, causal and not.

    python3 benchmarks/bench_attention.py              # the whole sweep, bf16
    python3 benchmarks/bench_attention.py --quick      # smoke run, prints only
    python3 benchmarks/bench_attention.py --dry-run    # the plan, no GPU needed

Check before timing: the output of every attention implementation is compared,
on three blocks of query rows (the first of batch 0, a random one, the last of
the last batch; all heads, all keys), with attention computed in float64. The
bar is FlashAttention's: error ≤ 2 × the error of the same math done by
PyTorch in the input dtype + the rounding of the exact output to that dtype.
flashtile's LSE is checked the same way. A result that misses the bar gets no
time (FAIL), and the exit status is 1.

An implementation that cannot run a case (a flashtile build without that
combination, an SDPA backend that refuses the shapes) is skipped for that case,
said so as it happens and summed up at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import random
import re
import shlex
import statistics
import subprocess
import sys
import warnings
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from plot_results import plot_results, write_results

REPO = Path(__file__).resolve().parent.parent
TOKENS = 16384  # batch · seqlen
HIDDEN = 2048  # nheads · hdim
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (64, 128)
CAUSALS = (0, 1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# FLOPs of each direction as a multiple of the forward's (BENCHMARKING.md).
DIRECTION_FLOPS = {"fwd": 1.0}
SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
ATTENTION_IMPLS = ("flashtile", *SDPA_BACKENDS)
IMPLS = (*ATTENTION_IMPLS, "cublas_bmm", "cublas_gemm")
GEMM_SIZE = 8192
QUICK_SEQLENS = (1024,)
PROBE_ROWS = 128  # query rows per checked block
LSE_ATOL = 1e-4  # float32 LSE of O(10): a few ulps of slack
WARMUP_MS, REP_MS, MIN_REPS = 25.0, 100.0, 10
L2_FLUSH_BYTES = 256 << 20  # > the 50 MiB L2 of H100/H200


@dataclass(frozen=True)
class Case:
    """One attention problem of the sweep: square (seqlen_q = seqlen_k), no GQA."""

    direction: str
    dtype: str
    hdim: int
    causal: int
    seqlen: int

    @property
    def batch(self) -> int:
        return TOKENS // self.seqlen

    @property
    def nheads(self) -> int:
        return HIDDEN // self.hdim

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen, self.nheads, self.hdim)

    @property
    def flops(self) -> float:
        fwd = 4 * self.batch * self.nheads * self.seqlen * self.seqlen * self.hdim
        return fwd * DIRECTION_FLOPS[self.direction] / (2 if self.causal else 1)

    @property
    def bmm_flops(self) -> float:
        """QKᵀ alone: (b·h, s, d) × (b·h, d, s)."""
        return 2 * self.batch * self.nheads * self.seqlen * self.seqlen * self.hdim

    def __str__(self) -> str:
        return f"hdim {self.hdim} causal {self.causal} seqlen {self.seqlen}"


def result_row(impl: str, case: Case, ms: float, flops: float, **shape) -> dict:
    """A CSV row: case's shape unless `shape` says otherwise (the matmul rows)."""
    row = dict(
        impl=impl, direction=case.direction, dtype=case.dtype, hdim=case.hdim, causal=case.causal,
        window_left=-1, window_right=-1, batch=case.batch, nheads=case.nheads, nheads_k=case.nheads,
        seqlen_q=case.seqlen, seqlen_k=case.seqlen, ms=ms, tflops=flops / ms / 1e9,
    )
    return row | shape


# --- implementations -------------------------------------------------------------


def attention_fn(impl: str, q, k, v, causal: int):
    """A no-argument callable returning impl's attention output, (b, s, h, d)."""
    if impl == "flashtile":
        # Imported here so that a missing or partial build skips flashtile's
        # rows, with the reason, instead of stopping the sweep.
        import flashtile

        return lambda: flashtile.flash_attn_func(q, k, v, causal=bool(causal))
    # SDPA takes (b, h, s, d): views of the same (b, s, h, d) storage.
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal)).transpose(1, 2)


def impl_context(impl: str):
    """SDPA's backend choice, held around the check and the timing, not each call."""
    return sdpa_kernel(SDPA_BACKENDS[impl]) if impl in SDPA_BACKENDS else contextlib.nullcontext()


def first_call(impl: str, q, k, v, causal: int):
    """(fn, its output, None), or (None, None, why) if impl cannot run this case."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fn = attention_fn(impl, q, k, v, causal)
            with impl_context(impl):
                out = fn()
            torch.cuda.synchronize()
        except torch.AcceleratorError:  # a kernel fault: the context is lost, nothing after it can run
            raise
        except Exception as e:  # an unbuilt combination's error type is the library's own
            # SDPA says why a backend refused only in warnings; keep those.
            reasons = [f"{type(e).__name__}: {_first_line(e)}"] + [_first_line(w.message) for w in caught]
            return None, None, "; ".join(dict.fromkeys(reasons))[:300]
    return fn, out, None


def _first_line(x) -> str:
    lines = str(x).strip().splitlines()
    return lines[0] if lines else ""


# --- correctness -------------------------------------------------------------------


def slice_attention(q, k, v, batch_idx: int, rows: slice, causal: int, dtype):
    """Attention of query rows `rows` of batch `batch_idx` over all its keys,
    computed in `dtype`: (out (h, r, d), lse (h, r)), both float64."""
    qs = q[batch_idx, rows].transpose(0, 1).to(dtype)  # (h, r, d)
    ks, vs = (x[batch_idx].transpose(0, 1).to(dtype) for x in (k, v))  # (h, s, d)
    scores = (qs @ ks.transpose(1, 2)) * q.shape[-1] ** -0.5  # (h, r, s)
    if causal:
        query = torch.arange(rows.start, rows.stop, device=q.device)
        key = torch.arange(k.shape[1], device=q.device)
        scores = scores.masked_fill(key > query[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vs  # (h, r, d)
    return out.double(), torch.logsumexp(scores.double(), dim=-1)


@dataclass
class Reference:
    """float64 attention on a few blocks of query rows, and the error bars."""

    blocks: list[tuple[int, slice]]
    out: list[torch.Tensor]  # per block, (h, r, d)
    lse: list[torch.Tensor]  # per block, (h, r)
    torch_out_err: float  # the same math in the input dtype, against float64
    torch_lse_err: float
    out_atol: float  # float64 output rounded to the input dtype

    @property
    def out_bound(self) -> float:
        return 2 * self.torch_out_err + self.out_atol

    @property
    def lse_bound(self) -> float:
        return 2 * self.torch_lse_err + LSE_ATOL


def make_reference(q, k, v, case: Case, seed: int) -> Reference:
    rows = min(PROBE_ROWS, case.seqlen)
    pick = random.Random(seed)
    blocks = [
        (0, slice(0, rows)),
        (pick.randrange(case.batch), slice(start := pick.randrange(case.seqlen - rows + 1), start + rows)),
        (case.batch - 1, slice(case.seqlen - rows, case.seqlen)),
    ]
    exact = [slice_attention(q, k, v, b, r, case.causal, torch.float64) for b, r in blocks]
    same_dtype = [slice_attention(q, k, v, b, r, case.causal, q.dtype) for b, r in blocks]
    return Reference(
        blocks=blocks,
        out=[o for o, _ in exact],
        lse=[lse for _, lse in exact],
        torch_out_err=max(_max_err(o, ref) for (o, _), (ref, _) in zip(same_dtype, exact)),
        torch_lse_err=max(_max_err(lse, ref) for (_, lse), (_, ref) in zip(same_dtype, exact)),
        out_atol=max(_max_err(o.to(q.dtype).double(), o) for o, _ in exact),
    )


def _max_err(x, ref) -> float:
    return (x.double() - ref).abs().max().item()  # NaN propagates and fails any bound


def check_output(ref: Reference, out, q) -> tuple[float, str | None]:
    """(max error on the reference's blocks, what is wrong or None)."""
    if out.shape != q.shape or out.dtype != q.dtype:
        return math.nan, f"output {tuple(out.shape)} {out.dtype}, expected {tuple(q.shape)} {q.dtype}"
    if not torch.isfinite(out).all():
        return math.nan, "non-finite values in the output"
    err = max(_max_err(out[b, r].transpose(0, 1), o) for (b, r), o in zip(ref.blocks, ref.out))
    return err, None if err <= ref.out_bound else f"error {err:.2e} > bound {ref.out_bound:.2e}"


def check_flashtile_lse(ref: Reference, q, k, v, causal: int) -> tuple[float, str | None]:
    import flashtile

    try:
        _, lse, _ = flashtile.flash_attn_func(q, k, v, causal=bool(causal), return_attn_probs=True)
    except Exception as e:  # the plain call ran, so this is a failure, not a skip
        return math.nan, f"return_attn_probs=True raised {type(e).__name__}: {_first_line(e)}"
    expected = (q.shape[0], q.shape[2], q.shape[1])
    if lse.shape != expected or lse.dtype != torch.float32:
        return math.nan, f"lse {tuple(lse.shape)} {lse.dtype}, expected {expected} torch.float32"
    err = max(_max_err(lse[b, :, r], ref_lse) for (b, r), ref_lse in zip(ref.blocks, ref.lse))
    return err, None if err <= ref.lse_bound else f"lse error {err:.2e} > bound {ref.lse_bound:.2e}"


# --- timing -------------------------------------------------------------------------


@functools.cache
def _l2_flush_buffer():
    return torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")


def time_ms(fn) -> float:
    """Median milliseconds of fn(), CUDA events around each call.

    triton.testing.do_bench's method (the anchors' timer), without triton: size
    the loops from 5 calls, warm up for ~WARMUP_MS, then time ~REP_MS of calls
    one by one. Zeroing a buffer larger than L2 before every call means no call
    finds its inputs in cache, which is what rotating input sets would buy.
    """
    flush = _l2_flush_buffer()
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        flush.zero_()
        fn()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(WARMUP_MS / estimate))):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(max(MIN_REPS, int(REP_MS / estimate)))
    ]
    for start, end in events:
        flush.zero_()
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


# --- the sweep -----------------------------------------------------------------------


class Sweep:
    """Rows for the CSV, and what the table and the summary need."""

    def __init__(self, write):
        self.write = write  # prints without breaking the progress bar
        self.rows: list[dict] = []
        self.skipped: Counter = Counter()  # (impl, reason) -> cases
        self.failed: list[str] = []
        self.failed_cells: set = set()  # (impl, hdim, causal, seqlen)
        self.bmm_done: set = set()  # (hdim, seqlen)

    def attention_case(self, case: Case, impls: list[str], seed: int) -> None:
        torch.manual_seed(seed)
        q, k, v = (torch.randn(case.shape, device="cuda", dtype=DTYPES[case.dtype]) for _ in range(3))
        attention = [i for i in impls if i in ATTENTION_IMPLS]
        passed = {}
        if attention:
            ref = make_reference(q, k, v, case, seed)
            report = []
            for impl in attention:
                fn, out, why = first_call(impl, q, k, v, case.causal)
                if why:
                    if not self.skipped[impl, why]:  # said once here, counted in the summary
                        self.write(f"  skip {impl} ({case}): {why}")
                    self.skipped[impl, why] += 1
                    report.append(f"{impl} skipped")
                    continue
                err, wrong = check_output(ref, out, q)
                note = f"{impl} {err:.1e}"
                if not wrong and impl == "flashtile":
                    lse_err, wrong = check_flashtile_lse(ref, q, k, v, case.causal)
                    note += f" (lse {lse_err:.1e})"
                if wrong:
                    self.failed.append(f"{impl} ({case}): {wrong}")
                    self.failed_cells.add((impl, case.hdim, case.causal, case.seqlen))
                    self.write(f"  FAIL {impl} ({case}): {wrong}")
                    note += " FAIL"
                else:
                    passed[impl] = fn
                report.append(note)
            self.write(
                f"check {case}: bound {ref.out_bound:.1e} = 2 × torch-{case.dtype} {ref.torch_out_err:.1e}"
                f" + {ref.out_atol:.1e}; lse bound {ref.lse_bound:.1e} | " + " | ".join(report)
            )
        for impl, fn in passed.items():
            with impl_context(impl):
                ms = time_ms(fn)
            self.rows.append(result_row(impl, case, ms, case.flops))
        if "cublas_bmm" in impls and (case.hdim, case.seqlen) not in self.bmm_done:
            self.bmm_done.add((case.hdim, case.seqlen))
            bh_q, bh_k = (x.transpose(1, 2).reshape(-1, case.seqlen, case.hdim) for x in (q, k))  # (b·h, s, d)
            ms = time_ms(lambda: torch.bmm(bh_q, bh_k.transpose(1, 2)))
            self.rows.append(result_row("cublas_bmm", case, ms, case.bmm_flops, causal=0))

    def gemm(self, case: Case, seed: int) -> None:
        """The large square GEMM, M = N = K = GEMM_SIZE, recorded the way a bmm row
        is (batch = nheads = 1, seqlen_q = M, seqlen_k = N, hdim = K)."""
        torch.manual_seed(seed)
        a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=DTYPES[case.dtype]) for _ in range(2))
        ms = time_ms(lambda: a @ b)
        self.rows.append(result_row(
            "cublas_gemm", case, ms, 2 * GEMM_SIZE**3,
            causal=0, batch=1, nheads=1, nheads_k=1, seqlen_q=GEMM_SIZE, seqlen_k=GEMM_SIZE, hdim=GEMM_SIZE,
        ))


@contextlib.contextmanager
def progress_bar(total: int):
    """tqdm's bar, or a line per step where tqdm is not installed."""
    try:
        from tqdm import tqdm
    except ImportError:
        yield _PlainProgress(total)
        return
    with tqdm(total=total, unit="case", dynamic_ncols=True) as bar:
        yield bar


class _PlainProgress:
    def __init__(self, total: int):
        self.total, self.n = total, 0

    def set_description(self, text: str) -> None:
        print(f"[{self.n + 1}/{self.total}] {text}", flush=True)

    def update(self) -> None:
        self.n += 1

    def write(self, text: str) -> None:
        print(text, flush=True)


def print_table(sweep: Sweep, cases: list[Case], impls: list[str]) -> None:
    """TFLOP/s per case and impl ("skip": could not run, "FAIL": wrong result),
    then flashtile's ratio to the SDPA FlashAttention-2 and cuDNN backends."""
    tflops = {(r["impl"], r["hdim"], r["causal"], r["seqlen_q"]): r["tflops"] for r in sweep.rows}
    columns = [i for i in impls if i != "cublas_gemm"]
    ratios = [b for b in ("sdpa_flash", "sdpa_cudnn") if "flashtile" in impls and b in impls]
    if cases:
        print(f"\n{cases[0].direction} {cases[0].dtype}, TFLOP/s; flashtile ÷ SDPA at the right")
        print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6}" + "".join(f" {c:>14}" for c in columns)
              + "".join(f" {'ft/' + b.removeprefix('sdpa_'):>9}" for b in ratios))
    for c in cases:
        # cublas_bmm has causal = 0 rows only; it shows on both.
        value = {i: tflops.get((i, c.hdim, 0 if i == "cublas_bmm" else c.causal, c.seqlen)) for i in columns}
        cells = [
            "FAIL" if (i, c.hdim, c.causal, c.seqlen) in sweep.failed_cells else "skip" if value[i] is None
            else f"{value[i]:.1f}"
            for i in columns
        ]
        cells += [
            "-" if None in (value["flashtile"], value[b]) else f"{value['flashtile'] / value[b]:.2f}" for b in ratios
        ]
        widths = [14] * len(columns) + [9] * len(ratios)
        print(f"{c.hdim:>4} {c.causal:>6} {c.seqlen:>6}" + "".join(f" {x:>{w}}" for x, w in zip(cells, widths)))
    for r in sweep.rows:
        if r["impl"] == "cublas_gemm":
            print(f"cublas_gemm {GEMM_SIZE}³ {r['dtype']}: {r['tflops']:.1f} TFLOP/s")


# --- the command line ------------------------------------------------------------------


def parse_seqlen(text: str) -> int:
    match = re.fullmatch(r"(\d+)([kK]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a sequence length: {text!r} (e.g. 2048 or 2k)")
    return int(match[1]) * (1024 if match[2] else 1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direction", choices=list(DIRECTION_FLOPS), default="fwd", help="default: fwd")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="default: bf16")
    parser.add_argument("--hdims", type=int, nargs="+", metavar="D", help=f"default: {' '.join(map(str, HDIMS))}")
    parser.add_argument("--seqlens", type=parse_seqlen, nargs="+", metavar="S",
                        help="e.g. 512 2k 16k; default: 512 … 16k (with --quick: 1k)")
    parser.add_argument("--causal", type=int, nargs="+", choices=CAUSALS, metavar="C", help="0, 1 or both (default)")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, metavar="IMPL",
                        help=f"default: all of {' '.join(IMPLS)}")
    parser.add_argument("--quick", action="store_true", help="smoke run: seqlen 1k only unless --seqlens is given")
    parser.add_argument("--out", type=Path, metavar="CSV",
                        help="results file; default for the full sweep: benchmarks/results/<gpu>[-fp16].csv; "
                             "a narrowed or --quick run writes no file unless given one")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="default: the CSV's path with .png")
    parser.add_argument("--commit", help="commit for the CSV header when the tree has no git "
                                         "(default: git rev-parse HEAD, else 'unknown')")
    parser.add_argument("--dry-run", action="store_true", help="print the planned cases and sizes; no GPU needed")
    args = parser.parse_args(argv)
    for d in args.hdims or ():
        if d <= 0 or HIDDEN % d:
            parser.error(f"hdim {d} does not divide the hidden size {HIDDEN}")
    for s in args.seqlens or ():
        if s <= 0 or TOKENS % s:
            parser.error(f"seqlen {s} does not divide the {TOKENS} tokens")
    args.narrowed = args.quick or any(x is not None for x in (args.hdims, args.seqlens, args.causal, args.impls))
    args.hdims = args.hdims or list(HDIMS)
    args.seqlens = args.seqlens or list(QUICK_SEQLENS if args.quick else SEQLENS)
    args.causal = args.causal or list(CAUSALS)
    args.impls = [i for i in IMPLS if i in (args.impls or IMPLS)]
    return args


def plan(args) -> list[Case]:
    return [
        Case(args.direction, args.dtype, hdim, causal, seqlen)
        for hdim in args.hdims for causal in args.causal for seqlen in args.seqlens
    ]


def output_paths(args, gpu_slug: str) -> tuple[Path | None, Path | None]:
    csv_path = args.out
    if csv_path is None and not args.narrowed:
        csv_path = REPO / "benchmarks" / "results" / f"{gpu_slug}{'' if args.dtype == 'bf16' else '-' + args.dtype}.csv"
    png_path = args.plot or (csv_path.with_suffix(".png") if csv_path else None)
    return csv_path, png_path


def gpu_slug(name: str) -> str:
    """"NVIDIA H200" -> "h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia").strip()).strip("-")


def print_plan(args, cases: list[Case]) -> None:
    mib, gib = 2**20, 2**30
    elem = torch.finfo(DTYPES[args.dtype]).bits // 8
    print(f"{args.direction} {args.dtype}; impls: {' '.join(args.impls)}")
    print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'batch':>5} {'nheads':>6} {'GFLOP':>9} "
          f"{'q,k,v,o MiB':>11} {'bmm GFLOP':>9} {'bmm out GiB':>11} {'check MiB':>9}")
    for c in cases:
        tensor = c.batch * c.seqlen * c.nheads * c.hdim * elem
        check = c.nheads * min(PROBE_ROWS, c.seqlen) * c.seqlen * 8  # one float64 block of scores
        print(f"{c.hdim:>4} {c.causal:>6} {c.seqlen:>6} {c.batch:>5} {c.nheads:>6} {c.flops / 1e9:>9.1f} "
              f"{tensor / mib:>11.0f} {c.bmm_flops / 1e9:>9.1f} "
              f"{c.batch * c.nheads * c.seqlen**2 * elem / gib:>11.2f} {check / mib:>9.0f}")
    if "cublas_gemm" in args.impls:
        print(f"cublas_gemm {GEMM_SIZE}³: {2 * GEMM_SIZE**3 / 1e9:.1f} GFLOP")
    csv_path, png_path = output_paths(args, "<gpu>")
    print(f"results: {csv_path or 'not written (narrowed run without --out)'}; plot: {png_path or 'none'}")


def run_metadata(args) -> dict[str, str]:
    commit = args.commit
    if commit is None:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                    check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return dict(
        gpu=torch.cuda.get_device_name(),
        torch=torch.__version__,
        cuda=str(torch.version.cuda),
        cudnn=str(torch.backends.cudnn.version()),
        commit=commit,
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        cmd=shlex.join([Path(sys.executable).name, *sys.argv]),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    cases = plan(args)
    if args.dry_run:
        print_plan(args, cases)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time (--dry-run shows the plan)", file=sys.stderr)
        return 2
    meta = run_metadata(args)
    print(", ".join(f"{key}={value}" for key, value in meta.items()))
    csv_path, png_path = output_paths(args, gpu_slug(meta["gpu"]))
    gemm = "cublas_gemm" in args.impls
    per_case = cases if args.impls != ["cublas_gemm"] else []
    with progress_bar(total=len(per_case) + gemm) as bar:
        sweep = Sweep(bar.write)
        if gemm:
            bar.set_description("cublas_gemm")
            sweep.gemm(cases[0], seed=len(cases))
            bar.update()
        for seed, case in enumerate(per_case):
            bar.set_description(str(case))
            sweep.attention_case(case, args.impls, seed)
            bar.update()

    print_table(sweep, per_case, args.impls)
    for (impl, why), count in sorted(sweep.skipped.items()):
        print(f"skipped: {impl} in {count} case(s): {why}")
    for failure in sweep.failed:
        print(f"FAILED check, no time recorded: {failure}")
    if csv_path:
        write_results(csv_path, meta, sweep.rows)
        print(f"wrote {csv_path}")
    else:
        print("narrowed run: no results file written (pass --out to keep one)")
    if png_path and any(r["impl"] != "cublas_gemm" for r in sweep.rows):
        plot_results(sweep.rows, meta, png_path)
        print(f"wrote {png_path}")
    return 1 if sweep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
