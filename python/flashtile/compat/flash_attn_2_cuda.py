"""flash_attn 2.x's compiled entry points (its ``flash_attn_2_cuda`` module,
``flash_attn_gpu`` inside flash_attn_interface), positional arguments and
return lists as there, on flashtile's kernels.

Libraries that build their own attention from flash_attn's pieces (ring
attention, custom autograd functions) call these, or the ``_flash_attn_*``
wrappers around them, with preallocated outputs and gradients: ``out``,
``dq``, ``dk``, ``dv`` given are written in place (and returned). What
flashtile adds to each call: any head dim up to 256 (flash_attn's C++
needs a multiple of 8; here q, k, v are zero-padded to a kernel's head dim)
and any strides (copied where the kernels cannot read them in place).

``rng_state`` is an int64 (2,) tensor on q's device; its first word keys
the dropout mask (flashtile's seed, drawn from torch's CUDA generator), the
second is unused. The backward with dropout needs the forward's rng_state.
``softmax_d`` (the backward's fourth result) is rowsum(dout * out) in
float32, computed here in PyTorch, in flash_attn's shapes: (batch, nheads,
seqlen_q rounded up to 128), varlen (nheads, total_q + 128 * batch).

``fwd_kvcache`` runs flashtile.flash_attn_with_kvcache (paged caches
included), and ``varlen_fwd`` with ``block_table`` its kernels (forward
only). Not built yet (issue 24, inference): ``varlen_fwd``'s ``leftpad_k``
and ``num_splits > 1``, each a clear error.
"""

from __future__ import annotations

import torch

from .. import _checks, _ops
from .. import interface as _interface

__all__ = ["fwd", "varlen_fwd", "bwd", "varlen_bwd", "fwd_kvcache"]


def _no_generator(gen) -> None:
    if gen is not None:
        raise RuntimeError("the `generator` argument is no longer supported; pass None (dropout draws its "
                           "Philox seed from torch's CUDA generator)")


def _not_built(what: str) -> NotImplementedError:
    return NotImplementedError(f"{what} is not implemented in flashtile yet (the inference API, issue 24)")


def _new_rng_state(device: torch.device, dropout_p: float) -> torch.Tensor:
    """flash_attn's (2,) int64 rng_state; word 0 is the kernels' seed (63
    random bits from torch's CUDA generator, no host sync) when dropout is on."""
    if dropout_p > 0:
        return torch.randint(0, 2**63 - 1, (2,), dtype=torch.int64, device=device)
    return torch.zeros(2, dtype=torch.int64, device=device)


def _dropout_seed(dropout_p: float, rng_state) -> torch.Tensor | None:
    if dropout_p == 0:
        return None
    if not isinstance(rng_state, torch.Tensor) or rng_state.dtype != torch.int64 or rng_state.numel() < 1:
        raise ValueError("rng_state must be the int64 rng_state the forward returned (needed when p_dropout > 0)")
    return rng_state.reshape(-1)[:1]


def _scale(softmax_scale, head_dim: int) -> float:
    return head_dim ** -0.5 if softmax_scale is None else float(softmax_scale)


def _check_like(t, like: torch.Tensor, name: str, like_name: str) -> None:
    """A tensor of `like`'s shape and dtype (outputs given by the caller)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.shape != like.shape or t.dtype != like.dtype or t.device != like.device:
        raise ValueError(f"{name} must have the shape, dtype and device of {like_name} "
                         f"({tuple(like.shape)}, {like.dtype}, {like.device}), got "
                         f"({tuple(t.shape)}, {t.dtype}, {t.device})")


def _check_lse(lse, shape, name: str = "softmax_lse") -> None:
    if not isinstance(lse, torch.Tensor) or lse.dtype != torch.float32 or tuple(lse.shape) != tuple(shape):
        got = f"{tuple(lse.shape)} {lse.dtype}" if isinstance(lse, torch.Tensor) else type(lse).__name__
        raise ValueError(f"{name} must be float32 of shape {tuple(shape)} (the forward's), got {got}")


def _writable_in_place(given, kernel_shape) -> bool:
    """The caller's output can take the kernels' result directly."""
    return given is not None and tuple(given.shape) == tuple(kernel_shape) and _ops.vector_friendly(given)


def _deliver(given, result: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The kernels' result (padded head dim) as what the caller gets: its own
    tensor (copied into unless the kernels wrote it in place), else a view
    of result's first head_dim columns."""
    if given is None:
        return result[..., :head_dim]
    if given is not result:
        given.copy_(result[..., :head_dim])
    return given


