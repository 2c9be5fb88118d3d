#!/usr/bin/env python3
"""Dropout: what it costs. flashtile with dropout (the scoremod kernels, an
in-kernel Philox4x32-10 call per four scores) beside flashtile without it,
and SDPA's FlashAttention-2 backend with and without the same dropout, on
the same shapes, forward and backward.

    python3 benchmarks/bench_dropout.py                       # hdim 128, 2k..16k, causal and not
    python3 benchmarks/bench_dropout.py --out benchmarks/results/h200-dropout.csv

Check before timing, for every flashtile dropout case: the forward output
and LSE on the first and last 128 query rows of batch 0 (all heads) against
float64 attention with the keep mask that tests/reference.py derives from the
documented Philox scheme (common/dropout.hpp) for the seed the call draws,
by FlashAttention's rule (error <= 2 x PyTorch's own error in the input dtype
+ the rounding of the exact result). The gradients are checked the same way
on one (batch 1, head 1, seqlen 2048) problem per causal setting (the mask of
a whole 16k head does not fit the reference's int64 Philox). A case that
misses the rule is reported FAIL and not timed. FLOPs are counted as for
plain attention (BENCHMARKING.md), so the rates compare directly.
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
from bench_score_mod import within_rule  # noqa: E402
from flashtile.interface import _dropout_seed  # noqa: E402
from plot_results import write_results  # noqa: E402
from reference import causal_mask, dropout_keep_mask, dropout_keep_probability  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ROWS = 128
DROPOUT_P = 0.1


def key_of_next_call(torch_seed: int) -> int:
    """Seeds torch and returns the Philox key flashtile's next dropout call draws."""
    torch.manual_seed(torch_seed)
    key = int(_dropout_seed(torch.device("cuda")).item())
    torch.manual_seed(torch_seed)
    return key


