#!/usr/bin/env python3
"""Attention throughput, forward and backward: flashtile beside torch SDPA's
backends and cuBLAS.

Every implementation runs in this one process on the same inputs; for each
case all of them are checked, then timed back to back, so that the ratios
between them hold on a shared, noisy machine. The sweep is the standard one
(shared BENCHMARKING.md): batch · seqlen = 16384 tokens, nheads = 2048 / hdim,
seqlen 512 … 16k, hdim 64 and 128, causal and not, in three directions:

    fwd     the forward alone (inputs that do not require grad);
    bwd     the backward alone: one forward with inputs that require grad, then
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True) timed
            over and over on that one graph (flash-attention's own method);
    fwdbwd  forward and backward together, a fresh graph each call.

FLOPs are FlashAttention's: forward 4 · b · h · s² · d, backward 2.5 × that,
forward + backward 3.5 ×, all halved when causal (DIRECTION_FLOPS). dout is
torch.randn, never zeros. The cuBLAS rows (cublas_bmm, the QKᵀ-shaped batched
GEMM; cublas_gemm, an 8192³ GEMM) are forward-only matmul ceilings, recorded
with direction fwd and drawn in every row of the plot.

    python3 benchmarks/bench_attention.py              # the whole sweep + memory, bf16
    python3 benchmarks/bench_attention.py --quick      # smoke run, prints only
    python3 benchmarks/bench_attention.py --dry-run    # the plan, no GPU needed

Check before timing, forward: the output of every attention implementation is
compared, on three blocks of query rows (the first of batch 0, a random one,
the last of the last batch; all heads, all keys), with attention computed in
float64. The bar is FlashAttention's: error ≤ 2 × the error of the same math
done by PyTorch in the input dtype + the rounding of the exact output to that
dtype. flashtile's LSE is checked the same way. When a backward direction is
asked for, the output of the forward that builds the graph (inputs requiring
grad) is checked the same way too.

Check before timing, backward: every implementation's dq, dk, dv (from its
first backward, on the graph that bwd then times) are compared on three
(batch, head) pairs — (0, 0), a random one, (last, last) — with the gradients
of that one head's attention computed by torch.autograd over all its query and
key rows in float64 (the head's full s × s scores: 8 B · s² each, a few GiB at
16k; heads are independent, so a head is an exact slice at every seqlen). The
bar, per tensor, is FlashAttention's again: max error ≤ 2 × the max error of
the same autograd math in the input dtype + the rounding of the exact gradient
to that dtype.

A result that misses a bar gets no time (FAIL) in the directions it concerns
(a wrong forward: all three; a wrong backward: bwd and fwdbwd), and the exit
status is 1. An implementation that cannot run a case (a flashtile build
without that combination or without a backward, an SDPA backend that refuses
the shapes or the backward) is skipped for that case and direction, said so as
it happens and summed up at the end.

Outputs: a table per direction (TFLOP/s, and flashtile ÷ SDPA flash and ÷ SDPA
cuDNN); the results CSV (schema in BENCHMARKING.md, all directions in one file)
and its plot, a row of panels per direction, a column per (hdim, causal).
Should the run stop on an exception (a kernel fault), the rows timed so far go
to <results>.partial.csv first.

Peak memory (--memory; on by default for the full sweep): after the sweep,
for hdim 128 and 64, batch 1, nheads 2048 / hdim, seqlen 16k and 32k, not
causal, in the run's dtype: torch.cuda.max_memory_allocated() above what q, k,
v and dout hold, during flashtile's forward and during its forward + backward
(SDPA flash beside it for comparison), after one warm-up pass. Printed as a
table beside the bytes of one (b, s, h, d) tensor (each of q, k, v, out, dout,
dq, dk, dv is one) and of the LSE; written to <results>-memory.csv next to the
results file when there is one.

Decoding (--decode; on by default for the full sweep): then
benchmarks/bench_decode.py's sweep, a KV cache read one query a sequence,
into <results>-decode.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import itertools
import math
import random
import re
import shlex
import statistics
import subprocess
import sys
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from plot_results import plot_results, results_dir, write_results, write_table

REPO = Path(__file__).resolve().parent.parent
TOKENS = 16384  # batch · seqlen
HIDDEN = 2048  # nheads · hdim
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HDIMS = (64, 128)
CAUSALS = (0, 1)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# FLOPs of each direction as a multiple of the forward's (BENCHMARKING.md).
DIRECTION_FLOPS = {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}
GRAD_DIRECTIONS = ("bwd", "fwdbwd")  # the directions that need a backward
SDPA_BACKENDS = {
    "sdpa_flash": SDPBackend.FLASH_ATTENTION,
    "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa_efficient": SDPBackend.EFFICIENT_ATTENTION,
}
# flashtile_deterministic: the same forward, and the backward with
# deterministic=True (dq summed in a fixed order); timed in bwd and fwdbwd only.
GRAD_ONLY_IMPLS = ("flashtile_deterministic",)
# flashtile_sm80: flashtile with its dispatch limited to the mma.sync kernels
# (_C.limit_dispatch_arch), so that on an H100/H200 the wgmma path's gain over
# them is measured in the same process.
# flashtile_smem99, flashtile_smem163: the dispatch planned for a GPU with
# that many KB of shared memory per block (_C.limit_smem_budget): the tiles
# sm86/sm89/sm120 and the A100 run, timed here beside the default ones (the
# build needs FLASHTILE_SMEM_BUDGETS, tests/README.md).
SMEM_BUDGET_IMPLS = {"flashtile_smem99": 99, "flashtile_smem163": 163}
FLASHTILE_IMPLS = ("flashtile", *GRAD_ONLY_IMPLS, "flashtile_sm80", *SMEM_BUDGET_IMPLS)
# fa4: FlashAttention-4 (flash_attn.cute, the CuTe-DSL kernels), where it is
# importable (../shared/device/stage-fa4.sh stages it on a host without
# network); elsewhere its rows are skipped with the import error.
ATTENTION_IMPLS = (*FLASHTILE_IMPLS, *SDPA_BACKENDS, "fa4")
IMPLS = (*ATTENTION_IMPLS, "cublas_bmm", "cublas_gemm")
GEMM_SIZE = 8192
QUICK_SEQLENS = (1024,)
PROBE_ROWS = 128  # query rows per checked block
LSE_ATOL = 1e-4  # float32 LSE of O(10): a few ulps of slack
GRAD_NAMES = ("dq", "dk", "dv")
WARMUP_MS, REP_MS, MIN_REPS = 25.0, 100.0, 10
L2_FLUSH_BYTES = 256 << 20  # > the 50 MiB L2 of H100/H200
MEMORY_HDIMS = (128, 64)
MEMORY_SEQLENS = (16384, 32768)
MEMORY_IMPLS = ("flashtile", "sdpa_flash")
MEMORY_COLUMNS = (
    "impl", "dtype", "hdim", "causal", "batch", "nheads", "seqlen",
    "tensor_bytes", "lse_bytes", "fwd_peak_bytes", "fwdbwd_peak_bytes",
)


def sweep_nheads(hdim: int) -> int:
    """HIDDEN / hdim heads, rounded to the nearest where hdim does not divide
    the hidden size (96: 21 heads, 192: 11): the FLOP count uses the real
    nheads, so the rates compare across head dims."""
    return max(1, round(HIDDEN / hdim))


@dataclass(frozen=True)
class Case:
    """One attention problem of the sweep in one direction: square
    (seqlen_q = seqlen_k), no GQA."""

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
        return sweep_nheads(self.hdim)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.seqlen, self.nheads, self.hdim)

    @property
    def point(self) -> tuple[str, int, int, int]:
        """The problem without its direction: cases that share inputs and checks."""
        return (self.dtype, self.hdim, self.causal, self.seqlen)

    @property
    def flops(self) -> float:
        fwd = 4 * self.batch * self.nheads * self.seqlen * self.seqlen * self.hdim
        return fwd * DIRECTION_FLOPS[self.direction] / (2 if self.causal else 1)

    @property
    def bmm_flops(self) -> float:
        """QKᵀ alone: (b·h, s, d) × (b·h, d, s)."""
        return 2 * self.batch * self.nheads * self.seqlen * self.seqlen * self.hdim

    @property
    def problem(self) -> str:
        return f"hdim {self.hdim} causal {self.causal} seqlen {self.seqlen}"

    def __str__(self) -> str:
        return f"{self.direction} {self.problem}"


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
    """A no-argument callable returning impl's attention output, (b, s, h, d).
    With q, k, v that require grad, each call builds an autograd graph."""
    if impl in FLASHTILE_IMPLS:
        # Imported here so that a missing or partial build skips flashtile's
        # rows, with the reason, instead of stopping the sweep.
        import flashtile

        deterministic = impl == "flashtile_deterministic"
        return lambda: flashtile.flash_attn_func(q, k, v, causal=bool(causal), deterministic=deterministic)
    if impl == "fa4":
        from flash_attn.cute import flash_attn_func as fa4_attention

        def fa4():
            result = fa4_attention(q, k, v, causal=bool(causal))
            return result[0] if isinstance(result, tuple) else result  # (out, lse)

        return fa4
    # SDPA takes (b, h, s, d): views of the same (b, s, h, d) storage.
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=bool(causal)).transpose(1, 2)


def impl_context(impl: str):
    """SDPA's backend choice, held around the check and the timing (forward and
    backward alike), not each call."""
    if impl == "flashtile_sm80":
        return sm80_dispatch()
    if impl in SMEM_BUDGET_IMPLS:
        return smem_budget_dispatch(SMEM_BUDGET_IMPLS[impl])
    return sdpa_kernel(SDPA_BACKENDS[impl]) if impl in SDPA_BACKENDS else contextlib.nullcontext()


@contextlib.contextmanager
def sm80_dispatch():
    from flashtile import _C

    _C.limit_dispatch_arch("sm80")
    try:
        yield
    finally:
        _C.limit_dispatch_arch("sm90")


@contextlib.contextmanager
def smem_budget_dispatch(kb: int):
    from flashtile import _C

    _C.limit_smem_budget(kb)
    try:
        yield
    finally:
        _C.limit_smem_budget(227)


def attempt(thunk):
    """(thunk(), None), or (None, why) if it raised: impl cannot run this case."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = thunk()
            torch.cuda.synchronize()
        except torch.AcceleratorError:  # a kernel fault: the context is lost, nothing after it can run
            raise
        except Exception as e:  # an unbuilt combination's error type is the library's own
            # SDPA says why a backend refused only in warnings; keep those.
            reasons = [f"{type(e).__name__}: {_first_line(e)}"] + [_first_line(w.message) for w in caught]
            return None, "; ".join(dict.fromkeys(reasons))[:300]
    return result, None


