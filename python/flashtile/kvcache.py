"""flash_attn_with_kvcache: new queries against a KV cache, flash_attn 2.x's
signature and semantics.

The cache is dense, k_cache (batch_cache, seqlen_cache, nheads_k, headdim),
or paged, k_cache (num_blocks, page_size, nheads_k, headdim) with
block_table (batch, max_blocks_per_seq) int32 naming each sequence's pages
in order; pages of any size. Sequence b attends to its first
cache_seqlens[b] cached keys, plus the new k, v (batch, seqlen_new,
nheads_k, headdim) when given, which are first written into the cache in
place at rows cache_seqlens[b] ... (rotated when rotary_cos/sin are given).
cache_batch_idx (int32, (batch,)) picks a dense cache's entry for each
sequence; cache_leftpad (int32, (batch,)) says where each sequence starts in
its cache entry (the keys before it are not attended). Masks, windows and
ALiBi align to the bottom-right corner of each sequence's (seqlen_q, keys)
matrix, as in flash_attn_func.

Rotary embedding (rotary_cos, rotary_sin: (seqlen_ro, rotary_dim / 2),
rotary_dim <= headdim): the new k are rotated at positions cache_seqlens[b]
+ i; q too when causal or windowed, and otherwise every query at position
cache_seqlens[b] (flash_attn's convention). rotary_interleaved pairs
features (2i, 2i + 1) rather than (i, i + rotary_dim / 2).

Nothing here reads a device value on the host, so a decode step can be
captured in a CUDA graph and replayed with new cache_seqlens.

This version runs the variable-length forward kernels (the new keys
appended with tensor ops before it): a dense cache is read in place,
cache_leftpad included, as a packed batch whose sequence b starts at row
b * seqlen_cache + cache_leftpad[b] and uses its first keys (seqused_k);
a paged cache, or a dense one picked through cache_batch_idx, is first
gathered into a dense copy. num_splits is accepted and does not change the
result; the kernels do not split a sequence's keys across CTAs yet (issue
24: paged and split-KV decode kernels).
"""

from __future__ import annotations

import torch

from . import _checks
from .rotary import apply_rotary_emb
from ._ops import BUILT_KERNELS
from .interface import flash_attn_varlen_func

__all__ = ["flash_attn_with_kvcache"]

_FWD_BUILT = {variant: _checks.fwd_combos(BUILT_KERNELS, variant) for variant in ("plain", "scoremod")}


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """out (batch, seqlen_q, nheads, headdim); with return_softmax_lse,
    (out, softmax_lse (batch, nheads, seqlen_q) float32). See the module
    docstring for the arguments."""
    _checks.check_options(softmax_scale=softmax_scale, causal=causal, window_size=window_size, softcap=softcap,
                          alibi_slopes=alibi_slopes)
    paged = block_table is not None
    batch, seqlen_q, nheads, head_dim = _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                                       cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
                                                       num_splits)
    # Everything the kernels will ask, before the cache is written.
    _check_kernels_take(q, alibi_slopes, softcap,
                        [(t, name) for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"),
                                                   (v, "v"), (cache_seqlens, "cache_seqlens"),
                                                   (cache_batch_idx, "cache_batch_idx"),
                                                   (cache_leftpad, "cache_leftpad"), (block_table, "block_table"),
                                                   (alibi_slopes, "alibi_slopes"))
                         if isinstance(t, torch.Tensor)])
    device = q.device
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]  # keys a sequence can hold
    if cache_seqlens is None:
        cache_seqlens = capacity
    if isinstance(cache_seqlens, int):
        seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    else:
        seqlens = cache_seqlens.to(torch.int32)

    window_left, window_right = _checks.window_pair(window_size)
    if rotary_cos is not None:
        if causal or window_left >= 0 or window_right >= 0:
            q = apply_rotary_emb(q, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=seqlens)
        else:  # every query at the position of the first new key
            flat = q.reshape(batch, 1, seqlen_q * nheads, head_dim)
            q = apply_rotary_emb(flat, rotary_cos, rotary_sin, rotary_interleaved,
                                 seqlen_offsets=seqlens).reshape(q.shape)
        if k is not None:
            k = apply_rotary_emb(k, rotary_cos, rotary_sin, rotary_interleaved, seqlen_offsets=seqlens)

    if k is not None:
        _append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table)
        used = seqlens + k.shape[1]
    else:
        used = seqlens

    # The keys as a packed varlen batch of `batch` entries of `capacity` rows.
    if paged:
        pages = block_table.long()
        keys = k_cache[pages].reshape(batch, capacity, *k_cache.shape[2:])
        values = v_cache[pages].reshape(batch, capacity, *v_cache.shape[2:])
    elif cache_batch_idx is not None:
        keys, values = k_cache[cache_batch_idx.long()], v_cache[cache_batch_idx.long()]
    else:
        keys, values = k_cache[:batch], v_cache[:batch]
    keys = keys.reshape(batch * capacity, *keys.shape[2:])  # a view where the cache's strides allow it
    values = values.reshape(batch * capacity, *values.shape[2:])

    starts = torch.arange(batch + 1, dtype=torch.int32, device=device) * capacity
    if cache_leftpad is not None:
        leftpad = cache_leftpad.to(torch.int32)
        starts[:batch] += leftpad
        used = used - leftpad
    cu_seqlens_q = torch.arange(batch + 1, dtype=torch.int32, device=device) * seqlen_q
    result = flash_attn_varlen_func(
        q.reshape(batch * seqlen_q, nheads, head_dim), keys, values, cu_seqlens_q, starts, seqlen_q, capacity,
        softmax_scale=softmax_scale, causal=causal, window_size=(window_left, window_right), softcap=softcap,
        alibi_slopes=alibi_slopes, return_attn_probs=return_softmax_lse, seqused_k=used)
    if not return_softmax_lse:
        return result.reshape(batch, seqlen_q, nheads, head_dim)
    out, lse, _ = result
    return (out.reshape(batch, seqlen_q, nheads, head_dim),
            lse.reshape(nheads, batch, seqlen_q).transpose(0, 1).contiguous())


