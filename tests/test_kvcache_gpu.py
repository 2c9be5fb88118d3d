"""flashtile.flash_attn_with_kvcache on the GPU: dense, paged (page sizes 1,
16, 64, 256 and 7), cache_batch_idx and cache_leftpad, new keys appended and
rotated, against the float32 reference with FlashAttention's rule; and a
decode step captured in a CUDA graph, replayed with new cache_seqlens.
test_kvcache_cpu.py checks the same bookkeeping without a GPU.
"""

import dataclasses
import json
import math
import os
import re

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import flashtile
from flashtile import _C, _checks
from flashtile.rotary import apply_rotary_emb
import fuzz_kvcache
from kernel_names import cuda_kernel_names
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


@pytest.mark.parametrize("tables", ["float32", "bfloat16"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_append_and_rotary_in_one_kernel(tables, interleaved):
    """The new keys and values are written, the keys and queries rotated,
    by one kernel ahead of the attention's: strided k and v, tables in
    float32 or q's dtype, a rotary dim that is no multiple of 16. A row past
    what the entry holds is dropped (the next entry's first row stays)."""
    if (128, "bf16") not in BUILT:
        pytest.skip(f"needs the d128 bf16 forward (built: {BUILT})")
    batch, seqlen_new, nheads, nheads_k, d, capacity, rotary_dim = 2, 3, 8, 2, 128, 300, 40
    dtype = torch.bfloat16
    q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=dtype)
    k_new = torch.randn(batch, nheads_k, seqlen_new, d, device="cuda", dtype=dtype).transpose(1, 2)
    v_new = torch.randn(batch, seqlen_new, nheads_k, 2 * d, device="cuda", dtype=dtype)[..., ::2]
    k_cache = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_cache = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([capacity - 1, 40], dtype=torch.int32, device="cuda")  # the first: one row fits
    angle = torch.rand(capacity + 8, rotary_dim // 2, device="cuda") * 2 * math.pi
    cos, sin = torch.cos(angle).to(getattr(torch, tables)), torch.sin(angle).to(getattr(torch, tables))
    k_before, v_before = k_cache.clone(), v_cache.clone()

    out, kernels = cuda_kernel_names(lambda: flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens,
        rotary_interleaved=interleaved))
    assert sum("kvcache_append_kernel" in name for name in kernels) == 1, kernels
    assert all("flashtile" in name for name in kernels), kernels

    k_rot = apply_rotary_emb(k_new, cos, sin, interleaved, seqlen_offsets=seqlens)
    assert torch.equal(k_cache[0, capacity - 1], k_rot[0, 0]) and torch.equal(v_cache[0, capacity - 1], v_new[0, 0])
    assert torch.equal(k_cache[0, :capacity - 1], k_before[0, :capacity - 1])
    assert torch.equal(k_cache[1, 40:43], k_rot[1]) and torch.equal(v_cache[1, 40:43], v_new[1])
    untouched = torch.ones(capacity, dtype=torch.bool, device="cuda")
    untouched[40:43] = False  # row 0 among them: where sequence 0's dropped rows would run on to
    assert torch.equal(k_cache[1, untouched], k_before[1, untouched])
    assert torch.equal(v_cache[1, untouched], v_before[1, untouched])
    q_rot = apply_rotary_emb(q.reshape(batch, 1, -1, d), cos, sin, interleaved,
                             seqlen_offsets=seqlens).reshape(q.shape)
    for b, keys in enumerate((capacity, 43)):
        ref, _ = attention_ref(q_rot[b:b + 1], k_cache[b:b + 1, :keys], v_cache[b:b + 1, :keys])
        pt, _ = attention_ref(q_rot[b:b + 1], k_cache[b:b + 1, :keys], v_cache[b:b + 1, :keys], upcast=False)
        assert_close_fa_rule(out[b:b + 1], ref, pt, f"out of sequence {b}")


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


# ---- The KV-cache kernels themselves -----------------------------------------------------------------------

BUILT_KVCACHE = set(_C.built_kvcache_kernels())


def paged_copy(k_dense, v_dense, page):
    """The dense (batch, capacity, ...) caches scattered into a shuffled pool
    of pages, with its block_table: the same keys, paged."""
    batch, capacity = k_dense.shape[:2]
    blocks = -(-capacity // page)
    pool = batch * blocks + 2
    k_pages = torch.full((pool, page, *k_dense.shape[2:]), float("nan"), device="cuda", dtype=k_dense.dtype)
    v_pages = torch.full_like(k_pages, float("nan"))
    table = torch.randperm(pool, device="cuda")[:batch * blocks].reshape(batch, blocks).to(torch.int32)
    padded = blocks * page
    for name, dense, pages in (("k", k_dense, k_pages), ("v", v_dense, v_pages)):
        full = torch.full((batch, padded, *dense.shape[2:]), float("nan"), device="cuda", dtype=dense.dtype)
        full[:, :capacity] = dense
        pages[table.long().flatten()] = full.reshape(batch * blocks, page, *dense.shape[2:])
    return k_pages, v_pages, table


def check_against_reference(q, k_dense, v_dense, out, lse, lengths, starts=None, **ref_kwargs):
    """out and lse of each sequence b against attention over its keys
    [starts[b], lengths[b]) of the dense caches, FlashAttention's rule."""
    for b in range(q.shape[0]):
        lo = 0 if starts is None else starts[b]
        kb, vb = k_dense[b:b + 1, lo:lengths[b]], v_dense[b:b + 1, lo:lengths[b]]
        kwargs = dict(ref_kwargs)
        if kwargs.get("alibi_slopes") is not None and kwargs["alibi_slopes"].dim() == 2:
            kwargs["alibi_slopes"] = kwargs["alibi_slopes"][b:b + 1]
        ref, ref_lse = attention_ref(q[b:b + 1], kb, vb, **kwargs)
        pt, _ = attention_ref(q[b:b + 1], kb, vb, upcast=False, **kwargs)
        assert_close_fa_rule(out[b:b + 1], ref, pt, f"out of sequence {b}")
        finite = torch.isfinite(ref_lse[0])
        assert torch.equal(torch.isfinite(lse[b]), finite), f"lse of sequence {b}: -inf rows differ"
        torch.testing.assert_close(lse[b][finite], ref_lse[0][finite], rtol=0, atol=2e-3)


def ran_the_kvcache_kernel(fn):
    result, names = cuda_kernel_names(fn)
    assert any("kvcache_kernel" in n for n in names), names
    return result


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [32, 64, 96, 128, 192, 256])
@pytest.mark.parametrize("layout", ["dense", "paged16"])
@pytest.mark.parametrize("num_splits", [1, 0, 5], ids=["one_split", "auto_splits", "five_splits"])
def test_kvcache_kernel_head_dims(d, dtype, layout, num_splits):
    if (d, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype]) not in BUILT_KVCACHE:
        pytest.skip(f"the d{d} KV-cache kernel is not built")
    batch, nheads, nheads_k, capacity = 3, 8, 2, 777
    q = torch.randn(batch, 1, nheads, d, device="cuda", dtype=dtype)
    k_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    lengths = [1, 400, 777]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if layout == "dense":
        k_cache, v_cache, extra = k_dense, v_dense, {}
    else:
        k_cache, v_cache, table = paged_copy(k_dense, v_dense, 16)
        extra = {"block_table": table}
    out, lse = ran_the_kvcache_kernel(lambda: flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, causal=True, num_splits=num_splits, return_softmax_lse=True,
        **extra))
    check_against_reference(q, k_dense, v_dense, out, lse, lengths, causal=True)