def first_call(impl: str, q, k, v, causal: int):
    """(fn, its output, None), or (None, None, why) if impl cannot run this case."""

    def thunk():
        fn = attention_fn(impl, q, k, v, causal)
        with impl_context(impl):
            return fn, fn()

    result, why = attempt(thunk)
    return (None, None, why) if why else (*result, None)


@dataclass
class Backward:
    """One implementation's graph and what times it."""

    out: torch.Tensor  # the forward's output, its graph retained
    grads: tuple  # (dq, dk, dv) of the first backward on that graph
    bwd: object  # () -> grads, the backward alone, on the retained graph
    fwdbwd: object  # () -> grads, forward and backward, a fresh graph each call


def first_backward(impl: str, q, k, v, dout, causal: int):
    """(Backward, None), or (None, why) if impl has no backward for this case.
    q, k, v: leaves that require grad."""
    inputs = (q, k, v)

    def thunk():
        fwd = attention_fn(impl, q, k, v, causal)
        with impl_context(impl):
            out = fwd()
            grads = torch.autograd.grad(out, inputs, dout, retain_graph=True)
        return Backward(
            out=out,
            grads=grads,
            bwd=lambda: torch.autograd.grad(out, inputs, dout, retain_graph=True),
            fwdbwd=lambda: torch.autograd.grad(fwd(), inputs, dout),
        )

    return attempt(thunk)


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
    out = out.detach()
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