def _forward(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right,
             softcap, return_softmax, varlen):
    """fwd and varlen_fwd; varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k,
    max_seqlen_q, max_seqlen_k, zero_tensors) or None."""
    _checks.check_options(dropout_p=p_dropout, softmax_scale=softmax_scale, causal=is_causal,
                          window_size=(window_size_left, window_size_right), softcap=softcap,
                          alibi_slopes=alibi_slopes)
    if return_softmax and not p_dropout > 0:
        raise RuntimeError("return_softmax is only supported when p_dropout > 0.0")
    variant = _checks.variant_for(softcap, alibi_slopes, p_dropout)
    built = _interface._FWD_BUILT[variant]
    if varlen is None:
        _checks.check_fwd_tensors(q, k, v, built, alibi_slopes=alibi_slopes, variant=variant)
        seqlens = (q.shape[1], k.shape[1])
        varlen_args = (None, None, None, 0, 0)
    else:
        cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, _ = varlen
        _checks.check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, built,
                                     seqused_k=seqused_k, alibi_slopes=alibi_slopes, variant=variant)
        seqlens = (int(max_seqlen_q), int(max_seqlen_k))
        varlen_args = (cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q), int(max_seqlen_k))
    if out is not None:
        _check_like(out, q, "out", "q")
    window = _checks.kernel_window((window_size_left, window_size_right), bool(is_causal), *seqlens)
    scale = _scale(softmax_scale, q.shape[-1])
    with torch.no_grad():
        qk, kk, vk = _interface.padded_to_kernel_head_dim(q, k, v)
        out_k = out if _writable_in_place(out, qk.shape) else torch.empty(qk.shape, dtype=q.dtype, device=q.device)
        _, lse = _ops._empty_outputs(qk)
        probs = (_ops._empty_attn_probs(qk, kk, varlen_args[0], varlen_args[3], varlen_args[4], True)
                 if return_softmax else None)
        if varlen is not None and varlen[5]:  # zero_tensors: rows outside every sequence read 0 / -inf
            out_k.zero_()
            lse.fill_(float("-inf"))
            if probs is not None:
                probs.zero_()
        rng_state = _new_rng_state(q.device, p_dropout)
        _ops.run_fwd(qk, kk, vk, out_k, lse, probs, scale, bool(is_causal), *window, _checks.kernel_softcap(softcap),
                     alibi_slopes, *varlen_args, float(p_dropout), _dropout_seed(p_dropout, rng_state))
        out = _deliver(out, out_k, q.shape[-1])
    return [out, lse, _interface.unnormalized_probs(probs) if probs is not None else None, rng_state]


def _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale, is_causal,
              window_size_left, window_size_right, softcap, deterministic, rng_state, varlen):
    """bwd and varlen_bwd; varlen as in _forward (seqused_k None)."""
    _checks.check_options(dropout_p=p_dropout, softmax_scale=softmax_scale, causal=is_causal,
                          window_size=(window_size_left, window_size_right), softcap=softcap,
                          alibi_slopes=alibi_slopes)
    variant = _checks.variant_for(softcap, alibi_slopes, p_dropout)
    built = _interface._FWD_BUILT[variant]
    if varlen is None:
        _checks.check_fwd_tensors(q, k, v, built, alibi_slopes=alibi_slopes, variant=variant)
        batch, seqlen_q, nheads, _ = q.shape
        _check_lse(softmax_lse, (batch, nheads, seqlen_q))
        seqlens = (q.shape[1], k.shape[1])
        varlen_args = (None, None, None, 0, 0)
    else:
        cu_seqlens_q, cu_seqlens_k, _, max_seqlen_q, max_seqlen_k, _ = varlen
        _checks.check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, built,
                                     alibi_slopes=alibi_slopes, variant=variant)
        _check_lse(softmax_lse, (q.shape[1], q.shape[0]))
        seqlens = (int(max_seqlen_q), int(max_seqlen_k))
        varlen_args = (cu_seqlens_q, cu_seqlens_k, None, int(max_seqlen_q), int(max_seqlen_k))
    for t, name in ((dout, "dout"), (out, "out")):
        _check_like(t, q, name, "q")
    for t, name, like, like_name in ((dq, "dq", q, "q"), (dk, "dk", k, "k"), (dv, "dv", v, "v")):
        if t is not None:
            _check_like(t, like, name, like_name)
    window = _checks.kernel_window((window_size_left, window_size_right), bool(is_causal), *seqlens)
    scale = _scale(softmax_scale, q.shape[-1])
    seed = _dropout_seed(p_dropout, rng_state)
    with torch.no_grad():
        dout_k, qk, kk, vk, out_k = _interface.padded_to_kernel_head_dim(dout, q, k, v, out)
        grads = []
        for given, like in ((dq, qk), (dk, kk), (dv, vk)):
            grads.append(given if _writable_in_place(given, like.shape)
                         else torch.empty(like.shape, dtype=like.dtype, device=like.device))
        if varlen is not None and varlen[5]:  # zero_tensors
            for g in grads:
                g.zero_()
        _ops.run_bwd(dout_k, qk, kk, vk, out_k, softmax_lse, *grads, scale, bool(is_causal), bool(deterministic),
                     *window, _checks.kernel_softcap(softcap), alibi_slopes, *varlen_args, float(p_dropout), seed)
        results = [_deliver(given, g, q.shape[-1]) for given, g in zip((dq, dk, dv), grads)]
        softmax_d = _softmax_d(dout, out, varlen)
    return [*results, softmax_d]