FEATURES = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window_size": (37, 0)},
    "window_both_sides": {"window_size": (20, 9)},
    "softcap": {"softcap": 5.0},
    "alibi": {"alibi": True},
    "all": {"causal": True, "window_size": (50, -1), "softcap": 3.0, "alibi": True},
}


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("seqlen_q", [1, 5, 40])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_kvcache_kernel_features(feature, seqlen_q, group, num_splits):
    """Masks, softcap and ALiBi per packed row: query i of head h, with
    several queries (speculative decoding, chunked prefill) and GQA groups
    that spread them over more than one 16-row tile."""
    if (128, "bf16") not in BUILT_KVCACHE:
        pytest.skip("the d128 bf16 KV-cache kernel is not built")
    dtype, d, batch, nheads_k, capacity = torch.bfloat16, 128, 2, 2, 300
    nheads = nheads_k * group
    kwargs = dict(FEATURES[feature])
    q = torch.randn(batch, seqlen_q, nheads, d, device="cuda", dtype=dtype)
    k_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    lengths = [3 if seqlen_q < 5 else seqlen_q - 2, 299]  # one sequence with fewer keys than queries
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if kwargs.pop("alibi", False):
        kwargs["alibi_slopes"] = torch.rand(batch, nheads, device="cuda", dtype=torch.float32)
    out, lse = ran_the_kvcache_kernel(lambda: flashtile.flash_attn_with_kvcache(
        q, k_dense, v_dense, cache_seqlens=seqlens, num_splits=num_splits, return_softmax_lse=True, **kwargs))
    check_against_reference(q, k_dense, v_dense, out, lse, lengths, **kwargs)