def head_grads(q, k, v, dout, batch_idx: int, head: int, causal: int, dtype):
    """(dq, dk, dv), each (s, d) float64, of head `head` of batch `batch_idx`:
    that head's whole attention (all query rows, all keys) and its backward,
    done by torch.autograd in `dtype`."""
    qs, ks, vs = (x.detach()[batch_idx, :, head].to(dtype, copy=True).requires_grad_() for x in (q, k, v))
    douts = dout.detach()[batch_idx, :, head].to(dtype)
    seqlen = q.shape[1]
    with torch.enable_grad():
        scores = (qs @ ks.transpose(0, 1)) * q.shape[-1] ** -0.5  # (s, s)
        if causal:
            mask = torch.ones(seqlen, seqlen, dtype=torch.bool, device=q.device).triu_(1)
            scores.masked_fill_(mask, float("-inf"))  # mul by a scalar saves nothing: in place is safe
            del mask
        probs = torch.softmax(scores, dim=-1)
        del scores  # only probs is saved for the backward
        out = probs @ vs
        del probs
        grads = torch.autograd.grad(out, (qs, ks, vs), douts)
    return tuple(g.double() for g in grads)


@dataclass
class GradReference:
    """float64 gradients of a few whole heads, and the error bars per tensor."""

    heads: list[tuple[int, int]]  # (batch index, head index)
    grads: list[tuple[torch.Tensor, ...]]  # per head, (dq, dk, dv), each (s, d)
    torch_err: tuple[float, ...]  # per tensor: the same autograd math in the input dtype, against float64
    atol: tuple[float, ...]  # per tensor: float64 gradient rounded to the input dtype

    @property
    def bounds(self) -> tuple[float, ...]:
        return tuple(2 * e + a for e, a in zip(self.torch_err, self.atol))


def make_grad_reference(q, k, v, dout, case: Case, seed: int) -> GradReference:
    pick = random.Random(seed + 1_000_003)
    heads = list(dict.fromkeys([
        (0, 0),
        (pick.randrange(case.batch), pick.randrange(case.nheads)),
        (case.batch - 1, case.nheads - 1),
    ]))
    exact, same_dtype = [], []
    for b, h in heads:
        exact.append(head_grads(q, k, v, dout, b, h, case.causal, torch.float64))
        same_dtype.append(head_grads(q, k, v, dout, b, h, case.causal, q.dtype))
    n = len(GRAD_NAMES)
    return GradReference(
        heads=heads,
        grads=exact,
        torch_err=tuple(max(_max_err(lo[i], ex[i]) for lo, ex in zip(same_dtype, exact)) for i in range(n)),
        atol=tuple(max(_max_err(ex[i].to(q.dtype), ex[i]) for ex in exact) for i in range(n)),
    )