def _softmax_d(dout: torch.Tensor, out: torch.Tensor, varlen) -> torch.Tensor:
    """rowsum(dout * out) in float32 in flash_attn's padded shapes."""
    rows = (dout.float() * out.float()).sum(-1)  # (batch, seqlen_q, nheads) or (total_q, nheads)
    if varlen is None:
        batch, seqlen_q, nheads = rows.shape
        d = rows.new_zeros(batch, nheads, _ops._round_128(seqlen_q))
        d[:, :, :seqlen_q] = rows.transpose(1, 2)
    else:
        total_q, nheads = rows.shape
        batch = varlen[0].shape[0] - 1
        d = rows.new_zeros(nheads, total_q + 128 * batch)
        d[:, :total_q] = rows.transpose(0, 1)
    return d


def fwd(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right,
        softcap, return_softmax, gen=None):
    """[out, softmax_lse, S_dmask or None, rng_state] for q (batch, seqlen_q,
    nheads, headdim), k, v (batch, seqlen_k, nheads_k, headdim)."""
    _no_generator(gen)
    return _forward(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left,
                    window_size_right, softcap, return_softmax, None)


def varlen_fwd(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
               max_seqlen_q, max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left,
               window_size_right, softcap, return_softmax, gen=None, num_splits=0):
    """fwd for a variable-length batch: q (total_q, nheads, headdim), k, v
    (total_k, nheads_k, headdim), softmax_lse (nheads, total_q)."""
    _no_generator(gen)
    if block_table is not None:
        return _paged_forward(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table,
                              alibi_slopes, max_seqlen_q, p_dropout, softmax_scale, is_causal, window_size_left,
                              window_size_right, softcap, return_softmax)
    if leftpad_k is not None:
        raise _not_built("leftpad_k")
    if num_splits > 1:
        raise RuntimeError("num_splits > 1 is not supported by flashtile's varlen forward yet (issue 24)")
    return _forward(q, k, v, out, alibi_slopes, p_dropout, softmax_scale, is_causal, window_size_left,
                    window_size_right, softcap, return_softmax,
                    (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, bool(zero_tensors)))


def _paged_forward(q, k, v, out, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes,
                   max_seqlen_q, p_dropout, softmax_scale, is_causal, window_size_left, window_size_right, softcap,
                   return_softmax):
    """varlen_fwd with block_table: k, v paged caches (forward only)."""
    from ..kvcache import paged_varlen_attention

    if leftpad_k is not None:
        raise _not_built("leftpad_k")
    if p_dropout > 0 or return_softmax:
        raise ValueError("p_dropout and return_softmax: not with block_table (paged KV has no dropout)")
    result, lse, _ = paged_varlen_attention(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                            seqused_k, softmax_scale, is_causal,
                                            (window_size_left, window_size_right), softcap, alibi_slopes, True)
    if out is not None:
        out.copy_(result)
        result = out
    return [result, lse, None, None]


def bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale, is_causal,
        window_size_left, window_size_right, softcap, deterministic, gen=None, rng_state=None):
    """[dq, dk, dv, softmax_d]; dq, dk, dv given are written in place."""
    _no_generator(gen)
    return _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale,
                     is_causal, window_size_left, window_size_right, softcap, deterministic, rng_state, None)


def varlen_bwd(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
               max_seqlen_k, p_dropout, softmax_scale, zero_tensors, is_causal, window_size_left, window_size_right,
               softcap, deterministic, gen=None, rng_state=None):
    """bwd for a variable-length batch."""
    _no_generator(gen)
    return _backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, p_dropout, softmax_scale,
                     is_causal, window_size_left, window_size_right, softcap, deterministic, rng_state,
                     (cu_seqlens_q, cu_seqlens_k, None, max_seqlen_q, max_seqlen_k, bool(zero_tensors)))


def fwd_kvcache(q, kcache, vcache, k, v, seqlens_k, rotary_cos, rotary_sin, cache_batch_idx, leftpad_k,
                block_table, alibi_slopes, out, softmax_scale, is_causal, window_size_left, window_size_right,
                softcap, is_rotary_interleaved, num_splits):
    """[out, softmax_lse] of flash_attn_with_kvcache; out given is written in place."""
    from ..kvcache import flash_attn_with_kvcache

    result, lse = flash_attn_with_kvcache(
        q, kcache, vcache, k, v, rotary_cos, rotary_sin, seqlens_k, cache_batch_idx, leftpad_k, block_table,
        softmax_scale, is_causal, (window_size_left, window_size_right), softcap, is_rotary_interleaved,
        alibi_slopes, num_splits, return_softmax_lse=True)
    if out is not None:
        out.copy_(result)
        result = out
    return [result, lse]
