"""CPU tests of flashtile.flash_attn_with_kvcache's own work: the arguments
the kernels get for appends into a dense or paged cache, rotary embedding at
the cache positions, cache_batch_idx and cache_leftpad. Tensor-op references
stand in for the append kernel (_ops.run_kvcache_append) and, per sequence in
float32, for the KV-cache kernels (_ops.run_kvcache); the expected outputs
are built independently, one sequence at a time, from a copy of the cache
updated by hand.
test_kvcache_gpu.py runs it on the kernels.
"""

import math

import pytest
import torch

import flashtile.kvcache as kvcache
from flashtile.rotary import apply_rotary_emb
from reference import attention_ref


def reference_run_kvcache(q, k_cache, v_cache, softmax_scale, causal, window_left, window_right, softcap,
                          alibi_slopes, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, num_splits):
    """_ops.run_kvcache's contract, one sequence at a time in float32: the
    keys [cache_leftpad[b], cache_seqlens[b]) of sequence b's cache entry
    (cache_batch_idx) or pages (block_table)."""
    outs, lses = [], []
    for b in range(q.shape[0]):
        if block_table is not None:
            keys = k_cache[block_table[b].long()].flatten(0, 1)
            values = v_cache[block_table[b].long()].flatten(0, 1)
        else:
            entry = b if cache_batch_idx is None else int(cache_batch_idx[b])
            keys, values = k_cache[entry], v_cache[entry]
        lo = 0 if cache_leftpad is None else int(cache_leftpad[b])
        hi = keys.shape[0] if cache_seqlens is None else int(cache_seqlens[b])
        slopes = None if alibi_slopes is None else (alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes)
        out, lse = attention_ref(q[b:b + 1], keys[None, lo:hi], values[None, lo:hi], causal=causal,
                                 softmax_scale=softmax_scale, window_size=(window_left, window_right),
                                 softcap=softcap, alibi_slopes=slopes)
        outs.append(out[0].to(q.dtype))
        lses.append(lse[0])
    return torch.stack(outs), torch.stack(lses)