def check_grads(ref: GradReference, grads, inputs) -> tuple[tuple[float, ...], str | None]:
    """(max error per tensor on the reference's heads, what is wrong or None)."""
    nan = (math.nan,) * len(GRAD_NAMES)
    if len(grads) != len(GRAD_NAMES):
        return nan, f"{len(grads)} gradients, expected {len(GRAD_NAMES)}"
    for name, g, x in zip(GRAD_NAMES, grads, inputs):
        if g is None:
            return nan, f"{name} is None"
        if g.shape != x.shape or g.dtype != x.dtype:
            return nan, f"{name} {tuple(g.shape)} {g.dtype}, expected {tuple(x.shape)} {x.dtype}"
        if not torch.isfinite(g).all():
            return nan, f"non-finite values in {name}"
    errs = tuple(
        max(_max_err(g[b, :, h], exact[i]) for (b, h), exact in zip(ref.heads, ref.grads))
        for i, g in enumerate(grads)
    )
    wrong = [
        f"{name} error {err:.2e} > bound {bound:.2e}"
        for name, err, bound in zip(GRAD_NAMES, errs, ref.bounds) if not err <= bound
    ]
    return errs, "; ".join(wrong) or None


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
    A backward's kernels go to the stream its forward used (here the current
    one), and autograd.grad returns once they are queued, so the events hold
    them.
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

    def __init__(self, bar):
        self.bar = bar
        self.write = bar.write  # prints without breaking the progress bar
        self.rows: list[dict] = []
        self.skipped: Counter = Counter()  # (impl, reason) -> cases
        self.skipped_directions: defaultdict = defaultdict(set)  # (impl, reason) -> directions
        self.failed: list[str] = []
        self.failed_cells: set = set()  # (impl, direction, hdim, causal, seqlen)
        self.bmm_done: set = set()  # (hdim, seqlen)

    def _skip(self, impl: str, cases: list[Case], why: str) -> None:
        if not cases:
            return
        directions = "/".join(c.direction for c in cases)
        if not self.skipped[impl, why]:  # said once here, counted in the summary
            self.write(f"  skip {impl} {directions} ({cases[0].problem}): {why}")
        self.skipped[impl, why] += len(cases)
        self.skipped_directions[impl, why].update(c.direction for c in cases)

    def _fail(self, impl: str, cases: list[Case], what: str, wrong: str) -> None:
        self.failed.append(f"{impl} {what} ({cases[0].problem}): {wrong}")
        self.write(f"  FAIL {impl} {what} ({cases[0].problem}): {wrong}")
        for c in cases:
            self.failed_cells.add((impl, c.direction, c.hdim, c.causal, c.seqlen))

    def attention_point(self, cases: list[Case], impls: list[str], seed: int) -> None:
        """All directions of one problem: inputs made once, every impl checked,
        then, direction by direction, every impl that passed timed back to back."""
        case = cases[0]
        grad_cases = [c for c in cases if c.direction in GRAD_DIRECTIONS]
        self.bar.set_description(f"check {case.problem}")
        torch.manual_seed(seed)
        dtype = DTYPES[case.dtype]
        q, k, v = (torch.randn(case.shape, device="cuda", dtype=dtype) for _ in range(3))
        dout = torch.randn(case.shape, device="cuda", dtype=dtype) if grad_cases else None
        # Leaves for the backward, sharing q, k, v's storage; q, k, v themselves
        # stay free of autograd (the forward's timing and the references).
        q_g, k_g, v_g = (x.detach().requires_grad_() for x in (q, k, v))
        attention = [i for i in impls if i in ATTENTION_IMPLS
                     and (grad_cases or i not in GRAD_ONLY_IMPLS)]
        timed: dict[str, dict] = {c.direction: {} for c in cases}  # direction -> impl -> fn
        if attention:
            ref = make_reference(q, k, v, case, seed)
            grad_ref = None  # made on first need
            report, grad_report = [], []
            for impl in attention:
                fn, out, why = first_call(impl, q, k, v, case.causal)
                if why:
                    self._skip(impl, cases, why)
                    report.append(f"{impl} skipped")
                    continue
                err, wrong = check_output(ref, out, q)
                del out
                note = f"{impl} {err:.1e}"
                if not wrong and impl == "flashtile":
                    lse_err, wrong = check_flashtile_lse(ref, q, k, v, case.causal)
                    note += f" (lse {lse_err:.1e})"
                if wrong:
                    self._fail(impl, cases, "forward", wrong)
                    report.append(note + " FAIL")
                    continue
                report.append(note)
                if "fwd" in timed and impl not in GRAD_ONLY_IMPLS:
                    timed["fwd"][impl] = fn
                if not grad_cases:
                    continue
                backward, why = first_backward(impl, q_g, k_g, v_g, dout, case.causal)
                if why:
                    self._skip(impl, grad_cases, why)
                    grad_report.append(f"{impl} skipped")
                    continue
                if grad_ref is None:
                    grad_ref = make_grad_reference(q, k, v, dout, case, seed)
                err, wrong = check_output(ref, backward.out, q)
                grad_note, what = f"{impl} out {err:.1e}", "forward with requires_grad"
                if not wrong:
                    errs, wrong = check_grads(grad_ref, backward.grads, (q, k, v))
                    grad_note += "".join(f" {n} {e:.1e}" for n, e in zip(GRAD_NAMES, errs))
                    what = "backward"
                backward.grads = None  # checked; not needed for the timing
                if wrong:
                    self._fail(impl, grad_cases, what, wrong)
                    grad_report.append(grad_note + " FAIL")
                    continue
                grad_report.append(grad_note)
                for c in grad_cases:
                    timed[c.direction][impl] = getattr(backward, c.direction)
            self.write(
                f"check {case.problem}: bound {ref.out_bound:.1e} = 2 × torch-{case.dtype} {ref.torch_out_err:.1e}"
                f" + {ref.out_atol:.1e}; lse bound {ref.lse_bound:.1e} | " + " | ".join(report)
            )
            if grad_report:
                bounds = "" if grad_ref is None else " bounds " + "; ".join(
                    f"{n} {b:.1e} = 2 × torch-{case.dtype} {e:.1e} + {a:.1e}"
                    for n, b, e, a in zip(GRAD_NAMES, grad_ref.bounds, grad_ref.torch_err, grad_ref.atol)
                ) + f" on (b, h) {grad_ref.heads}"
                self.write(f"check grads {case.problem}:{bounds} | " + " | ".join(grad_report))
            del ref, grad_ref
        for c in cases:
            self.bar.set_description(str(c))
            for impl, fn in timed[c.direction].items():
                with impl_context(impl):
                    ms = time_ms(fn)
                self.rows.append(result_row(impl, c, ms, c.flops))
            self.bar.update()
        timed.clear()  # frees the retained graphs
        if "cublas_bmm" in impls and (case.hdim, case.seqlen) not in self.bmm_done:
            self.bmm_done.add((case.hdim, case.seqlen))
            bh_q, bh_k = (x.transpose(1, 2).reshape(-1, case.seqlen, case.hdim) for x in (q, k))  # (b·h, s, d)
            ms = time_ms(lambda: torch.bmm(bh_q, bh_k.transpose(1, 2)))
            fwd_case = dataclasses.replace(case, direction="fwd")
            self.rows.append(result_row("cublas_bmm", fwd_case, ms, case.bmm_flops, causal=0))

    def gemm(self, case: Case, seed: int) -> None:
        """The large square GEMM, M = N = K = GEMM_SIZE, recorded the way a bmm row
        is (direction fwd, batch = nheads = 1, seqlen_q = M, seqlen_k = N, hdim = K)."""
        torch.manual_seed(seed)
        a, b = (torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=DTYPES[case.dtype]) for _ in range(2))
        ms = time_ms(lambda: a @ b)
        self.rows.append(result_row(
            "cublas_gemm", dataclasses.replace(case, direction="fwd"), ms, 2 * GEMM_SIZE**3,
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


def ratio_label(impl: str) -> str:
    """A ratio column's name: sdpa_cudnn -> cudnn, flashtile_smem99 -> smem99."""
    return impl.removeprefix("sdpa_").replace("flashtile_deterministic", "det").removeprefix("flashtile_")


def print_table(sweep: Sweep, cases: list[Case], impls: list[str], directions: list[str]) -> None:
    """Per direction: TFLOP/s per case and impl ("skip": could not run, "FAIL":
    wrong result), then flashtile's ratio to the SDPA FlashAttention-2 and cuDNN
    backends and to its own deterministic backward (the cost of determinism).
    cublas_bmm (forward-only, causal 0) is the same number in every table."""
    tflops = {(r["impl"], r["direction"], r["hdim"], r["causal"], r["seqlen_q"]): r["tflops"] for r in sweep.rows}
    columns = [i for i in impls if i != "cublas_gemm"]
    ratios = [b for b in ("sdpa_flash", "sdpa_cudnn", "fa4", "flashtile_deterministic", "flashtile_sm80",
                          *SMEM_BUDGET_IMPLS)
              if "flashtile" in impls and b in impls]
    widths = [14] * len(columns) + [9] * len(ratios)
    for direction in directions:
        direction_cases = [c for c in cases if c.direction == direction]
        if not direction_cases:
            continue
        print(f"\n{direction} {direction_cases[0].dtype}, TFLOP/s ({DIRECTION_FLOPS[direction]:g} × forward FLOPs); "
              "flashtile ÷ SDPA, and ÷ its deterministic mode, at the right")
        print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6}" + "".join(f" {c:>14}" for c in columns)
              + "".join(f" {'ft/' + ratio_label(b):>9}" for b in ratios))
        for c in direction_cases:
            value = {
                i: tflops.get(("cublas_bmm", "fwd", c.hdim, 0, c.seqlen) if i == "cublas_bmm"
                              else (i, direction, c.hdim, c.causal, c.seqlen))
                for i in columns
            }
            cells = [
                "FAIL" if (i, direction, c.hdim, c.causal, c.seqlen) in sweep.failed_cells
                else "skip" if value[i] is None else f"{value[i]:.1f}"
                for i in columns
            ]
            cells += [
                "-" if None in (value["flashtile"], value[b]) else f"{value['flashtile'] / value[b]:.2f}"
                for b in ratios
            ]
            print(f"{c.hdim:>4} {c.causal:>6} {c.seqlen:>6}" + "".join(f" {x:>{w}}" for x, w in zip(cells, widths)))
    for r in sweep.rows:
        if r["impl"] == "cublas_gemm":
            print(f"cublas_gemm {GEMM_SIZE}³ {r['dtype']}: {r['tflops']:.1f} TFLOP/s")