def dense_attention(q, k, v, rows, causal, keep, dtype):
    """(out, lse) of query rows `rows` of q (sq, h, d) against k, v (sk, h, d)
    in dtype, with keep (h, len(rows), sk) applied to the probabilities."""
    seqlen_q, seqlen_k = q.shape[0], k.shape[0]
    q, k, v = (t.to(dtype) for t in (q[rows], k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(causal_mask(seqlen_q, seqlen_k, q.device)[rows], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    p = torch.softmax(scores, dim=-1).masked_fill(~keep, 0.0) / dropout_keep_probability(DROPOUT_P)
    return torch.einsum("hqk,khd->qhd", p, v), lse


def check_forward(q, k, v, causal) -> str | None:
    """None when flashtile's dropout out and lse meet the bar on row slices of batch 0."""
    seqlen, nheads = q.shape[1], q.shape[2]
    key = key_of_next_call(seqlen)
    # The op itself: flash_attn_func gives the LSE only with return_attn_probs,
    # whose testing-only probabilities would be 16k x 16k per head here.
    out, lse, _ = torch.ops.flashtile.fwd(q, k, v, q.shape[-1] ** -0.5, causal, dropout_p=DROPOUT_P,
                                          dropout_seed=_dropout_seed(q.device))
    for rows in (slice(0, ROWS), slice(seqlen - ROWS, seqlen)):
        keep = dropout_keep_mask(key, 0, nheads, seqlen, seqlen, DROPOUT_P, "cuda", rows=rows)
        exact, exact_lse = dense_attention(q[0], k[0], v[0], rows, causal, keep, torch.float64)
        lowp, lowp_lse = dense_attention(q[0], k[0], v[0], rows, causal, keep, q.dtype)
        err, bound = within_rule(out[0, rows], exact, lowp, q.dtype)
        if err > bound:
            return f"out rows {rows.start}..: error {err:.2e} > bound {bound:.2e}"
        err, bound = within_rule(lse[0, :, rows], exact_lse, lowp_lse, torch.float32, slack=1e-4)
        if err > bound:
            return f"lse rows {rows.start}..: error {err:.2e} > bound {bound:.2e}"
    return None


def check_backward(hdim, causal) -> str | None:
    """None when flashtile's dropout gradients meet the bar on a (1, 2048, 1, hdim) problem."""
    seqlen = 2048
    torch.manual_seed(1)
    q, k, v, dout = (torch.randn(1, seqlen, 1, hdim, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    key = key_of_next_call(2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(flashtile.flash_attn_func(*leaves, dropout_p=DROPOUT_P, causal=causal), leaves, dout)
    keep = dropout_keep_mask(key, 0, 1, seqlen, seqlen, DROPOUT_P, "cuda")
    ref = {}
    for dtype in (torch.float64, q.dtype):
        ls = [t[0].to(dtype).requires_grad_() for t in (q, k, v)]
        o, _ = dense_attention(*ls, slice(None), causal, keep, dtype)
        ref[dtype] = torch.autograd.grad(o, ls, dout[0].to(dtype))
    for name, g, exact, lowp in zip(("dq", "dk", "dv"), got, ref[torch.float64], ref[q.dtype]):
        err, bound = within_rule(g[0], exact, lowp, q.dtype)
        if err > bound:
            return f"{name} (seqlen 2048): error {err:.2e} > bound {bound:.2e}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384], metavar="S")
    parser.add_argument("--out", type=Path, metavar="CSV", help="write the rows (results schema) here")
    parser.add_argument("--commit", help="commit for the CSV header (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    dtype, hdim, nheads = torch.bfloat16, args.hdim, sweep_nheads(args.hdim)
    impls = {"flashtile": 0.0, "flashtile_dropout": DROPOUT_P, "sdpa_flash": 0.0, "sdpa_flash_dropout": DROPOUT_P}
    rows, failed = [], False
    print(f"bf16 hdim {hdim}, {TOKENS} tokens, nheads {nheads}, dropout_p {DROPOUT_P}; "
          "TFLOP/s (÷ the same backend without dropout)")
    print(f"{'impl':>20} {'causal':>6} {'seqlen':>6} {'fwd':>14} {'bwd':>14}")
    for causal in (False, True):
        wrong_bwd = check_backward(hdim, causal)
        if wrong_bwd:
            print(f"{'flashtile_dropout':>20} {int(causal):>6} FAIL: {wrong_bwd}")
            failed = True
        for seqlen in args.seqlens:
            batch = TOKENS // seqlen
            torch.manual_seed(seqlen)
            q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(3))
            dout = torch.randn_like(q)
            pairs = batch * nheads * (seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen)
            flops = {"fwd": 4.0 * hdim * pairs, "bwd": 2.5 * 4.0 * hdim * pairs}
            undropped = {}
            for impl, p in impls.items():
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                if impl.startswith("sdpa"):
                    def call(*t, p=p):
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return torch.nn.functional.scaled_dot_product_attention(
                                *(x.transpose(1, 2) for x in t), is_causal=causal, dropout_p=p).transpose(1, 2)
                else:
                    if p > 0:
                        wrong = wrong_bwd or check_forward(q, k, v, causal)
                        if wrong:
                            print(f"{impl:>20} {int(causal):>6} {seqlen:>6} FAIL: {wrong}")
                            failed = True
                            continue

                    def call(*t, p=p):
                        return flashtile.flash_attn_func(*t, dropout_p=p, causal=causal)
                out = call(qg, kg, vg)
                ms = {"fwd": time_ms(lambda: call(q, k, v)),
                      "bwd": time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True))}
                tflops = {d: flops[d] / ms[d] / 1e9 for d in ms}
                base = impl.removesuffix("_dropout")
                if p == 0:
                    undropped[base] = tflops
                for direction in ("fwd", "bwd"):
                    rows.append(dict(impl=impl, direction=direction, dtype="bf16", hdim=hdim, causal=int(causal),
                                     window_left=-1, window_right=-1, batch=batch, nheads=nheads, nheads_k=nheads,
                                     seqlen_q=seqlen, seqlen_k=seqlen, ms=ms[direction],
                                     tflops=tflops[direction]))
                ref = undropped.get(base)
                cells = " ".join(f"{tflops[d]:>6.1f} ({tflops[d] / ref[d]:.2f})" if ref else f"{tflops[d]:>14.1f}"
                                 for d in ("fwd", "bwd"))
                print(f"{impl:>20} {int(causal):>6} {seqlen:>6} {cells}")
    if args.out:
        write_results(args.out, run_metadata(args), rows)
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
