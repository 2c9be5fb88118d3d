"""flash_attn 2.x's ``flash_attn.flash_attn_interface`` on flashtile: the
public functions (flashtile's own, which take flash_attn's arguments), the
lower-level ``_flash_attn_*`` entry points that libraries built on
flash_attn's pieces call with preallocated outputs, ``flash_attn_gpu`` (its
compiled module's entry points, :mod:`flashtile.compat.flash_attn_2_cuda`)
and the helpers its test suite imports.

S_dmask (``return_attn_probs=True`` with dropout) holds exp(score - m), m the
row's largest score, dropped entries negated: flash_attn's form with a single
key block per row, so :func:`_get_block_size_n` reports a block wider than any
sequence and the suite's ``normalize_flash_attn_S`` recovers the
probabilities from it.
"""

from __future__ import annotations

from ..interface import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from ..kvcache import flash_attn_with_kvcache
from . import flash_attn_2_cuda as flash_attn_gpu

__all__ = [
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
]

USE_TRITON_ROCM = False  # flash_attn's switch to its ROCm Triton backend; flashtile is CUDA only

# Wider than any sequence flashtile takes (kMaxSeqlen is 2**29).
_WHOLE_ROW = 2**31 - 1


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The width of the key blocks whose entries in S_dmask share one max:
    flashtile divides each whole row by its own largest entry."""
    return _WHOLE_ROW




def _flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, window_size_left=-1, window_size_right=-1,
                        softcap=0.0, alibi_slopes=None, return_softmax=False):
    """(out, softmax_lse, S_dmask or None, rng_state), not differentiable."""
    out, softmax_lse, s_dmask, rng_state = flash_attn_gpu.fwd(
        q, k, v, None, alibi_slopes, dropout_p, softmax_scale, causal, window_size_left, window_size_right, softcap,
        return_softmax, None)
    return out, softmax_lse, s_dmask, rng_state


def _flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                               softmax_scale, causal, window_size_left=-1, window_size_right=-1, softcap=0.0,
                               alibi_slopes=None, return_softmax=False, block_table=None, leftpad_k=None,
                               seqused_k=None, zero_tensors=False, num_splits=0):
    """(out, softmax_lse, S_dmask or None, rng_state) of a variable-length batch."""
    out, softmax_lse, s_dmask, rng_state = flash_attn_gpu.varlen_fwd(
        q, k, v, None, cu_seqlens_q, cu_seqlens_k, seqused_k, leftpad_k, block_table, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left, window_size_right, softcap,
        return_softmax, None, num_splits)
    return out, softmax_lse, s_dmask, rng_state


def _flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal,
                         window_size_left, window_size_right, softcap, alibi_slopes, deterministic, rng_state=None):
    """Writes dq, dk, dv (each may be None: allocated) and returns softmax_d."""
    *_, softmax_d = flash_attn_gpu.bwd(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, alibi_slopes, dropout_p, softmax_scale, causal,
        window_size_left, window_size_right, softcap, deterministic, None, rng_state)
    return softmax_d


def _flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                                max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, window_size_left,
                                window_size_right, softcap, alibi_slopes, deterministic, rng_state=None,
                                zero_tensors=False):
    """_flash_attn_backward for a variable-length batch."""
    *_, softmax_d = flash_attn_gpu.varlen_bwd(
        dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
        max_seqlen_k, dropout_p, softmax_scale, zero_tensors, causal, window_size_left, window_size_right, softcap,
        deterministic, None, rng_state)
    return softmax_d


# flash_attn registers these as torch ops under the names below; here they are the same functions.
_wrapped_flash_attn_forward = _flash_attn_forward
_wrapped_flash_attn_varlen_forward = _flash_attn_varlen_forward
_wrapped_flash_attn_backward = _flash_attn_backward
_wrapped_flash_attn_varlen_backward = _flash_attn_varlen_backward