# --- peak memory -----------------------------------------------------------------------


def memory_plan(dtype: str) -> list[dict]:
    """The memory cases: batch 1, nheads = HIDDEN / hdim, not causal."""
    return [
        dict(impl=impl, dtype=dtype, hdim=hdim, causal=0, batch=1, nheads=sweep_nheads(hdim), seqlen=seqlen)
        for hdim in MEMORY_HDIMS for seqlen in MEMORY_SEQLENS for impl in MEMORY_IMPLS
    ]


def memory_sizes(m: dict) -> tuple[int, int]:
    """(bytes of one (b, s, h, d) tensor, bytes of the float32 LSE)."""
    elem = torch.finfo(DTYPES[m["dtype"]]).bits // 8
    return m["batch"] * m["seqlen"] * m["nheads"] * m["hdim"] * elem, m["batch"] * m["nheads"] * m["seqlen"] * 4


def measure_memory(m: dict) -> tuple[dict | None, str | None]:
    """(m with its tensor_bytes, lse_bytes, fwd_peak_bytes, fwdbwd_peak_bytes;
    None) or (None, why). Peaks are max_memory_allocated() above what q, k, v
    and dout hold, after one warm-up forward + backward."""
    impl = m["impl"]
    shape = (m["batch"], m["seqlen"], m["nheads"], m["hdim"])
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    dtype = DTYPES[m["dtype"]]
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype).requires_grad_() for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dtype)
    inputs = (q, k, v)

    def thunk():
        fn = attention_fn(impl, q, k, v, m["causal"])
        with impl_context(impl):
            torch.autograd.grad(fn(), inputs, dout)  # warm-up: lazy allocations do not count
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = fn()
            torch.cuda.synchronize()
            fwd_peak = torch.cuda.max_memory_allocated() - base
            grads = torch.autograd.grad(out, inputs, dout)
            torch.cuda.synchronize()
            fwdbwd_peak = torch.cuda.max_memory_allocated() - base
            del out, grads
        return fwd_peak, fwdbwd_peak

    peaks, why = attempt(thunk)
    if why:
        return None, why
    tensor_bytes, lse_bytes = memory_sizes(m)
    return m | dict(tensor_bytes=tensor_bytes, lse_bytes=lse_bytes,
                    fwd_peak_bytes=peaks[0], fwdbwd_peak_bytes=peaks[1]), None