def _append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table):
    """Writes k, v (batch, seqlen_new, ...) into the cache at rows
    seqlens[b] + i of sequence b's entry (dense) or pages (paged)."""
    batch, seqlen_new = k.shape[:2]
    positions = seqlens.long()[:, None] + torch.arange(seqlen_new, device=k.device)  # (batch, seqlen_new)
    if block_table is not None:
        page_size = k_cache.shape[1]
        entries = block_table.long().gather(1, positions // page_size)
        rows = positions % page_size
    else:
        entries = (torch.arange(batch, device=k.device) if cache_batch_idx is None
                   else cache_batch_idx.long())[:, None].expand(batch, seqlen_new)
        rows = positions
    k_cache[entries, rows] = k
    v_cache[entries, rows] = v


def _check_kernels_take(q, alibi_slopes, softcap, tensors):
    """The kernels' own requirements, checked as the varlen forward checks
    them, placement last: fp16 or bf16, a built head dim, ALiBi's shape, one
    CUDA device."""
    batch, _, nheads, head_dim = q.shape
    if _checks._dtype_name(q.dtype) is None:
        raise ValueError(f"q must be float16 or bfloat16, got {q.dtype}")
    variant = "scoremod" if (softcap > 0 or alibi_slopes is not None) else "plain"
    _checks.check_head_dim(head_dim, q.dtype, _FWD_BUILT[variant], name="q", variant=variant)
    if alibi_slopes is not None:
        _checks.check_alibi_slopes(alibi_slopes, batch, nheads)
    _checks.check_devices(*zip(*tensors))


def _check_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                   cache_leftpad, block_table, num_splits):
    """(batch, seqlen_q, nheads, headdim) of valid arguments; raises naming
    the first one that is not."""
    for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D, got shape {tuple(t.shape)}")
    batch, seqlen_q, nheads, head_dim = q.shape
    paged = block_table is not None
    cache_shape = "(num_blocks, page_size, nheads_k, headdim)" if paged else "(batch_cache, seqlen_cache, nheads_k, headdim)"
    nheads_k = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache {cache_shape} must have q's head dim {head_dim}, got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"q's nheads ({nheads}) must be a multiple of k_cache's nheads_k ({nheads_k})")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache")):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    if (k is None) != (v is None):
        raise ValueError("k and v: give both (new keys and values to append) or neither")
    if k is not None:
        for t, name in ((k, "k"), (v, "v")):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"{name} must be a 4-D tensor (batch, seqlen_new, nheads_k, headdim)")
            if t.shape[0] != batch or t.shape[2:] != k_cache.shape[2:] or t.dtype != q.dtype:
                raise ValueError(f"{name} must be ({batch}, seqlen_new, {nheads_k}, {head_dim}) in {q.dtype}, "
                                 f"got shape {tuple(t.shape)} in {t.dtype}")
        if v.shape != k.shape:
            raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin: give both or neither")
    if rotary_cos is not None:
        for t, name in ((rotary_cos, "rotary_cos"), (rotary_sin, "rotary_sin")):
            if not isinstance(t, torch.Tensor) or t.dim() != 2:
                raise ValueError(f"{name} must be a 2-D tensor (seqlen_ro, rotary_dim / 2)")
        if rotary_sin.shape != rotary_cos.shape:
            raise ValueError(f"rotary_sin must have rotary_cos's shape {tuple(rotary_cos.shape)}, "
                             f"got {tuple(rotary_sin.shape)}")
        if 2 * rotary_cos.shape[1] > head_dim:
            raise ValueError(f"rotary_cos: rotary_dim {2 * rotary_cos.shape[1]} is above the head dim {head_dim}")
    if cache_seqlens is not None and not isinstance(cache_seqlens, int):
        _check_int32_vector(cache_seqlens, "cache_seqlens", batch, q.device)
    if isinstance(cache_seqlens, bool) or (isinstance(cache_seqlens, int) and cache_seqlens < 0):
        raise ValueError(f"cache_seqlens must be a non-negative int or an int32 tensor, got {cache_seqlens!r}")
    if paged:
        _check_int32_vector(block_table, "block_table", None, q.device, dims=2)
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must be (batch={batch}, max_blocks_per_seq), "
                             f"got shape {tuple(block_table.shape)}")
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: not with a paged cache (block_table names each sequence's pages)")
        if cache_leftpad is not None:
            raise ValueError("cache_leftpad: not with a paged cache (as in flash_attn)")
    else:
        if cache_batch_idx is not None:
            _check_int32_vector(cache_batch_idx, "cache_batch_idx", batch, q.device)
        elif k_cache.shape[0] < batch:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences, fewer than q's batch {batch}")
    if cache_leftpad is not None:
        _check_int32_vector(cache_leftpad, "cache_leftpad", batch, q.device)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0, got {num_splits!r}")
    for t, name in ((k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"), (v, "v"), (rotary_cos, "rotary_cos"),
                    (rotary_sin, "rotary_sin")):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: they must be on one device")
    return batch, seqlen_q, nheads, head_dim


def _check_int32_vector(t, name, length, device, dims=1):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != dims or (length is not None and t.shape[0] != length):
        want = f"({length},)" if dims == 1 else f"{dims}-D"
        raise ValueError(f"{name} must be {want}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, q on {device}: they must be on one device")