@pytest.mark.parametrize("page", [1, 16, 48, 64, 256, 512])
def test_kvcache_kernel_page_sizes(page):
    """Every page size reads the same keys as the dense cache: empty, partial
    and full sequences; NaN in the pool outside them must not leak in."""
    if (128, "bf16") not in BUILT_KVCACHE:
        pytest.skip("the d128 bf16 KV-cache kernel is not built")
    dtype, d, batch, nheads, nheads_k, capacity = torch.bfloat16, 128, 4, 16, 4, 1100
    q = torch.randn(batch, 2, nheads, d, device="cuda", dtype=dtype)
    k_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    v_dense = torch.randn(batch, capacity, nheads_k, d, device="cuda", dtype=dtype)
    lengths = [0, 1, 555, capacity]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    k_cache, v_cache, table = paged_copy(k_dense, v_dense, page)
    dense_out, dense_lse = flashtile.flash_attn_with_kvcache(q, k_dense, v_dense, cache_seqlens=seqlens,
                                                             num_splits=3, return_softmax_lse=True)
    out, lse = ran_the_kvcache_kernel(lambda: flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, num_splits=3, return_softmax_lse=True))
    check_against_reference(q, k_dense, v_dense, out, lse, lengths)
    assert torch.equal(out, dense_out) and torch.equal(lse, dense_lse), "paged and dense caches differ"


def test_kvcache_kernel_more_splits_than_key_blocks():
    """Splits left without a key block add nothing; the result is the one
    split's up to rounding."""
    if (128, "bf16") not in BUILT_KVCACHE:
        pytest.skip("the d128 bf16 KV-cache kernel is not built")
    dtype, d = torch.bfloat16, 128
    q = torch.randn(2, 1, 8, d, device="cuda", dtype=dtype)
    k = torch.randn(2, 200, 8, d, device="cuda", dtype=dtype)
    v = torch.randn(2, 200, 8, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([130, 7], dtype=torch.int32, device="cuda")
    out, lse = flashtile.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, num_splits=128,
                                                 return_softmax_lse=True)
    check_against_reference(q, k, v, out, lse, [130, 7])


def kvcache_pipeline_of(names):
    """(stages of the KV-cache kernel among `names`, whether the combine
    kernel ran)."""
    stages = None
    for name in names:
        found = (re.search(r"KvCacheTraits<\d+, [^,<>]+, (\d+)>", name)
                 or re.search(r"KvCacheTraitsILi\d+EN7cutlass\d+\w+?_tELi(\d+)E", name))
        if "kvcache_kernel" in name and found:
            stages = int(found[1])
    assert stages is not None, names
    return stages, any("kvcache_combine_kernel" in n for n in names)