def print_memory_table(rows: list[dict]) -> None:
    mib = 2**20
    print("\npeak memory above q, k, v, dout (MiB); one tensor = any of q, k, v, out, dout, dq, dk, dv; "
          "least = out + lse + dq + dk + dv")
    print(f"{'impl':>10} {'hdim':>4} {'nheads':>6} {'seqlen':>6} {'tensor':>8} {'lse':>6} {'fwd peak':>9} "
          f"{'fwd+bwd peak':>12} {'least':>8} {'peak-least':>10} {'peak/tensor':>11}")
    for r in rows:
        least = 4 * r["tensor_bytes"] + r["lse_bytes"]
        print(f"{r['impl']:>10} {r['hdim']:>4} {r['nheads']:>6} {r['seqlen']:>6} {r['tensor_bytes'] / mib:>8.1f} "
              f"{r['lse_bytes'] / mib:>6.1f} {r['fwd_peak_bytes'] / mib:>9.1f} {r['fwdbwd_peak_bytes'] / mib:>12.1f} "
              f"{least / mib:>8.1f} {(r['fwdbwd_peak_bytes'] - least) / mib:>10.1f} "
              f"{r['fwdbwd_peak_bytes'] / r['tensor_bytes']:>11.2f}")


def memory_run(args, meta: dict[str, str], csv_path: Path | None) -> None:
    rows = []
    for m in memory_plan(args.dtype):
        print(f"memory: {m['impl']} hdim {m['hdim']} seqlen {m['seqlen']}", flush=True)
        row, why = measure_memory(m)
        if why:
            print(f"  skip memory {m['impl']} (hdim {m['hdim']} seqlen {m['seqlen']}): {why}")
        else:
            rows.append(row)
    gc.collect()
    torch.cuda.empty_cache()
    if not rows:
        print("memory: nothing measured")
        return
    print_memory_table(rows)
    if csv_path:
        path = memory_path(csv_path)
        write_table(path, meta, list(MEMORY_COLUMNS), rows)
        print(f"wrote {path}")


