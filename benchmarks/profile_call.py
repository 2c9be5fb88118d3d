#!/usr/bin/env python3
"""One attention call for a profiler: a warm-up call, then the one to profile.

Nsight Compute or compute-sanitizer attach to a process and pick kernels by
name; this gives them the standard sweep's shapes (batch · seqlen = 16384
tokens, nheads = 2048 / hdim, bf16) without the benchmark's checks and
timing loops around them. With `--launch-skip 1 --launch-count 1`, ncu
profiles the second (warm) launch:

    ncu --clock-control none --set full --kernel-name regex:bwd_ws_kernel \\
        --launch-skip 1 --launch-count 1 -o bwd \\
        python3 benchmarks/profile_call.py --direction bwd --hdim 128 --seqlen 8192

benchmarks/ncu_stalls.py reads the report's SASS page.
"""

from __future__ import annotations

import argparse

import torch

import flashtile

TOKENS = 16384


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--direction", choices=("fwd", "bwd"), default="bwd")
    parser.add_argument("--hdim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=8192)
    parser.add_argument("--causal", type=int, choices=(0, 1), default=0)
    parser.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--deterministic", action="store_true")
    args = parser.parse_args()
    if TOKENS % args.seqlen or 2048 % args.hdim:
        parser.error("--seqlen must divide 16384 and --hdim 2048 (the standard sweep's shapes)")

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    shape = (TOKENS // args.seqlen, args.seqlen, 2048 // args.hdim, args.hdim)
    grad = args.direction == "bwd"
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=grad) for _ in range(3))
    out = flashtile.flash_attn_func(q, k, v, causal=bool(args.causal), deterministic=args.deterministic)
    dout = torch.randn_like(out)
    for _ in range(2):
        if grad:
            torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        else:
            flashtile.flash_attn_func(q, k, v, causal=bool(args.causal))
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