@pytest.mark.parametrize("page", [0, 1, 16, 64], ids=["dense", "paged1", "paged16", "paged64"])
@pytest.mark.parametrize("seqlen_q", [1, 3])
@pytest.mark.parametrize("num_splits", [1, 2, 7, 16, 17, 40])
def test_kvcache_kernel_epilogues_and_pipelines(num_splits, seqlen_q, page):
    """Both ways the d128 kernel ends and both its pipelines: one split
    writes O, more leave partials for the combine kernel; a split of at most
    16 key blocks, dense or in pages of any size (their rows located two
    blocks ahead), takes the 3-stage pipeline where the GPU gives a CTA
    100 KB of shared memory."""
    if (128, "bf16") not in BUILT_KVCACHE:
        pytest.skip("the d128 bf16 KV-cache kernel is not built")
    dtype, d, capacity = torch.bfloat16, 128, 4096
    q = torch.randn(2, seqlen_q, 16, d, device="cuda", dtype=dtype)
    k = torch.randn(2, capacity, 4, d, device="cuda", dtype=dtype)
    v = torch.randn(2, capacity, 4, d, device="cuda", dtype=dtype)
    seqlens = torch.tensor([3001, 17], dtype=torch.int32, device="cuda")
    if page:
        k_cache, v_cache, table = paged_copy(k, v, page)
    else:
        k_cache, v_cache, table = k, v, None
    (out, lse), names = cuda_kernel_names(lambda: flashtile.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens=seqlens, block_table=table, causal=True, num_splits=num_splits,
        return_softmax_lse=True))
    check_against_reference(q, k, v, out, lse, [3001, 17], causal=True)
    props = torch.cuda.get_device_properties(q.device)
    deep = -(-capacity // 64 // num_splits) <= 16 and props.shared_memory_per_block_optin >= 100 * 1024
    assert kvcache_pipeline_of(names) == (3 if deep else 2, num_splits > 1), names


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page", [1, 16, 256])
@pytest.mark.parametrize("d", [64, 80, 128])
def test_varlen_paged_kv(causal, page, d):
    """flash_attn_varlen_func with block_table: the same result as on the
    sequences' keys packed densely, sequences of unequal query and key
    lengths (some with more queries than keys); forward only."""
    if (flashtile_kernel_dim(d), "bf16") not in BUILT_KVCACHE:
        pytest.skip(f"the d{flashtile_kernel_dim(d)} KV-cache kernel is not built")
    dtype, nheads, nheads_k = torch.bfloat16, 6, 2
    lens_q, lens_k = [5, 1, 70, 33], [40, 1, 300, 20]
    batch, max_k = len(lens_q), max(lens_k)
    k_dense = torch.randn(batch, max_k, nheads_k, d, device="cuda", dtype=dtype)
    v_dense = torch.randn(batch, max_k, nheads_k, d, device="cuda", dtype=dtype)
    k_pages, v_pages, table = paged_copy(k_dense, v_dense, page)
    q = torch.randn(sum(lens_q), nheads, d, device="cuda", dtype=dtype, requires_grad=True)
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device="cuda")
    out, lse, _ = flashtile.flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lens_q), max_k,
                                                   causal=causal, block_table=table, return_attn_probs=True)
    k_packed = torch.cat([k_dense[b, :lens_k[b]] for b in range(batch)])
    v_packed = torch.cat([v_dense[b, :lens_k[b]] for b in range(batch)])
    ref_out, ref_lse, _ = flashtile.flash_attn_varlen_func(q.detach(), k_packed, v_packed, cu_q, cu_k, max(lens_q),
                                                           max_k, causal=causal, return_attn_probs=True)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=2e-2)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse[finite], ref_lse[finite], rtol=0, atol=1e-3)
    with pytest.raises(NotImplementedError, match="no backward"):
        out.sum().backward()


def flashtile_kernel_dim(d):
    return _checks.kernel_head_dim(d)


KVCACHE_FUZZ_SEED = int(os.environ.get("FLASHTILE_KVCACHE_FUZZ_SEED", "20261202"))
KVCACHE_FUZZ_CASES = int(os.environ.get("FLASHTILE_KVCACHE_FUZZ_CASES", "80"))


@pytest.mark.parametrize("index", range(KVCACHE_FUZZ_CASES))
def test_kvcache_fuzz_case(index):
    """The fast tier of fuzz_kvcache.py: every argument drawn jointly, against
    float64 attention, NaN wherever no visible key is."""
    built = fuzz_kvcache.built_kvcache()
    if not built:
        pytest.skip("no KV-cache kernel in this build")
    case = fuzz_kvcache.draw_case(KVCACHE_FUZZ_SEED * 1_000_003 + index, built)
    try:
        fuzz_kvcache.run_case(case)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\ncase: {json.dumps(dataclasses.asdict(case))}\n"
                             f"rerun: python tests/fuzz_kvcache.py --replay {case.seed}") from None