def memory_path(csv_path: Path) -> Path:
    return csv_path.with_name(csv_path.stem + "-memory.csv")


# --- the command line ------------------------------------------------------------------


def parse_seqlen(text: str) -> int:
    match = re.fullmatch(r"(\d+)([kK]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a sequence length: {text!r} (e.g. 2048 or 2k)")
    return int(match[1]) * (1024 if match[2] else 1)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--direction", nargs="+", choices=list(DIRECTION_FLOPS), metavar="DIR", dest="directions",
                        help=f"one or more of {' '.join(DIRECTION_FLOPS)}; default: all three")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16", help="default: bf16")
    parser.add_argument("--hdims", type=int, nargs="+", metavar="D", help=f"default: {' '.join(map(str, HDIMS))}")
    parser.add_argument("--seqlens", type=parse_seqlen, nargs="+", metavar="S",
                        help="e.g. 512 2k 16k; default: 512 … 16k (with --quick: 1k)")
    parser.add_argument("--causal", type=int, nargs="+", choices=CAUSALS, metavar="C", help="0, 1 or both (default)")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, metavar="IMPL",
                        help=f"default: all of {' '.join(IMPLS)}")
    parser.add_argument("--quick", action="store_true", help="smoke run: seqlen 1k only unless --seqlens is given")
    parser.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None,
                        help="after the sweep, peak memory of flashtile's (and SDPA flash's) forward + backward at "
                             "batch 1, seqlen 16k and 32k, hdim 128 and 64; default: on for the full sweep, "
                             "off for a narrowed or --quick run")
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=None,
                        help="after the sweep, the decode benchmark (bench_decode.py: a KV cache, one query a "
                             "sequence, bandwidth beside SDPA and the copy bandwidth) into CSV's name + "
                             "-decode.csv; default: on for the full sweep, off for a narrowed or --quick run")
    parser.add_argument("--out", type=Path, metavar="CSV",
                        help="results file; default for the full sweep: <gpu>[-fp16].csv in $FLASHTILE_RESULTS_DIR "
                             "or else ~/flashtile-results (outside the checkout, which a run never dirties; "
                             "benchmarks/results/ holds the project's runs, written with --out); a narrowed or "
                             "--quick run writes no file unless given one. The memory table goes to CSV's "
                             "name + -memory.csv")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="default: the CSV's path with .png")
    parser.add_argument("--commit", help="commit for the CSV header when the tree has no git "
                                         "(default: git rev-parse HEAD, else 'unknown')")
    parser.add_argument("--dry-run", action="store_true", help="print the planned cases and sizes; no GPU needed")
    args = parser.parse_args(argv)
    for d in args.hdims or ():
        if not 0 < d <= HIDDEN:
            parser.error(f"hdim {d} is outside 1 .. {HIDDEN}")
    for s in args.seqlens or ():
        if s <= 0 or TOKENS % s:
            parser.error(f"seqlen {s} does not divide the {TOKENS} tokens")
    args.directions = [d for d in DIRECTION_FLOPS if d in (args.directions or DIRECTION_FLOPS)]
    args.narrowed = (
        args.quick or any(x is not None for x in (args.hdims, args.seqlens, args.causal, args.impls))
        or args.directions != list(DIRECTION_FLOPS)
    )
    args.memory = not args.narrowed if args.memory is None else args.memory
    args.decode = not args.narrowed if args.decode is None else args.decode
    args.hdims = args.hdims or list(HDIMS)
    args.seqlens = args.seqlens or list(QUICK_SEQLENS if args.quick else SEQLENS)
    args.causal = args.causal or list(CAUSALS)
    args.impls = [i for i in IMPLS if i in (args.impls or IMPLS)]
    return args


def plan(args) -> list[Case]:
    """Cases in sweep order; the directions of one problem are adjacent."""
    return [
        Case(direction, args.dtype, hdim, causal, seqlen)
        for hdim in args.hdims for causal in args.causal for seqlen in args.seqlens
        for direction in args.directions
    ]


def points(cases: list[Case]) -> list[list[Case]]:
    """cases grouped by problem (all directions of one problem together)."""
    return [list(group) for _, group in itertools.groupby(cases, key=lambda c: c.point)]


