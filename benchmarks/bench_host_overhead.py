"""Host time per call: flashtile beside SDPA's FlashAttention-2 backend.

On a tiny problem (1 × 128 × 8 × 64, bf16, causal) the GPU work takes a few
microseconds, so a loop of calls runs at the host's pace and the time per call
is what the Python layers, the op dispatch and the launches cost. Forward
alone (under no_grad) and forward + backward (torch.autograd.grad), 300
calls after 300 of warm-up, synchronized only at the ends.

    python3 benchmarks/bench_host_overhead.py

benchmarks/NOTES.md ("The main job re-run, and the host's time per call")
has the H200 figures and what they mean for short sequences.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashtile

CALLS = 300


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("bench_host_overhead.py needs a CUDA device")
    shape = (1, 128, 8, 64)  # (batch, seqlen, nheads, headdim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def flashtile_attention():
        return flashtile.flash_attn_func(q, k, v, causal=True)

    def sdpa_flash_attention():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=True).transpose(1, 2)

    print(f"host time per call, {CALLS} calls, q/k/v {tuple(shape)} bf16 causal")
    for name, attention in (("flashtile", flashtile_attention), ("sdpa_flash", sdpa_flash_attention)):
        for mode in ("fwd", "fwdbwd"):
            def call():
                if mode == "fwd":
                    with torch.no_grad():
                        attention()
                else:
                    torch.autograd.grad(attention(), (q, k, v), dout)

            for _ in range(CALLS):  # warm-up: caches, allocator, lazy module loads
                call()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
            print(f"{name:10s} {mode:6s} {1e6 * (time.perf_counter() - start) / CALLS:7.1f} us/call")


if __name__ == "__main__":
    main()
