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

The attention runs the KV-cache kernels (include/flashtile/sm80/kvcache_*):
the cache is read in place, dense or paged (pages of any size), and the
query heads that share a KV head are one tile, so each cache row is read
once for all of them. A sequence's keys are split across CTAs (num_splits;
0 chooses from the shapes and the GPU's SM count) and the partial results
combined. Before it one kernel (include/flashtile/sm80/kvcache_append_kernel.hpp)
appends the new keys and values, rotating the keys, and rotates the queries
into a copy: a decode step is two or three launches, not the ~25 small ops
that tensor code took. Head dims without a KV-cache kernel (other than 32, 64, 96, 128, 192,
256) gather the cache into a dense copy and run the variable-length
forward, which pads the head dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks
from ._ops import BUILT_KVCACHE_KERNELS, run_kvcache, run_kvcache_append

__all__ = ["flash_attn_with_kvcache", "paged_varlen_attention", "set_debug_checks"]

_debug_checks = False


def set_debug_checks(enabled: bool) -> None:
    """Opt-in checks of the values only the device holds: block_table's
    entries, cache_seqlens against the cache's capacity, cache_leftpad and
    cache_batch_idx. Each call then reads them on the host (a synchronization,
    and a CUDA graph can no longer capture it) and raises ValueError naming
    the argument, before the cache is written. Off by default: the kernels
    clamp lengths, and a page index outside the pool is an out-of-bounds
    read."""
    global _debug_checks
    _debug_checks = bool(enabled)


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
    _check_kernels_take(q.dtype, head_dim, batch, nheads, alibi_slopes,
                        [(t, name) for t, name in ((q, "q"), (k_cache, "k_cache"), (v_cache, "v_cache"), (k, "k"),
                                                   (v, "v"), (cache_seqlens, "cache_seqlens"),
                                                   (cache_batch_idx, "cache_batch_idx"),
                                                   (cache_leftpad, "cache_leftpad"), (block_table, "block_table"),
                                                   (alibi_slopes, "alibi_slopes"))
                         if isinstance(t, torch.Tensor)])
    device = q.device
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]  # keys a sequence can hold
    if cache_seqlens is None and k is None and rotary_cos is None:
        seqlens = None  # the whole cache: the kernels' default, no tensor to fill
    elif cache_seqlens is None or isinstance(cache_seqlens, int):
        seqlens = torch.full((batch,), capacity if cache_seqlens is None else cache_seqlens, dtype=torch.int32,
                             device=device)
    else:
        seqlens = cache_seqlens.contiguous()  # int32 (checked)

    window_left, window_right = _checks.window_pair(window_size)
    if _debug_checks:
        _check_device_values(k_cache, batch, seqlens, 0 if k is None else k.shape[1], capacity, cache_leftpad,
                             cache_batch_idx, block_table)
    appended = k is not None and k.shape[1] > 0
    used = seqlens
    if appended or rotary_cos is not None:
        # Without a mask every query is at the position of the first new key.
        q, used = run_kvcache_append(q, k_cache, v_cache, k if appended else None, v if appended else None, seqlens,
                                     cache_batch_idx, block_table, rotary_cos, rotary_sin, rotary_interleaved,
                                     q_rows_share_position=not (causal or window_left >= 0 or window_right >= 0))

    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    q, k_cache, v_cache = _padded_to_kernel_head_dim(q, k_cache, v_cache)
    out, lse = run_kvcache(q, k_cache, v_cache, softmax_scale, causal, window_left, window_right,
                           _checks.kernel_softcap(softcap), alibi_slopes, used, cache_leftpad, cache_batch_idx,
                           block_table, num_splits)
    out = out[..., :head_dim]
    return (out, lse) if return_softmax_lse else out


def _padded_to_kernel_head_dim(q, k_cache, v_cache):
    """q and the caches, zero-padded in the last dim to the next head dim
    with a kernel: for head dims without one, copies of the whole caches."""
    pad = _checks.kernel_head_dim(q.shape[-1]) - q.shape[-1]
    if not pad:
        return q, k_cache, v_cache
    return tuple(F.pad(t, (0, pad)) for t in (q, k_cache, v_cache))


