"""Public attention functions, call-compatible with flash_attn 2.x.

Tensors use flash_attn's layout: q (batch, seqlen_q, nheads, headdim), k and v
(batch, seqlen_k, nheads_k, headdim), with nheads a multiple of nheads_k
(grouped-query / multi-query attention). Causal masking is aligned to the
bottom-right corner of the (seqlen_q, seqlen_k) score matrix: query row i sees
keys j <= i + seqlen_k - seqlen_q, and a row that sees no key gets output 0
and logsumexp -inf.

Head dims 32, 64, 96, 128, 192 and 256 run kernels of their own; any other
head dim up to 256 runs the next larger one with q, k and v zero-padded (a
copy of each), and out comes back as a view of its first headdim columns, as
in flash_attn. Larger head dims raise ValueError. Any strides are accepted:
a tensor whose last dim is not contiguous, or whose start or other strides
are not multiples of 16 bytes, is copied into a contiguous one first (the
kernels load 16-byte vectors).

``window_size=(left, right)`` is local (sliding-window) attention, aligned to
the bottom-right corner like causal: query row i sees keys j with
i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right, a side
unbounded when negative, exactly as flash_attn's docstring defines it, for
every seqlen_q and seqlen_k (flash_attn 2.x's kernels hide other keys when
seqlen_q > seqlen_k; docs/compatibility.md). window_size is any pair of
ints, or a tensor of two; causal=True sets right to 0. Key blocks outside
every row's window are never visited, and a row whose window holds no key
gets output 0 and logsumexp -inf.

``softcap > 0`` caps the scaled scores at softcap * tanh(score / softcap)
before the mask and the softmax (0 or less is off, as in flash_attn), and
``alibi_slopes`` (float32, (nheads,) or (batch, nheads)) subtracts
slope * |i + seqlen_k - seqlen_q - j| from score (i, j) after that, both as in
flash_attn; either one runs kernels of their own (the "scoremod" variant), and
both are differentiated through (the slopes get no gradient). The logsumexp is that of the modified scores.

The varlen functions take a batch of sequences of different lengths packed
along the first dim, q (total_q, nheads, headdim) and k, v (total_k,
nheads_k, headdim), with int32 offsets cu_seqlens_q and cu_seqlens_k
(batch + 1 entries, starting at 0) and the longest lengths max_seqlen_q and
max_seqlen_k; masks, windows and ALiBi align to each sequence's own
bottom-right corner, and no work is spent past a sequence's end. lse is
(nheads, total_q). As in flash_attn, rows outside every sequence are left
unwritten, and the offsets are not read on the host (that would
synchronize): the kernels clamp them into the tensors. ``seqused_k``
(int32, (batch,)), an addition to flash_attn's signature, makes sequence b
attend only to its first seqused_k[b] keys (the others get zero dk, dv).
With ``block_table`` (paged KV, forward only) k and v are paged caches, run
by the KV-cache kernels (kvcache.py).

``dropout_p > 0`` drops each attention probability with that probability,
rounded to a multiple of 1/256 (FlashAttention-2's 8-bit threshold), and
scales the kept ones by 1 / (1 - dropout_p), dropout_p as given, as flash_attn
does; it runs the "scoremod" kernels. The keep/drop decisions come from a counter-based Philox
generator inside the kernels, keyed by a seed (63 random bits) that each call draws
from torch's CUDA generator on q's device (one small torch.randint on the
device, no host sync): torch.manual_seed reproduces a call, a captured CUDA
graph draws a new seed on each replay, and the backward regenerates the same
mask from the saved seed. With dropout, ``return_attn_probs=True`` also
returns flash_attn's testing-only S_dmask (batch, nheads, seqlen_q rounded up
to 128, seqlen_k rounded up to 128) in q's dtype: exp(score - m), m the row's
largest score (the softmax before its normalization, so each row's largest
entry is 1), where the kernels kept it, its negation where they dropped it
(the sign bit set even where it is 0), 0 outside the sequence; it comes from a
separate, slow kernel. Without dropout that slot is None, as in flash_attn.

The functions are differentiable, once (flashtile::fwd's autograd kernel;
a double backward raises). By
default the backward accumulates dq with fp32 atomic adds, whose order varies
from run to run in the last bits; ``deterministic=True`` sums dq in a fixed
order instead (bitwise-reproducible gradients, a slower backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import _checks
from ._ops import BUILT_KERNELS, forward_op as _fwd_op
from .kvcache import paged_varlen_attention

__all__ = [
    "flash_attn_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
]

_FWD_BUILT = {variant: _checks.fwd_combos(BUILT_KERNELS, variant) for variant in ("plain", "scoremod")}


def _dropout_seed(device: torch.device) -> torch.Tensor:
    """The kernels' Philox key for one call: one int64 in [0, 2**63 - 1)
    drawn from torch's CUDA generator on `device`, on the device (no host
    sync, and CUDA-graph safe: a replay draws anew). 63 random bits: the
    full int64 range would overflow the high - low of torch.compile's
    randint lowering."""
    return torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64, device=device)


def padded_to_kernel_head_dim(*tensors):
    """q, k, v (and, for a backward, dout and out) zero-padded in the last
    dim to the next head dim with a kernel of its own (as they are when it
    has one). Zeros add nothing to q·k, and v's padding only fills out's
    columns that are cut off again; autograd carries the gradients back
    through the padding."""
    pad = _checks.kernel_head_dim(tensors[0].shape[-1]) - tensors[0].shape[-1]
    if not pad:
        return tensors
    # F.pad keeps some input layouts (e.g. a stride-1 dim that is not the
    # last); the kernels need the last dim contiguous.
    return tuple(F.pad(t, (0, pad)).contiguous() for t in tensors)


def _run(q, k, v, head_dim, softmax_scale, causal, deterministic, window, softcap, alibi_slopes, dropout_p,
         return_attn_probs, varlen=(None, None, None, 0, 0)):
    """The op on kernel-sized q, k, v: draws dropout's seed, cuts out back to
    head_dim and returns what flash_attn returns (the probabilities only with
    dropout, None otherwise). varlen: (cu_seqlens_q, cu_seqlens_k,
    seqused_k, max_seqlen_q, max_seqlen_k)."""
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    seed = _dropout_seed(q.device) if dropout_p > 0 else None
    with_probs = bool(return_attn_probs) and dropout_p > 0
    out, lse, attn_probs = _fwd_op(q, k, v, float(softmax_scale), bool(causal), bool(deterministic), *window,
                                   _checks.kernel_softcap(softcap), alibi_slopes, *varlen, float(dropout_p), seed,
                                   with_probs)
    if out.shape[-1] != head_dim:
        out = out[..., :head_dim]
    if return_attn_probs:
        return out, lse, unnormalized_probs(attn_probs) if with_probs else None
    return out


def unnormalized_probs(attn_probs: torch.Tensor) -> torch.Tensor:
    """flash_attn's S_dmask from the kernels' probabilities P = exp(s - lse):
    exp(s - m) with m the row's largest score, i.e. P divided by its row's
    largest |P| (computed in float32; the sign bits, dropout's marks, are
    kept). flash_attn 2.x's S_dmask holds exp(s - m_j) with m_j the running
    max of the key blocks its kernel had visited (last to first, blocks of
    _get_block_size_n keys); one block spanning the row is the same form,
    which is what flashtile.compat's _get_block_size_n reports, so the public
    suite's normalize_flash_attn_S recovers P from it."""
    if attn_probs.shape[-1] == 0:  # no keys at all
        return attn_probs
    probs = attn_probs.float()
    row_max = probs.abs().amax(dim=-1, keepdim=True)
    return (probs / torch.where(row_max > 0, row_max, torch.ones_like(row_max))).to(attn_probs.dtype)


