#!/usr/bin/env python3
"""Variable-length batches: flashtile_varlen on a packed batch of mixed
lengths, beside SDPA's FlashAttention-2 backend and flashtile on the same
batch padded to its longest sequence (causal, so each valid query row sees
only its own sequence's keys; the padding rows are wasted work).

    python3 benchmarks/bench_varlen.py                  # hdim 128, 32768 tokens
    python3 benchmarks/bench_varlen.py --hdim 64 --out benchmarks/results/h200-varlen.csv

The lengths are a fixed-seed draw, log-uniform in [128, 8192], up to the
token budget: a realistic mix for packed training batches. Check before
timing: flashtile_varlen's out and LSE for the shortest and the longest
sequence, and dq, dk, dv of a one-head call on those two, against float64
attention by FlashAttention's rule (error <= 2 x PyTorch's own error in the
input dtype + the rounding of the exact result); a FAIL is not timed.
Every implementation's TFLOP/s count only the useful (query, key) pairs of
the packed batch (forward 4 · d per pair, backward 2.5 x that), so the
padded runs' rates include the waste.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import flashtile  # noqa: E402
from bench_attention import run_metadata, sweep_nheads, time_ms  # noqa: E402
from plot_results import write_results  # noqa: E402
from reference import causal_mask  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402


def draw_lengths(tokens: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < tokens:
        n = int(math.exp(rng.uniform(math.log(128), math.log(8192))))
        lengths.append(min(n, tokens - sum(lengths)))
    return lengths


def dense(q, k, v, dtype):
    """Causal attention of one sequence (s, h, d) in dtype: (out, lse)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(causal_mask(q.shape[0], k.shape[0], q.device), float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v), torch.logsumexp(scores, dim=-1)


def within_rule(got, exact, lowp, dtype) -> bool:
    bound = 2 * (lowp.double() - exact).abs().max().item() + (exact.to(dtype).double() - exact).abs().max().item()
    return (got.double() - exact).abs().max().item() <= bound + 1e-6


def check(q, k, v, cu, lengths) -> str | None:
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True,
                                                   return_attn_probs=True)
    picks = sorted({lengths.index(min(lengths)), lengths.index(max(lengths))})
    for b in picks:
        rows = slice(int(cu[b]), int(cu[b + 1]))
        exact, exact_lse = dense(q[rows], k[rows], v[rows], torch.float64)
        lowp, lowp_lse = dense(q[rows], k[rows], v[rows], q.dtype)
        if not within_rule(out[rows], exact, lowp, q.dtype):
            return f"out of sequence {b} (length {lengths[b]})"
        if not within_rule(lse[:, rows], exact_lse, lowp_lse, torch.float32):
            return f"lse of sequence {b} (length {lengths[b]})"
    # Gradients: one head of the two picked sequences, packed on their own.
    seqs = [slice(int(cu[b]), int(cu[b + 1])) for b in picks]
    qs, ks, vs = (torch.cat([t[r, :1] for r in seqs]).detach() for t in (q, k, v))
    dout = torch.randn_like(qs)
    sub_lengths = [lengths[b] for b in picks]
    sub_cu = torch.tensor([0] + list(torch.tensor(sub_lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    leaves = [t.clone().requires_grad_() for t in (qs, ks, vs)]
    got = torch.autograd.grad(flashtile.flash_attn_varlen_func(*leaves, sub_cu, sub_cu, max(sub_lengths),
                                                               max(sub_lengths), causal=True), leaves, dout)
    start = 0
    for n in sub_lengths:
        rows = slice(start, start + n)
        ref = {}
        for dtype in (torch.float64, q.dtype):
            ls = [t[rows].to(dtype).requires_grad_() for t in (qs, ks, vs)]
            ref[dtype] = torch.autograd.grad(dense(*ls, dtype)[0], ls, dout[rows].to(dtype))
        for name, g, exact, lowp in zip(("dq", "dk", "dv"), got, ref[torch.float64], ref[q.dtype]):
            if not within_rule(g[rows], exact, lowp, q.dtype):
                return f"{name} of a sequence of length {n}"
        start += n
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--out", type=Path, metavar="CSV", help="write the rows (results schema) here")
    parser.add_argument("--commit", help="commit for the CSV header (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    dtype, hdim, nheads = torch.bfloat16, args.hdim, sweep_nheads(args.hdim)
    lengths = draw_lengths(args.tokens)
    batch, total, max_len = len(lengths), sum(lengths), max(lengths)
    pairs = nheads * sum(n * (n + 1) // 2 for n in lengths)
    flops = {"fwd": 4.0 * hdim * pairs, "bwd": 2.5 * 4.0 * hdim * pairs}
    print(f"bf16 hdim {hdim}, nheads {nheads}, causal; {batch} sequences, {total} tokens "
          f"(lengths {min(lengths)}..{max_len}, padded batch {batch} x {max_len} = {batch * max_len} rows)")
    torch.manual_seed(0)
    q, k, v = (torch.randn(total, nheads, hdim, device="cuda", dtype=dtype) for _ in range(3))
    dout = torch.randn_like(q)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
    wrong = check(q, k, v, cu, lengths)
    if wrong:
        print(f"flashtile_varlen FAIL: {wrong}")
        return 1

    def pad(t):
        p = t.new_zeros(batch, max_len, *t.shape[1:])
        for b, n in enumerate(lengths):
            p[b, :n] = t[int(cu[b]):int(cu[b]) + n]
        return p

    qp, kp, vp, doutp = (pad(t) for t in (q, k, v, dout))

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)

    cases = {
        "flashtile_varlen": ((q, k, v, dout), lambda q, k, v: flashtile.flash_attn_varlen_func(
            q, k, v, cu, cu, max_len, max_len, causal=True)),
        "flashtile_padded": ((qp, kp, vp, doutp), lambda q, k, v: flashtile.flash_attn_func(q, k, v, causal=True)),
        "sdpa_flash_padded": ((qp, kp, vp, doutp), sdpa),
    }
    rows = []
    print(f"{'impl':>20} {'fwd ms':>8} {'bwd ms':>8} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    for impl, ((a, b, c, d), call) in cases.items():
        leaves = [t.detach().requires_grad_() for t in (a, b, c)]
        out = call(*leaves)
        ms = {"fwd": time_ms(lambda: call(a, b, c)),
              "bwd": time_ms(lambda: torch.autograd.grad(out, leaves, d, retain_graph=True))}
        tflops = {x: flops[x] / ms[x] / 1e9 for x in ms}
        print(f"{impl:>20} {ms['fwd']:>8.3f} {ms['bwd']:>8.3f} {tflops['fwd']:>9.1f} {tflops['bwd']:>9.1f}")
        for direction in ("fwd", "bwd"):
            rows.append(dict(impl=impl, direction=direction, dtype="bf16", hdim=hdim, causal=1, window_left=-1,
                             window_right=-1, batch=batch, nheads=nheads, nheads_k=nheads, seqlen_q=max_len,
                             seqlen_k=max_len, ms=ms[direction], tflops=tflops[direction]))
    if args.out:
        write_results(args.out, run_metadata(args), rows)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