class _ForwardOnly(torch.autograd.Function):
    """out as the result of an op without a backward: gradients through it
    raise rather than being silently absent."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("flash_attn_varlen_func with block_table (paged KV) has no backward, "
                                  "as in flash_attn")


def paged_varlen_attention(q, k_pages, v_pages, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k,
                           softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs):
    """flash_attn_varlen_func with block_table: q (total_q, nheads, headdim)
    packed by cu_seqlens_q; k_pages, v_pages (num_pages, page_size, nheads_k,
    headdim); sequence b's keys are its first cu_seqlens_k[b + 1] -
    cu_seqlens_k[b] positions (seqused_k[b] when given) in the pages
    block_table[b] names. Forward only, as in flash_attn.

    The KV-cache kernels run it: each sequence's queries go to the end of a
    (batch, max_seqlen_q + 1) block of rows, so the masks' bottom-right
    alignment is its own, and come back packed."""
    _check_paged_varlen(q, k_pages, v_pages, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k)
    if _debug_checks:
        lengths = (seqused_k if seqused_k is not None else cu_seqlens_k[1:] - cu_seqlens_k[:-1]).tolist()
        capacity = block_table.shape[1] * k_pages.shape[1]
        for b, n in enumerate(lengths):
            if not 0 <= n <= capacity:
                raise ValueError(f"sequence {b} has {n} keys; its block_table row holds {capacity}")
        _check_pages(block_table, lengths, k_pages.shape[1], k_pages.shape[0])
    total_q, nheads, head_dim = q.shape
    batch = block_table.shape[0]
    _check_kernels_take(q.dtype, head_dim, batch, nheads, alibi_slopes,
                        [(t, name) for t, name in ((q, "q"), (k_pages, "k"), (v_pages, "v"),
                                                   (block_table, "block_table"), (cu_seqlens_q, "cu_seqlens_q"),
                                                   (cu_seqlens_k, "cu_seqlens_k"), (seqused_k, "seqused_k"),
                                                   (alibi_slopes, "alibi_slopes")) if t is not None])
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    window_left, window_right = _checks.window_pair(window_size)
    kernel_dim = _checks.kernel_head_dim(head_dim)
    q, k_pages, v_pages = _padded_to_kernel_head_dim(q, k_pages, v_pages)
    cu_q = cu_seqlens_q.long()
    rows = torch.arange(total_q, device=q.device)
    sequence = torch.searchsorted(cu_q[1:], rows, right=True).clamp_(max=batch - 1)  # of each packed row
    lengths = (cu_q[1:] - cu_q[:-1]).clamp(0, max_seqlen_q)
    offset = rows - cu_q[sequence]
    # Row 0 of each sequence's block is a spare: rows outside every sequence
    # (past cu_seqlens_q[-1]) go there, and get out 0 and lse -inf, where
    # flash_attn leaves them unwritten. (A mask, not a filter: filtering
    # would read the device's offsets on the host.)
    inside = (offset >= 0) & (offset < lengths[sequence])
    position = torch.where(inside, max_seqlen_q + 1 - lengths[sequence] + offset, 0)
    q_rows = q.new_zeros(batch, max_seqlen_q + 1, nheads, kernel_dim)
    q_rows[sequence, position] = q
    keys = seqused_k if seqused_k is not None else (cu_seqlens_k[1:] - cu_seqlens_k[:-1]).to(torch.int32)
    out_rows, lse_rows = run_kvcache(q_rows, k_pages, v_pages, softmax_scale, causal, window_left, window_right,
                                     _checks.kernel_softcap(softcap), alibi_slopes, keys, None, None, block_table, 0)
    out = torch.where(inside[:, None, None], out_rows[sequence, position, :, :head_dim], 0)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_pages, v_pages)):
        out = _ForwardOnly.apply(out, q, k_pages, v_pages)
    if not return_attn_probs:
        return out
    lse = torch.where(inside[:, None], lse_rows[sequence, :, position], float("-inf"))
    lse = lse.t().contiguous()  # (nheads, total_q)
    return out, lse, None


def _check_device_values(k_cache, batch, seqlens, seqlen_new, capacity, cache_leftpad, cache_batch_idx,
                         block_table):
    """set_debug_checks(True)'s checks: reads the device's values."""
    lengths = [capacity] * batch if seqlens is None else seqlens.tolist()
    for b, n in enumerate(lengths):
        if not 0 <= n <= capacity - seqlen_new:
            raise ValueError(f"cache_seqlens[{b}] = {n}: with {seqlen_new} new keys the cache holds at most "
                             f"{capacity - seqlen_new} before them")
    if cache_leftpad is not None:
        for b, (pad, n) in enumerate(zip(cache_leftpad.tolist(), lengths)):
            if not 0 <= pad <= n + seqlen_new:
                raise ValueError(f"cache_leftpad[{b}] = {pad} is outside [0, {n + seqlen_new}] "
                                 "(the sequence's keys)")
    if cache_batch_idx is not None:
        entries = cache_batch_idx.tolist()
        for b, e in enumerate(entries):
            if not 0 <= e < k_cache.shape[0]:
                raise ValueError(f"cache_batch_idx[{b}] = {e} is outside the cache's {k_cache.shape[0]} entries")
        if seqlen_new and len(set(entries)) != len(entries):
            raise ValueError("cache_batch_idx: two sequences append to one cache entry")
    if block_table is not None:
        _check_pages(block_table, [n + seqlen_new for n in lengths], k_cache.shape[1], k_cache.shape[0])


def _check_pages(block_table, lengths, page_size, num_pages):
    """The pages that hold each sequence's first lengths[b] keys exist."""
    table = block_table.tolist()
    for b, n in enumerate(lengths):
        for i, page in enumerate(table[b][:-(-n // page_size)]):
            if not 0 <= page < num_pages:
                raise ValueError(f"block_table[{b}, {i}] = {page} is outside the cache's {num_pages} pages")


def _check_paged_varlen(q, k_pages, v_pages, block_table, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, seqused_k):
    for t, name in ((q, "q"), (k_pages, "k"), (v_pages, "v")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be 3-D (total_q, nheads, headdim), got shape {tuple(q.shape)}")
    if k_pages.dim() != 4 or v_pages.shape != k_pages.shape:
        raise ValueError("k and v must be paged caches of one shape (num_pages, page_size, nheads_k, headdim) "
                         f"with block_table, got {tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    if k_pages.shape[3] != q.shape[2] or k_pages.shape[2] == 0 or q.shape[1] % k_pages.shape[2] != 0:
        raise ValueError(f"k {tuple(k_pages.shape)} must have q's head dim and a number of heads dividing q's "
                         f"{q.shape[1]}")
    for t, name in ((k_pages, "k"), (v_pages, "v")):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
    _check_int32_vector(block_table, "block_table", None, q.device, dims=2)
    batch = block_table.shape[0]
    _check_int32_vector(cu_seqlens_q, "cu_seqlens_q", batch + 1, q.device)
    _check_int32_vector(cu_seqlens_k, "cu_seqlens_k", batch + 1, q.device)
    if seqused_k is not None:
        _check_int32_vector(seqused_k, "seqused_k", batch, q.device)
    if isinstance(max_seqlen_q, bool) or not isinstance(max_seqlen_q, int) or max_seqlen_q < 1:
        raise ValueError(f"max_seqlen_q must be an int >= 1, got {max_seqlen_q!r}")


def _check_kernels_take(dtype, head_dim, batch, nheads, alibi_slopes, tensors):
    """The kernels' own requirements: fp16 or bf16, a head dim whose KV-cache
    kernel is built, ALiBi's shape, one CUDA device."""
    if _checks._dtype_name(dtype) is None:
        raise ValueError(f"q must be float16 or bfloat16, got {dtype}")
    _checks.check_head_dim(head_dim, dtype, BUILT_KVCACHE_KERNELS, name="q", kind="KV-cache kernel")
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