def output_paths(args, gpu_slug: str) -> tuple[Path | None, Path | None]:
    csv_path = args.out
    if csv_path is None and not args.narrowed:
        csv_path = results_dir() / f"{gpu_slug}{'' if args.dtype == 'bf16' else '-' + args.dtype}.csv"
    png_path = args.plot or (csv_path.with_suffix(".png") if csv_path else None)
    return csv_path, png_path


def gpu_slug(name: str) -> str:
    """"NVIDIA H200" -> "h200"."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower().removeprefix("nvidia").strip()).strip("-")


def print_plan(args, cases: list[Case]) -> None:
    mib, gib = 2**20, 2**30
    elem = torch.finfo(DTYPES[args.dtype]).bits // 8
    groups = points(cases)
    grad = any(d in GRAD_DIRECTIONS for d in args.directions)
    print(f"directions: {' '.join(args.directions)}; {args.dtype}; impls: {' '.join(args.impls)}")
    print(f"{len(groups)} problems × {len(args.directions)} directions = {len(cases)} cases; "
          f"GFLOP per direction (bwd = 2.5 ×, fwdbwd = 3.5 × fwd; causal halves)")
    print(f"{'hdim':>4} {'causal':>6} {'seqlen':>6} {'batch':>5} {'nheads':>6}"
          + "".join(f" {d + ' GFLOP':>13}" for d in args.directions)
          + f" {'tensor MiB':>10} {'bmm GFLOP':>9} {'bmm out GiB':>11} {'check MiB':>9}"
          + (f" {'grad check GiB':>14}" if grad else ""))
    for group in groups:
        c = group[0]
        tensor = c.batch * c.seqlen * c.nheads * c.hdim * elem  # each of q, k, v, out (and dout, dq, dk, dv)
        check = c.nheads * min(PROBE_ROWS, c.seqlen) * c.seqlen * 8  # one float64 block of scores
        # float64, one head: probs, its grad, the scores' grad before and after the scale, the mask
        grad_check = c.seqlen**2 * (4 * 8 + 1)
        print(f"{c.hdim:>4} {c.causal:>6} {c.seqlen:>6} {c.batch:>5} {c.nheads:>6}"
              + "".join(f" {x.flops / 1e9:>13.1f}" for x in group)
              + f" {tensor / mib:>10.0f} {c.bmm_flops / 1e9:>9.1f}"
              f" {c.batch * c.nheads * c.seqlen**2 * elem / gib:>11.2f} {check / mib:>9.0f}"
              + (f" {grad_check / gib:>14.2f}" if grad else ""))
    if "cublas_gemm" in args.impls:
        print(f"cublas_gemm {GEMM_SIZE}³: {2 * GEMM_SIZE**3 / 1e9:.1f} GFLOP")
    csv_path, png_path = output_paths(args, "<gpu>")
    print(f"results: {csv_path or 'not written (narrowed run without --out)'}; plot: {png_path or 'none'}")
    if args.memory:
        print(f"memory, after the sweep (fwd and fwd+bwd peaks; "
              f"{memory_path(csv_path) if csv_path else 'printed only'}):")
        for m in memory_plan(args.dtype):
            tensor, lse = memory_sizes(m)
            print(f"  {m['impl']:>10} hdim {m['hdim']:>3} batch {m['batch']} nheads {m['nheads']:>2} "
                  f"seqlen {m['seqlen']:>5}: one tensor {tensor / mib:.0f} MiB, lse {lse / mib:.1f} MiB")
    else:
        print("memory: not measured (--memory to add it)")


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
        sweep = Sweep(bar)
        try:
            if gemm:
                bar.set_description("cublas_gemm")
                sweep.gemm(cases[0], seed=len(cases))
                bar.update()
            for seed, group in enumerate(points(per_case)):
                sweep.attention_point(group, args.impls, seed)
        except BaseException:
            if csv_path and sweep.rows:  # keep what was timed before the fault
                partial = csv_path.with_suffix(".partial.csv")
                write_results(partial, meta, sweep.rows)
                print(f"\nstopped by an exception; the {len(sweep.rows)} rows timed so far: {partial}",
                      file=sys.stderr)
            raise

    print_table(sweep, per_case, args.impls, args.directions)
    for (impl, why), count in sorted(sweep.skipped.items()):
        directions = "/".join(d for d in DIRECTION_FLOPS if d in sweep.skipped_directions[impl, why])
        print(f"skipped: {impl} {directions} in {count} case(s): {why}")
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
    if args.memory:
        memory_run(args, meta, csv_path)
    decode_failed = False
    if args.decode:
        import bench_decode

        decode_argv = ["--commit", meta["commit"]]
        if csv_path:
            decode_argv += ["--out", str(csv_path.with_name(csv_path.stem + "-decode.csv"))]
        else:
            decode_argv += ["--quick"]
        decode_failed = bench_decode.main(decode_argv) != 0
    return 1 if sweep.failed or decode_failed else 0


if __name__ == "__main__":
    sys.exit(main())
