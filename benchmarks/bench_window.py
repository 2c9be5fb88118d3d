#!/usr/bin/env python3
"""Sliding-window (local) attention: flashtile's time per token at a fixed
window across seqlen, beside global causal attention (flashtile and SDPA's
FlashAttention-2 backend) on the same shapes.

A window of W keys back (window_size=(W, 0), causal) costs O(seqlen · W), so
with batch · seqlen fixed at 16384 tokens its time per token should stay flat
as seqlen grows, while causal attention's grows linearly. Key blocks outside
every row's window are never visited; this is the benchmark that shows it.

    python3 benchmarks/bench_window.py                       # hdim 128, W 512 and 2048, 2k..16k
    python3 benchmarks/bench_window.py --windows 256 --hdim 64 --out benchmarks/results/h200-window.csv

Check before timing: flashtile's forward output and LSE on a block of query
rows (first and last 128 rows of batch 0, all heads) and its dq, dk, dv on a
problem of one (batch, head) of the same seqlen are compared with float64
attention under the same window (causal rows too; SDPA's are checked by
bench_attention.py),
by FlashAttention's rule (error <= 2 x PyTorch's own error in the input dtype
+ the rounding of the exact result); a case that misses it is reported FAIL
and not timed. FLOPs count the (query, key) pairs actually attended
(BENCHMARKING.md): forward 4 · d per pair, backward 2.5 x that.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import flashtile  # noqa: E402
from bench_attention import TOKENS, run_metadata, sweep_nheads, time_ms  # noqa: E402
from plot_results import write_results  # noqa: E402
from reference import window_mask  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ROWS = 128


def attended_pairs(seqlen: int, left: int) -> int:
    """Pairs (i, j) with i - left <= j <= i (square, causal window of `left` keys back)."""
    return sum(min(i, left) + 1 for i in range(seqlen))


def dense_attention(q, k, v, hidden, dtype):
    """(out, lse) of q (rows, h, d) against k, v (s, h, d) with `hidden` (rows, s) masked, in dtype."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v), lse


def check(q, k, v, dout, window) -> str | None:
    """None when flashtile's out, lse and gradients meet the bar, else what failed."""
    seqlen = q.shape[1]
    mask = window_mask(seqlen, seqlen, window, q.device)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
    for rows in (slice(0, ROWS), slice(seqlen - ROWS, seqlen)):
        exact, exact_lse = dense_attention(q[0, rows], k[0], v[0], mask[rows], torch.float64)
        lowp, lowp_lse = dense_attention(q[0, rows], k[0], v[0], mask[rows], q.dtype)
        bound = 2 * (lowp.double() - exact).abs().max().item() + (exact.to(q.dtype).double() - exact).abs().max().item()
        err = (out[0, rows].double() - exact).abs().max().item()
        if err > bound:
            return f"out rows {rows.start}..: error {err:.2e} > bound {bound:.2e}"
        lse_err = (lse[0, :, rows].double() - exact_lse).abs().max().item()
        lse_bound = 2 * (lowp_lse.double() - exact_lse).abs().max().item() + 1e-4
        if lse_err > lse_bound:
            return f"lse rows {rows.start}..: error {lse_err:.2e} > bound {lse_bound:.2e}"
    # One (batch, head): the gradients through the whole head, float64 and input dtype.
    qh, kh, vh, dh = (t[:1, :, :1].detach() for t in (q, k, v, dout))
    leaves = [t.clone().requires_grad_() for t in (qh, kh, vh)]
    got = torch.autograd.grad(flashtile.flash_attn_func(*leaves, window_size=window), leaves, dh)
    ref = {}
    for dtype in (torch.float64, q.dtype):
        ls = [t[0].to(dtype).requires_grad_() for t in (qh, kh, vh)]
        o, _ = dense_attention(*ls, mask, dtype)
        ref[dtype] = torch.autograd.grad(o, ls, dh[0].to(dtype))
    for name, g, exact, lowp in zip(("dq", "dk", "dv"), got, ref[torch.float64], ref[q.dtype]):
        bound = 2 * (lowp.double() - exact).abs().max().item() + (exact.to(q.dtype).double() - exact).abs().max().item()
        err = (g[0].double() - exact).abs().max().item()
        if err > bound:
            return f"{name}: error {err:.2e} > bound {bound:.2e}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--windows", type=int, nargs="+", default=[512, 2048], metavar="W")
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384], metavar="S")
    parser.add_argument("--out", type=Path, metavar="CSV", help="write the rows (results schema) here")
    parser.add_argument("--commit", help="commit for the CSV header (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    dtype, hdim, nheads = torch.bfloat16, args.hdim, sweep_nheads(args.hdim)
    rows, failed = [], False
    print(f"bf16 hdim {hdim}, {TOKENS} tokens, nheads {nheads}; µs per 1k tokens (fwd / bwd) and TFLOP/s")
    print(f"{'impl':>16} {'window':>6} {'seqlen':>6} {'fwd µs/1k':>10} {'bwd µs/1k':>10} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    for seqlen in args.seqlens:
        batch = TOKENS // seqlen
        torch.manual_seed(seqlen)
        q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(3))
        dout = torch.randn_like(q)
        # A window of seqlen or more keys is causal attention (flash_attn's
        # normalization): those cases are the causal row.
        cases = [("flashtile", w, (w, 0)) for w in args.windows if w < seqlen]
        cases += [("flashtile", -1, (-1, 0)), ("sdpa_flash", -1, None)]
        for impl, w, window in cases:
            pairs = attended_pairs(seqlen, seqlen if w < 0 else w) * batch * nheads
            if impl == "flashtile":
                wrong = check(q, k, v, dout, window)
                if wrong:
                    print(f"{impl:>16} {w:>6} {seqlen:>6} FAIL: {wrong}")
                    failed = True
                    continue
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            if impl == "flashtile":
                fwd = lambda: flashtile.flash_attn_func(q, k, v, window_size=window)  # noqa: E731
                out = flashtile.flash_attn_func(qg, kg, vg, window_size=window)
            else:
                def fwd():
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        return torch.nn.functional.scaled_dot_product_attention(
                            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        qg.transpose(1, 2), kg.transpose(1, 2), vg.transpose(1, 2), is_causal=True).transpose(1, 2)
            bwd = lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True)  # noqa: E731
            ms = {"fwd": time_ms(fwd), "bwd": time_ms(bwd)}
            flops = {"fwd": 4.0 * hdim * pairs, "bwd": 2.5 * 4.0 * hdim * pairs}
            for direction in ("fwd", "bwd"):
                rows.append(dict(impl=impl, direction=direction, dtype="bf16", hdim=hdim, causal=1,
                                 window_left=w, window_right=0 if w >= 0 else -1, batch=batch, nheads=nheads,
                                 nheads_k=nheads, seqlen_q=seqlen, seqlen_k=seqlen, ms=ms[direction],
                                 tflops=flops[direction] / ms[direction] / 1e9))
            per_1k = {d: 1000 * ms[d] / (TOKENS / 1000) for d in ms}
            print(f"{impl:>16} {w if w >= 0 else 'causal':>6} {seqlen:>6} {per_1k['fwd']:>10.1f} {per_1k['bwd']:>10.1f}"
                  f" {flops['fwd'] / ms['fwd'] / 1e9:>9.1f} {flops['bwd'] / ms['bwd'] / 1e9:>9.1f}")
    if args.out:
        meta = run_metadata(args)
        write_results(args.out, meta, rows)
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
