#!/usr/bin/env python3
"""softcap and ALiBi: what they cost. flashtile's scoremod kernels with
softcap, ALiBi and both, beside flashtile's plain kernels and SDPA's
FlashAttention-2 backend (plain attention; SDPA's flash backend has neither
modifier) on the same shapes, forward and backward.

    python3 benchmarks/bench_score_mod.py                     # hdim 128, 2k..16k, causal and not
    python3 benchmarks/bench_score_mod.py --hdim 64 --out benchmarks/results/h200-scoremod.csv
    python3 benchmarks/bench_score_mod.py --mma-sync          # + each modifier on the mma.sync kernels

--mma-sync adds rows `<impl>_mma_sync`: the same calls with dispatch limited
to the sm80 path (flashtile._C.limit_dispatch_arch), so that on an H100/H200
the wgmma kernels are timed beside the mma.sync ones in one process (there
it needs a build with FLASHTILE_SM80_ON_SM90=ON: by default a build with 90a
compiles the sm80 forward for its other archs only).

Check before timing: every flashtile case's forward output and LSE on the
first and last 128 query rows of batch 0 (all heads), and its dq, dk, dv on
one (batch, head) of the same seqlen, are compared with float64 attention
with the same modifiers by FlashAttention's rule (error <= 2 x PyTorch's own
error in the input dtype + the rounding of the exact result); a case that
misses it is reported FAIL and not timed. FLOPs are counted as for plain
attention (BENCHMARKING.md), so the rates compare directly.
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
from kernel_names import sm80_forward_runs_here  # noqa: E402
from plot_results import write_results  # noqa: E402
from reference import alibi_bias, causal_mask  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ROWS = 128
SOFTCAP = 30.0  # Gemma 2's attention softcap is 50, Grok-1's 30


def alibi_slopes(nheads: int) -> torch.Tensor:
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / nheads) for h in range(nheads)], device="cuda")


def dense_attention(q, k, v, rows, causal, softcap, slopes, dtype):
    """(out, lse) of query rows `rows` of q (sq, h, d) against k, v (sk, h, d), in dtype."""
    seqlen_q, nheads, seqlen_k = q.shape[0], q.shape[1], k.shape[0]
    q, k, v = (t.to(dtype) for t in (q[rows], k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if slopes is not None:
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        bias = alibi_bias(slopes, 1, nheads, seqlen_q, seqlen_k, q.device, wide)[0, :, rows]
        scores = (scores.to(wide) + bias).to(dtype)
    if causal:
        scores = scores.masked_fill(causal_mask(seqlen_q, seqlen_k, q.device)[rows], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v), lse


def within_rule(got, exact, lowp, dtype, slack=0.0) -> tuple[float, float]:
    bound = 2 * (lowp.double() - exact).abs().max().item() + (exact.to(dtype).double() - exact).abs().max().item()
    return (got.double() - exact).abs().max().item(), bound + slack


def check(q, k, v, dout, causal, softcap, slopes) -> str | None:
    """None when flashtile's out, lse and gradients meet the bar, else what failed."""
    seqlen = q.shape[1]
    kwargs = dict(causal=causal, softcap=softcap, alibi_slopes=slopes)
    out, lse, _ = flashtile.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs)
    for rows in (slice(0, ROWS), slice(seqlen - ROWS, seqlen)):
        exact, exact_lse = dense_attention(q[0], k[0], v[0], rows, causal, softcap, slopes, torch.float64)
        lowp, lowp_lse = dense_attention(q[0], k[0], v[0], rows, causal, softcap, slopes, q.dtype)
        err, bound = within_rule(out[0, rows], exact, lowp, q.dtype)
        if err > bound:
            return f"out rows {rows.start}..: error {err:.2e} > bound {bound:.2e}"
        err, bound = within_rule(lse[0, :, rows].transpose(0, 1), exact_lse.transpose(0, 1),
                                 lowp_lse.transpose(0, 1), torch.float32, slack=1e-4)
        if err > bound:
            return f"lse rows {rows.start}..: error {err:.2e} > bound {bound:.2e}"
    # One (batch, head): the gradients through the whole head.
    qh, kh, vh, dh = (t[:1, :, :1].detach() for t in (q, k, v, dout))
    head_slopes = None if slopes is None else slopes[:1]
    leaves = [t.clone().requires_grad_() for t in (qh, kh, vh)]
    got = torch.autograd.grad(flashtile.flash_attn_func(*leaves, causal=causal, softcap=softcap,
                                                        alibi_slopes=head_slopes), leaves, dh)
    ref = {}
    for dtype in (torch.float64, q.dtype):
        ls = [t[0].to(dtype).requires_grad_() for t in (qh, kh, vh)]
        o, _ = dense_attention(*ls, slice(None), causal, softcap, head_slopes, dtype)
        ref[dtype] = torch.autograd.grad(o, ls, dh[0].to(dtype))
    for name, g, exact, lowp in zip(("dq", "dk", "dv"), got, ref[torch.float64], ref[q.dtype]):
        err, bound = within_rule(g[0], exact, lowp, q.dtype)
        if err > bound:
            return f"{name}: error {err:.2e} > bound {bound:.2e}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096, 8192, 16384], metavar="S")
    parser.add_argument("--out", type=Path, metavar="CSV", help="write the rows (results schema) here")
    parser.add_argument("--commit", help="commit for the CSV header (default: git rev-parse HEAD)")
    parser.add_argument("--mma-sync", action="store_true",
                        help="also time each flashtile case on the mma.sync (sm80) kernels")
    args = parser.parse_args(argv)
    if args.mma_sync and not sm80_forward_runs_here():
        parser.error("--mma-sync: this build has no sm80 forward for this H100/H200 "
                     "(rebuild with FLASHTILE_SM80_ON_SM90=ON)")
    dtype, hdim, nheads = torch.bfloat16, args.hdim, sweep_nheads(args.hdim)
    slopes = alibi_slopes(nheads)
    mods = {"flashtile": (0.0, None), "flashtile_softcap": (SOFTCAP, None),
            "flashtile_alibi": (0.0, slopes), "flashtile_softcap_alibi": (SOFTCAP, slopes)}
    if args.mma_sync:
        mods.update({f"{impl}_mma_sync": mod for impl, mod in list(mods.items())})
    rows, failed = [], False
    print(f"bf16 hdim {hdim}, {TOKENS} tokens, nheads {nheads}, softcap {SOFTCAP}; TFLOP/s (÷ flashtile plain)")
    print(f"{'impl':>24} {'causal':>6} {'seqlen':>6} {'fwd':>14} {'bwd':>14}")
    for causal in (False, True):
        for seqlen in args.seqlens:
            batch = TOKENS // seqlen
            torch.manual_seed(seqlen)
            q, k, v = (torch.randn(batch, seqlen, nheads, hdim, device="cuda", dtype=dtype) for _ in range(3))
            dout = torch.randn_like(q)
            pairs = batch * nheads * (seqlen * (seqlen + 1) // 2 if causal else seqlen * seqlen)
            flops = {"fwd": 4.0 * hdim * pairs, "bwd": 2.5 * 4.0 * hdim * pairs}
            plain = {}
            for impl in [*mods, "sdpa_flash"]:
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                if impl == "sdpa_flash":
                    def call(*t):
                        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                            return torch.nn.functional.scaled_dot_product_attention(
                                *(x.transpose(1, 2) for x in t), is_causal=causal).transpose(1, 2)
                else:
                    softcap, mod_slopes = mods[impl]
                    flashtile._C.limit_dispatch_arch("sm80" if impl.endswith("_mma_sync") else "sm90")
                    wrong = check(q, k, v, dout, causal, softcap, mod_slopes)
                    if wrong:
                        print(f"{impl:>24} {int(causal):>6} {seqlen:>6} FAIL: {wrong}")
                        failed = True
                        continue

                    def call(*t, softcap=softcap, mod_slopes=mod_slopes):
                        return flashtile.flash_attn_func(*t, causal=causal, softcap=softcap, alibi_slopes=mod_slopes)
                out = call(qg, kg, vg)
                ms = {"fwd": time_ms(lambda: call(q, k, v)),
                      "bwd": time_ms(lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True))}
                tflops = {d: flops[d] / ms[d] / 1e9 for d in ms}
                if impl == "flashtile":
                    plain = tflops
                for direction in ("fwd", "bwd"):
                    rows.append(dict(impl=impl, direction=direction, dtype="bf16", hdim=hdim, causal=int(causal),
                                     window_left=-1, window_right=-1, batch=batch, nheads=nheads, nheads_k=nheads,
                                     seqlen_q=seqlen, seqlen_k=seqlen, ms=ms[direction],
                                     tflops=tflops[direction]))
                cells = " ".join(f"{tflops[d]:>6.1f} ({tflops[d] / plain[d]:.2f})" if plain else f"{tflops[d]:>14.1f}"
                                 for d in ("fwd", "bwd"))
                print(f"{impl:>24} {int(causal):>6} {seqlen:>6} {cells}")
    if args.out:
        write_results(args.out, run_metadata(args), rows)
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