def _attention(q, k, v, names, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
               return_attn_probs, deterministic):
    """Check the tensors (options are already checked) and run the op, on
    q, k, v padded to a kernel's head dim."""
    variant = _checks.variant_for(softcap, alibi_slopes, dropout_p)
    _checks.check_fwd_tensors(q, k, v, _FWD_BUILT[variant], names=names, alibi_slopes=alibi_slopes,
                              variant=variant)
    window = _checks.kernel_window(window_size, bool(causal), q.shape[1], k.shape[1])
    return _run(*padded_to_kernel_head_dim(q, k, v), q.shape[-1], softmax_scale, causal, deterministic, window,
                softcap, alibi_slopes, dropout_p, return_attn_probs)


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Attention over separate q, k and v.

    Args:
        q: (batch, seqlen_q, nheads, headdim), float16 or bfloat16, on a CUDA device.
        k: (batch, seqlen_k, nheads_k, headdim), same dtype and device as q.
        v: (batch, seqlen_k, nheads_k, headdim), same dtype and device as q.
        dropout_p: probability in [0, 1) of dropping each attention probability
            (see the module docstring); 0.0 is off.
        softmax_scale: scale of QK^T before the softmax; default headdim ** -0.5.
        causal: bottom-right aligned causal mask.
        window_size: (left, right) sliding window, a pair of ints or a tensor of two,
            -1 (any negative) for an unbounded side (see the module docstring);
            (-1, -1) is global attention.
        softcap: > 0 caps the scaled scores at softcap * tanh(score / softcap); 0.0 (or less) is off.
        alibi_slopes: None, or float32 (nheads,) or (batch, nheads) ALiBi slopes:
            score (i, j) -= slope * |i + seqlen_k - seqlen_q - j| (no gradient).
        deterministic: sum dq in a fixed order in the backward (no atomic adds), so
            that two runs give bitwise-identical gradients; the backward is slower.
        return_attn_probs: also return the logsumexp and, with dropout, the
            testing-only probabilities (see Returns).

    Returns:
        out (batch, seqlen_q, nheads, headdim) in q's dtype; with
        return_attn_probs, the tuple (out, softmax_lse, S_dmask) where
        softmax_lse is (batch, nheads, seqlen_q) float32, the logsumexp of each
        row of scaled scores (undropped), and S_dmask is None without dropout,
        else the unnormalized probabilities exp(score - row max) (batch, nheads,
        seqlen_q rounded up to 128, seqlen_k rounded up to 128) with dropped
        entries negated (module docstring).
    """
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    return _attention(q, k, v, ("q", "k", "v"), dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, return_attn_probs, deterministic)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Self-attention over a packed qkv of shape (batch, seqlen, 3, nheads, headdim).

    q, k and v are strided views of qkv (no copies). The other arguments and the
    return value are as in :func:`flash_attn_func`.
    """
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    _checks.check_qkvpacked(qkv)
    q, k, v = qkv.unbind(dim=2)
    return _attention(q, k, v, ("qkv", "qkv", "qkv"), dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, return_attn_probs, deterministic)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Attention with q (batch, seqlen_q, nheads, headdim) and a packed kv of
    shape (batch, seqlen_k, 2, nheads_k, headdim).

    k and v are strided views of kv (no copies). The other arguments and the
    return value are as in :func:`flash_attn_func`.
    """
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    _checks.check_kvpacked(kv)
    k, v = kv.unbind(dim=2)
    return _attention(q, k, v, ("q", "kv", "kv"), dropout_p, softmax_scale, causal, window_size,
                      softcap, alibi_slopes, return_attn_probs, deterministic)


def _attention_varlen(q, k, v, names, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_k,
                      dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                      deterministic):
    """_attention for a variable-length batch (options already checked)."""
    variant = _checks.variant_for(softcap, alibi_slopes, dropout_p)
    _checks.check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                 _FWD_BUILT[variant], names=names, seqused_k=seqused_k,
                                 alibi_slopes=alibi_slopes, variant=variant)
    window = _checks.kernel_window(window_size, bool(causal), int(max_seqlen_q), int(max_seqlen_k))
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k, int(max_seqlen_q), int(max_seqlen_k))
    return _run(*padded_to_kernel_head_dim(q, k, v), q.shape[-1], softmax_scale, causal, deterministic, window,
                softcap, alibi_slopes, dropout_p, return_attn_probs, varlen)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    seqused_k=None,
):
    """Attention over a variable-length batch (see the module docstring).

    Args:
        q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim).
        cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) offsets of each sequence's rows.
        max_seqlen_q, max_seqlen_k: ints, the longest sequence of each (at least every length).
        block_table: None, or int32 (batch, max_pages): k and v are then paged caches
            (num_pages, page_size, nheads_k, headdim), pages of any size, and sequence b's
            keys are its first cu_seqlens_k[b + 1] - cu_seqlens_k[b] positions (seqused_k[b]
            when given) in the pages block_table[b] names. Forward only (as in flash_attn);
            dropout is not available with it.
        seqused_k: None, or int32 (batch,): the keys of each sequence that are attended.
        The other arguments are as in :func:`flash_attn_func`.

    Returns:
        out (total_q, nheads, headdim); with return_attn_probs, (out, softmax_lse
        (nheads, total_q) float32, S_dmask): S_dmask None without dropout, else
        (batch, nheads, max_seqlen_q rounded up to 128, max_seqlen_k rounded up
        to 128), row i and column j of sequence b at [b, :, i, j].
    """
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    if block_table is not None:
        if dropout_p > 0:
            raise ValueError("dropout_p: not with block_table (paged KV runs the KV-cache kernels, "
                             "which have no dropout)")
        return paged_varlen_attention(q, k, v, block_table, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                              seqused_k, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                              return_attn_probs)
    return _attention_varlen(q, k, v, ("q", "k", "v"), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             seqused_k, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                             return_attn_probs, deterministic)


def flash_attn_varlen_qkvpacked_func(
    qkv,
    cu_seqlens,
    max_seqlen,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Self-attention over a variable-length batch packed as qkv (total, 3, nheads,
    headdim), with one cu_seqlens and max_seqlen for queries and keys. Other
    arguments and the return value as in :func:`flash_attn_varlen_func`."""
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    _checks.check_varlen_qkvpacked(qkv)
    q, k, v = qkv.unbind(dim=1)
    return _attention_varlen(q, k, v, ("qkv", "qkv", "qkv"), cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                             None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                             deterministic)


def flash_attn_varlen_kvpacked_func(
    q,
    kv,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Attention over a variable-length batch with kv packed as (total_k, 2,
    nheads_k, headdim). Other arguments and the return value as in
    :func:`flash_attn_varlen_func`."""
    _checks.check_options(dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal,
                          window_size=window_size, softcap=softcap, alibi_slopes=alibi_slopes)
    _checks.check_varlen_kvpacked(kv)
    k, v = kv.unbind(dim=1)
    return _attention_varlen(q, k, v, ("q", "kv", "kv"), cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             None, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                             deterministic)