def reference_run_kvcache_append(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                                 rotary_sin, rotary_interleaved, q_rows_share_position):
    """_ops.run_kvcache_append's contract with tensor ops: k (rotated at
    positions cache_seqlens[b] + i) and v written into the cache in place,
    q rotated at the same positions or, with q_rows_share_position, every
    row at cache_seqlens[b]."""
    if rotary_cos is not None:
        if q_rows_share_position:
            batch, seqlen_q, nheads, head_dim = q.shape
            q = apply_rotary_emb(q.reshape(batch, 1, seqlen_q * nheads, head_dim), rotary_cos, rotary_sin,
                                 rotary_interleaved, seqlen_offsets=cache_seqlens).reshape(q.shape)
        else:
            q = apply_rotary_emb(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=cache_seqlens)
    if k is None:
        return q, cache_seqlens
    if rotary_cos is not None:
        k = apply_rotary_emb(k, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=cache_seqlens)
    batch, seqlen_new = k.shape[:2]
    positions = cache_seqlens.long()[:, None] + torch.arange(seqlen_new)  # (batch, seqlen_new)
    if block_table is not None:
        entries = block_table.long().gather(1, positions // k_cache.shape[1])
        rows = positions % k_cache.shape[1]
    else:
        entries = (torch.arange(batch) if cache_batch_idx is None else cache_batch_idx.long())[:, None]
        rows = positions
    k_cache[entries.expand(batch, seqlen_new), rows] = k
    v_cache[entries.expand(batch, seqlen_new), rows] = v
    return q, cache_seqlens + seqlen_new


@pytest.fixture(autouse=True)
def reference_kernels(monkeypatch):
    """The reference for the kernels, and none of their requirements (dtype,
    built head dims, CUDA: test_bad_inputs.py has those rows)."""
    monkeypatch.setattr(kvcache, "run_kvcache", reference_run_kvcache)
    monkeypatch.setattr(kvcache, "run_kvcache_append", reference_run_kvcache_append)
    monkeypatch.setattr(kvcache, "_check_kernels_take", lambda *args: None)


def expected(q, k_cache_after, seqlens_after, leftpad, **opts):
    """Each sequence's queries against keys leftpad[b] .. seqlens_after[b] of
    its (already updated) cache entry, (batch, seqlen_q, nheads, headdim)."""
    outs = []
    for b in range(q.shape[0]):
        keys = k_cache_after[0][b, leftpad[b]:seqlens_after[b]]
        values = k_cache_after[1][b, leftpad[b]:seqlens_after[b]]
        outs.append(attention_ref(q[b:b + 1], keys[None], values[None], **opts)[0][0])
    return torch.stack(outs)


def rotary_tables(seqlen, rotary_dim):
    angle = torch.rand(seqlen, rotary_dim // 2) * 2 * math.pi
    return torch.cos(angle), torch.sin(angle)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["dense", "batch_idx", "leftpad", "paged16", "paged7"])
@pytest.mark.parametrize("rotary", [None, "neox", "interleaved"])
def test_append_rotary_and_attend(layout, rotary, causal):
    batch, seqlen_q, seqlen_new, nheads, nheads_k, d, capacity = 3, 4, 3, 4, 2, 32, 56
    q = torch.randn(batch, seqlen_q, nheads, d)
    k_new, v_new = torch.randn(batch, seqlen_new, nheads_k, d), torch.randn(batch, seqlen_new, nheads_k, d)
    seqlens = torch.tensor([0, 20, 50], dtype=torch.int32)
    cos, sin = rotary_tables(capacity, 16) if rotary else (None, None)
    interleaved = rotary == "interleaved"

    # The caches as the sequences see them (batch, capacity, ...), and what the call gets.
    k_seq, v_seq = torch.randn(batch, capacity, nheads_k, d), torch.randn(batch, capacity, nheads_k, d)
    kwargs, leftpad = {}, [0] * batch
    if layout == "dense" or layout == "leftpad":
        k_cache, v_cache = k_seq.clone(), v_seq.clone()
        if layout == "leftpad":
            leftpad = [0, 5, 17]
            kwargs["cache_leftpad"] = torch.tensor(leftpad, dtype=torch.int32)
    elif layout == "batch_idx":
        idx = torch.tensor([4, 0, 2], dtype=torch.int32)
        k_cache, v_cache = torch.randn(5, capacity, nheads_k, d), torch.randn(5, capacity, nheads_k, d)
        k_cache[idx.long()], v_cache[idx.long()] = k_seq, v_seq
        kwargs["cache_batch_idx"] = idx
    else:
        page = int(layout[len("paged"):])
        blocks = -(-capacity // page)
        k_seq = torch.randn(batch, blocks * page, nheads_k, d)
        v_seq = torch.randn(batch, blocks * page, nheads_k, d)
        table = torch.randperm(batch * blocks + 4)[:batch * blocks].reshape(batch, blocks).to(torch.int32)
        k_cache, v_cache = torch.randn(batch * blocks + 4, page, nheads_k, d), torch.randn(batch * blocks + 4, page,
                                                                                          nheads_k, d)
        k_cache[table.long()] = k_seq.reshape(batch, blocks, page, nheads_k, d)
        v_cache[table.long()] = v_seq.reshape(batch, blocks, page, nheads_k, d)
        kwargs["block_table"] = table

    out, lse = kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, rotary_cos=cos, rotary_sin=sin,
                                               cache_seqlens=seqlens, causal=causal, rotary_interleaved=interleaved,
                                               return_softmax_lse=True, **kwargs)

    # By hand: rotate, append, attend.
    k_rot, q_rot = k_new, q
    if rotary:
        k_rot = apply_rotary_emb(k_new, cos, sin, interleaved, seqlen_offsets=seqlens)
        if causal:
            q_rot = apply_rotary_emb(q, cos, sin, interleaved, seqlen_offsets=seqlens)
        else:
            q_rot = torch.stack([apply_rotary_emb(q[b:b + 1].reshape(1, 1, -1, d), cos, sin, interleaved,
                                                  seqlen_offsets=int(seqlens[b])).reshape(seqlen_q, nheads, d)
                                 for b in range(batch)])
    for b in range(batch):
        s = int(seqlens[b])
        k_seq[b, s:s + seqlen_new], v_seq[b, s:s + seqlen_new] = k_rot[b], v_new[b]
    after = [int(s) + seqlen_new for s in seqlens]
    want = expected(q_rot, (k_seq, v_seq), after, leftpad, causal=causal)
    torch.testing.assert_close(out, want)
    assert lse.shape == (batch, nheads, seqlen_q) and lse.is_contiguous()

    # The new keys landed in the caller's cache, in place, where the layout puts them.
    if layout in ("dense", "leftpad"):
        torch.testing.assert_close(k_cache, k_seq, rtol=0, atol=0)
    elif layout == "batch_idx":
        torch.testing.assert_close(k_cache[kwargs["cache_batch_idx"].long()], k_seq, rtol=0, atol=0)
    else:
        gathered = k_cache[kwargs["block_table"].long()].reshape(batch, -1, nheads_k, d)
        torch.testing.assert_close(gathered, k_seq, rtol=0, atol=0)


def test_without_new_keys_int_seqlens_window_softcap_alibi():
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(2, 40, 4, 32), torch.randn(2, 40, 4, 32)
    slopes = torch.rand(2, 4)
    out = kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=33, causal=True, window_size=(7, 0),
                                          softcap=5.0, alibi_slopes=slopes)
    for b in range(2):
        want, _ = attention_ref(q[b:b + 1], k_cache[b:b + 1, :33], v_cache[b:b + 1, :33], causal=True,
                                window_size=(7, 0), softcap=5.0, alibi_slopes=slopes[b])
        torch.testing.assert_close(out[b], want[0])
    whole = kvcache.flash_attn_with_kvcache(q, k_cache, v_cache)  # no cache_seqlens: the whole cache
    torch.testing.assert_close(whole, attention_ref(q, k_cache, v_cache)[0])


