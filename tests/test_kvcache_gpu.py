"""flashtile.flash_attn_with_kvcache on the GPU: dense, paged (page sizes 1,
16, 64, 256 and 7), cache_batch_idx and cache_leftpad, new keys appended and
rotated, against the float32 reference with FlashAttention's rule; and a
decode step captured in a CUDA graph, replayed with new cache_seqlens.
test_kvcache_cpu.py checks the same bookkeeping without a GPU.
"""

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from flashtile.rotary import apply_rotary_emb
from reference import assert_close_fa_rule, attention_ref

BUILT = _checks.fwd_combos(_C.built_kernels(), "plain")


def make_cache(layout, batch, capacity, nheads_k, d, dtype):
    """(k_cache, v_cache, kwargs, the keys and values as each sequence sees
    them (batch, capacity', ...) views to compare against)."""
    if layout.startswith("paged"):
        page = int(layout[len("paged"):])
        blocks = -(-capacity // page)
        pool = batch * blocks + 3
        k_cache = torch.randn(pool, page, nheads_k, d, device="cuda", dtype=dtype)
        v_cache = torch.randn(pool, page, nheads_k, d, device="cuda", dtype=dtype)
        table = torch.randperm(pool, device="cuda")[:batch * blocks].reshape(batch, blocks).to(torch.int32)
        view = lambda: (k_cache[table.long()].reshape(batch, -1, nheads_k, d),  # noqa: E731
                        v_cache[table.long()].reshape(batch, -1, nheads_k, d))
        return k_cache, v_cache, {"block_table": table}, view
    rows = batch + 2 if layout == "batch_idx" else batch
    k_cache = torch.randn(rows, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_cache = torch.randn(rows, capacity, nheads_k, d, device="cuda", dtype=dtype)
    if layout == "batch_idx":
        idx = torch.randperm(rows, device="cuda")[:batch].to(torch.int32)
        return k_cache, v_cache, {"cache_batch_idx": idx}, lambda: (k_cache[idx.long()], v_cache[idx.long()])
    return k_cache, v_cache, {}, lambda: (k_cache[:batch], v_cache[:batch])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["dense", "batch_idx", "leftpad", "paged1", "paged16", "paged64", "paged256",
                                    "paged7"])
def test_decode_and_append(layout, causal):
    if (128, "bf16") not in BUILT:
        pytest.skip(f"needs the d128 bf16 forward (built: {BUILT})")
    batch, seqlen_q, seqlen_new, nheads, nheads_k, d, capacity = 3, 2, 2, 8, 2, 128, 600
    dtype = torch.bfloat16
    q = torch.randn(batch, seqlen_q, nheads, d, device="cuda", dtype=dtype)
    k_new = torch.randn(batch, seqlen_new, nheads_k, d, device="cuda", dtype=dtype)
    v_new = torch.randn(batch, seqlen_new, nheads_k, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([0, 257, 590], dtype=torch.int32, device="cuda")
    angle = torch.rand(capacity + 256, 32, device="cuda") * 2 * math.pi
    cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    k_cache, v_cache, kwargs, view = make_cache(layout, batch, capacity, nheads_k, d, dtype)
    leftpad = [0, 0, 0]
    if layout == "leftpad":
        leftpad = [0, 100, 301]
        kwargs["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32, device="cuda")

    out, lse = flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                                 cache_seqlens=seqlens, causal=causal, rotary_interleaved=False,
                                                 return_softmax_lse=True, **kwargs)
    keys, values = view()
    k_rot = apply_rotary_emb(k_new, cos, sin, False, seqlen_offsets=seqlens)
    for b in range(batch):
        s = int(seqlens[b])
        assert torch.equal(keys[b, s:s + seqlen_new], k_rot[b]) and torch.equal(values[b, s:s + seqlen_new], v_new[b])
    if causal:
        q_rot = apply_rotary_emb(q, cos, sin, False, seqlen_offsets=seqlens)
    else:
        q_rot = apply_rotary_emb(q.reshape(batch, 1, -1, d), cos, sin, False, seqlen_offsets=seqlens).reshape(q.shape)
    for b in range(batch):
        kb = keys[b:b + 1, leftpad[b]:int(seqlens[b]) + seqlen_new]
        vb = values[b:b + 1, leftpad[b]:int(seqlens[b]) + seqlen_new]
        ref, ref_lse = attention_ref(q_rot[b:b + 1], kb, vb, causal=causal)
        pt, _ = attention_ref(q_rot[b:b + 1], kb, vb, causal=causal, upcast=False)
        assert_close_fa_rule(out[b:b + 1], ref, pt, f"out of sequence {b}")
        torch.testing.assert_close(lse[b], ref_lse[0], rtol=0, atol=1e-3)


def test_decode_step_in_a_cuda_graph():
    """No host synchronization on the path: a captured step replays with new
    cache_seqlens and new queries, and matches the eager call."""
    if (128, "bf16") not in BUILT:
        pytest.skip(f"needs the d128 bf16 forward (built: {BUILT})")
    batch, nheads, nheads_k, d, capacity = 4, 8, 2, 128, 1024
    dtype = torch.bfloat16
    q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=dtype)
    k_new = torch.randn(batch, 1, nheads_k, d, device="cuda", dtype=dtype)
    v_new = torch.randn(batch, 1, nheads_k, d, device="cuda", dtype=dtype)
    k_cache = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_cache = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([5, 100, 700, 1000], dtype=torch.int32, device="cuda")

    def step():
        return flashtile.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                                 causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for new_lens in ([6, 101, 701, 1001], [0, 3, 1022, 512]):
        seqlens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        q.copy_(torch.randn_like(q))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, step(), rtol=0, atol=0)