@pytest.mark.parametrize("bad, match", [
    (dict(k=torch.randn(2, 1, 4, 32)), "k and v"),
    (dict(cache_seqlens=torch.tensor([1, 2])), "int32"),
    (dict(cache_seqlens=torch.tensor([1, 2, 3], dtype=torch.int32)), r"\(2,\)"),
    (dict(cache_seqlens=-1), "non-negative"),
    (dict(block_table=torch.zeros(2, 3, dtype=torch.int32), cache_leftpad=torch.zeros(2, dtype=torch.int32)),
     "cache_leftpad"),
    (dict(rotary_cos=torch.randn(40, 8)), "rotary_cos and rotary_sin"),
    (dict(rotary_cos=torch.randn(40, 24), rotary_sin=torch.randn(40, 24)), "rotary_dim"),
    (dict(num_splits=-1), "num_splits"),
])
def test_bad_arguments_are_named(bad, match):
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(2, 40, 4, 32), torch.randn(2, 40, 4, 32)
    with pytest.raises((ValueError, TypeError), match=match):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, **bad)


@pytest.fixture
def debug_checks():
    kvcache.set_debug_checks(True)
    yield
    kvcache.set_debug_checks(False)


@pytest.mark.parametrize("bad, match", [
    (dict(cache_seqlens=torch.tensor([3, 40], dtype=torch.int32)), r"cache_seqlens\[1\] = 40"),
    (dict(cache_seqlens=torch.tensor([-1, 3], dtype=torch.int32)), r"cache_seqlens\[0\] = -1"),
    (dict(cache_leftpad=torch.tensor([0, 9], dtype=torch.int32)), r"cache_leftpad\[1\] = 9"),
    (dict(cache_batch_idx=torch.tensor([0, 5], dtype=torch.int32)), r"cache_batch_idx\[1\] = 5"),
    (dict(cache_batch_idx=torch.tensor([1, 1], dtype=torch.int32)), "two sequences append to one cache entry"),
    (dict(paged=torch.tensor([[0, 1, 2], [3, 9, 4]], dtype=torch.int32),
          cache_seqlens=torch.tensor([3, 20], dtype=torch.int32)), r"block_table\[1, 1\] = 9"),
])
def test_debug_checks_name_the_device_value(debug_checks, bad, match):
    """With set_debug_checks(True), values only the device holds are read and
    checked before the cache is written; the cache is left as it was."""
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(2, 40, 2, 32), torch.randn(2, 40, 2, 32)
    kwargs = dict(cache_seqlens=torch.tensor([3, 7], dtype=torch.int32))
    if "paged" in bad:
        k_cache, v_cache = torch.randn(6, 16, 2, 32), torch.randn(6, 16, 2, 32)
        kwargs["block_table"] = bad.pop("paged")
    kwargs.update(bad)
    k_new, v_new = torch.randn(2, 1, 2, 32), torch.randn(2, 1, 2, 32)
    before = k_cache.clone()
    with pytest.raises(ValueError, match=match):
        kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, **kwargs)
    assert torch.equal(k_cache, before)


def test_debug_checks_pass_good_values(debug_checks):
    q = torch.randn(2, 1, 4, 32)
    k_cache, v_cache = torch.randn(6, 16, 2, 32), torch.randn(6, 16, 2, 32)
    table = torch.tensor([[0, 1, 2], [3, 5, -1]], dtype=torch.int32)  # the unused page slot is never read
    out = kvcache.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([40, 20], dtype=torch.int32),
                                          block_table=table)
    assert out.shape == q.shape


@pytest.mark.parametrize("index", range(40))
def test_kvcache_fuzz_harness(index):
    """The randomized KV-cache cases (fuzz_kvcache.py, whose fast tier runs on
    the GPU) with the reference standing in for the kernels: the harness's
    cache bookkeeping, NaN poisoning and references hold together."""
    import fuzz_kvcache

    built = {(d, dtype) for d in fuzz_kvcache.KERNEL_HEAD_DIMS for dtype in ("fp16", "bf16")}
    case = fuzz_kvcache.draw_case(20261202 * 1_000_003 + index, built)
    case.capacity = min(case.capacity, 300 if case.page_size is None else case.capacity)  # CPU time
    if case.page_size is None:
        case.seqlens = [min(n, case.capacity - case.seqlen_new) for n in case.seqlens]
        if case.leftpad is not None:
            case.leftpad = [min(p, n + case.seqlen_new) for p, n in zip(case.leftpad, case.seqlens)]
    fuzz_kvcache.run_case(case, device="cpu")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_paged_varlen_rows_and_alignment(causal):
    """flash_attn_varlen_func's paged KV: each sequence's queries keep their
    own bottom-right corner (sequences with fewer and more queries than
    keys), and rows past cu_seqlens_q[-1] get out 0 and lse -inf."""
    page, nheads, nheads_k, d = 4, 4, 2, 32
    lens_q, lens_k = [3, 1, 9], [7, 0, 5]
    k_pages = torch.randn(10, page, nheads_k, d)
    v_pages = torch.randn(10, page, nheads_k, d)
    table = torch.tensor([[4, 0, 7], [1, 2, 3], [9, 5, 8]], dtype=torch.int32)
    total_q = sum(lens_q) + 2  # two rows outside every sequence
    q = torch.randn(total_q, nheads, d)
    cu_q = torch.tensor([0, 3, 4, 13], dtype=torch.int32)
    cu_k = torch.tensor([0, 7, 7, 12], dtype=torch.int32)
    out, lse, _ = kvcache.paged_varlen_attention(q, k_pages, v_pages, table, cu_q, cu_k, max(lens_q), None, None,
                                                 causal, (-1, -1), 0.0, None, True)
    for b in range(3):
        q0, q1 = int(cu_q[b]), int(cu_q[b + 1])
        keys = k_pages[table[b].long()].reshape(-1, nheads_k, d)[:lens_k[b]]
        values = v_pages[table[b].long()].reshape(-1, nheads_k, d)[:lens_k[b]]
        want, want_lse = attention_ref(q[None, q0:q1], keys[None], values[None], causal=causal)
        torch.testing.assert_close(out[q0:q1], want[0])
        torch.testing.assert_close(lse[:, q0:q1], want_lse[0])
    assert torch.equal(out[13:], torch.zeros_like(out[13:]))
    assert torch.isneginf(lse[:, 13:]).all()


def test_append_without_work_launches_nothing():
    """_ops.run_kvcache_append returns before the extension where there is
    nothing to write: no sequences, or an empty q with a rotary dim of 0 and
    no new keys (the tensors here are on the CPU, which the extension would
    refuse)."""
    from flashtile import _ops
    cache = torch.zeros(2, 8, 1, 16, dtype=torch.bfloat16)
    seqlens = torch.zeros(2, dtype=torch.int32)
    empty_batch = torch.zeros(0, 1, 2, 16, dtype=torch.bfloat16)
    q, used = _ops.run_kvcache_append(empty_batch, cache, cache, None, None, seqlens[:0], None, None, None, None,
                                      False, False)
    assert q is empty_batch and used.numel() == 0
    no_rows = torch.zeros(2, 0, 2, 16, dtype=torch.bfloat16)
    table = torch.zeros(8, 0)
    q, used = _ops.run_kvcache_append(no_rows, cache, cache, None, None, seqlens, None, None, table, table, False,
                                      False)
    assert q is no_rows and used is seqlens
