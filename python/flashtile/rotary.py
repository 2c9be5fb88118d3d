"""flash_attn's rotary embedding (``flash_attn.layers.rotary``), written for flashtile in plain torch.

A rotary embedding turns each pair of features (x0, x1) of a query or key at position p by the angle
p * inv_freq[i] of its pair i: (x0 cos - x1 sin, x0 sin + x1 cos). Only the first rotary_dim features
are paired; the rest pass through. The pairs are (i, i + rotary_dim / 2) by default (GPT-NeoX style)
and (2i, 2i + 1) with ``interleaved=True`` (GPT-J style). cos and sin come in as tables
(seqlen_ro, rotary_dim / 2) indexed by position.

Names, signatures and results are those of flash_attn 2.x. As there, the rotation is computed in
float32 (float64 for float64 inputs) and returned in the input's dtype, the backward is the rotation
by the opposite angle, cos and sin get no gradient, and a position past the end of the tables, which
a tensor ``seqlen_offsets`` can reach, is left unrotated.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

__all__ = [
    "ApplyRotaryEmb",
    "ApplyRotaryEmbKV_",
    "ApplyRotaryEmbQKV_",
    "RotaryEmbedding",
    "apply_rotary_emb",
    "apply_rotary_emb_func",
    "apply_rotary_emb_kv_",
    "apply_rotary_emb_qkv_",
    "apply_rotary_emb_torch",
    "rotate_half",
]

SeqlenOffsets = Union[int, Tensor]


def rotate_half(x: Tensor, interleaved: bool = False) -> Tensor:
    """Map every feature pair (a, b) of x (..., d) to (-b, a), pairs laid out as in the rotation."""
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    first_half, second_half = x.chunk(2, dim=-1)
    return torch.cat((-second_half, first_half), dim=-1)


def apply_rotary_emb_torch(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False) -> Tensor:
    """The rotation written out with rotate_half, computed in the dtype it is given.

    x: (batch, seqlen, nheads, headdim); cos, sin: (seqlen, rotary_dim / 2) or
    (batch, seqlen, rotary_dim / 2), already indexed by position.
    """
    rotary_dim = cos.shape[-1] * 2
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds headdim {x.shape[-1]}")

    def per_feature(table: Tensor) -> Tensor:  # (..., rotary_dim / 2) -> (..., 1, rotary_dim)
        widened = table.repeat_interleave(2, dim=-1) if interleaved else torch.cat((table, table), dim=-1)
        return widened.unsqueeze(-2)

    x_rot = x[..., :rotary_dim]
    rotated = x_rot * per_feature(cos) + rotate_half(x_rot, interleaved) * per_feature(sin)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _token_positions(
    x: Tensor, seqlen_offsets: SeqlenOffsets, cu_seqlens: Optional[Tensor]
) -> Tuple[Tensor, Optional[Tensor]]:
    """Row of the cos/sin tables for each token of x, and which tokens belong to a sequence.

    Dense x (batch, seqlen, ...): positions (seqlen,), or (batch, seqlen) with tensor offsets, and no
    membership mask. Varlen x (total, ...): positions and membership (total,); cu_seqlens is not read
    on the host, so tokens outside [cu_seqlens[0], cu_seqlens[-1]) are found here and left alone.
    """
    offsets_are_tensor = isinstance(seqlen_offsets, Tensor)
    if cu_seqlens is None:
        positions = torch.arange(x.shape[1], device=x.device)
        if offsets_are_tensor:
            return seqlen_offsets.to(torch.int64).unsqueeze(1) + positions, None
        return positions + seqlen_offsets, None
    batch = cu_seqlens.shape[0] - 1
    tokens = torch.arange(x.shape[0], device=x.device, dtype=cu_seqlens.dtype)
    sequence_of_token = torch.searchsorted(cu_seqlens[1:], tokens, right=True).clamp(max=batch - 1)
    positions = (tokens - cu_seqlens[sequence_of_token]).to(torch.int64)
    positions = positions + (seqlen_offsets[sequence_of_token] if offsets_are_tensor else seqlen_offsets)
    in_a_sequence = (tokens >= cu_seqlens[0]) & (tokens < cu_seqlens[-1])
    return positions, in_a_sequence


def _apply_rotary(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    seqlen_offsets: SeqlenOffsets = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
    interleaved: bool = False,
    inplace: bool = False,
    conjugate: bool = False,
) -> Tensor:
    """Rotate x without autograd bookkeeping; conjugate=True rotates by the opposite angle."""
    if cu_seqlens is None:
        if x.dim() != 4:
            raise ValueError(f"x must be (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
        batch, seqlen = x.shape[:2]
    else:
        if x.dim() != 3:
            raise ValueError(f"with cu_seqlens, x must be (total_seqlen, nheads, headdim), got "
                             f"{tuple(x.shape)}")
        if max_seqlen is None:
            raise ValueError("max_seqlen is required with cu_seqlens")
        batch, seqlen = cu_seqlens.shape[0] - 1, max_seqlen
    if cos.dim() != 2 or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must both be (seqlen_ro, rotary_dim / 2), got {tuple(cos.shape)}, "
                         f"{tuple(sin.shape)}")
    seqlen_ro, half_rotary_dim = cos.shape
    rotary_dim = 2 * half_rotary_dim
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"rotary_dim {rotary_dim} exceeds headdim {x.shape[-1]}")
    if seqlen_ro < seqlen:
        raise ValueError(f"cos/sin have {seqlen_ro} positions, fewer than seqlen {seqlen}")
    if isinstance(seqlen_offsets, Tensor):
        if seqlen_offsets.shape != (batch,) or seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"a tensor seqlen_offsets must be ({batch},) int32 or int64, got "
                             f"{tuple(seqlen_offsets.shape)} {seqlen_offsets.dtype}")
    elif seqlen_offsets + seqlen > seqlen_ro:
        raise ValueError(f"seqlen_offsets {seqlen_offsets} + seqlen {seqlen} exceeds the {seqlen_ro} "
                         "positions of cos/sin")

    compute_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    positions, in_a_sequence = _token_positions(x, seqlen_offsets, cu_seqlens)
    in_table = (positions >= 0) & (positions < seqlen_ro)
    if in_a_sequence is not None:
        in_table = in_table & in_a_sequence
    table_rows = positions.clamp(0, max(seqlen_ro - 1, 0))
    in_table = in_table.unsqueeze(-1)
    # Rows outside the tables get the identity rotation rather than an error: flash_attn's kernel
    # does the same, and it keeps decoding with per-sequence offsets free of host synchronization.
    cos_at = torch.where(in_table, cos.to(compute_dtype)[table_rows], 1.0).unsqueeze(-2)  # (..., 1, half)
    sin_at = torch.where(in_table, sin.to(compute_dtype)[table_rows], 0.0).unsqueeze(-2)  # (..., 1, half)
    if conjugate:
        sin_at = -sin_at

    x_rot = x[..., :rotary_dim].to(compute_dtype)
    if interleaved:
        first, second = x_rot[..., 0::2], x_rot[..., 1::2]
    else:
        first, second = x_rot.chunk(2, dim=-1)
    rotated_first = first * cos_at - second * sin_at
    rotated_second = first * sin_at + second * cos_at
    if interleaved:
        rotated = torch.stack((rotated_first, rotated_second), dim=-1).flatten(-2)
    else:
        rotated = torch.cat((rotated_first, rotated_second), dim=-1)

    if inplace:
        x[..., :rotary_dim].copy_(rotated)
        return x
    rotated = rotated.to(x.dtype)
    if rotary_dim == x.shape[-1]:
        return rotated
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def _save_rotation(ctx, seqlen_offsets: SeqlenOffsets, *tensors: Optional[Tensor]) -> None:
    """Keep the tensors and the offsets (an int or a tensor) for the backward."""
    if isinstance(seqlen_offsets, Tensor):
        ctx.save_for_backward(*tensors, seqlen_offsets)
        ctx.int_seqlen_offsets = None
    else:
        ctx.save_for_backward(*tensors)
        ctx.int_seqlen_offsets = seqlen_offsets


def _load_rotation(ctx) -> Tuple[Tuple[Optional[Tensor], ...], SeqlenOffsets]:
    saved = ctx.saved_tensors
    if ctx.int_seqlen_offsets is None:
        return saved[:-1], saved[-1]
    return saved, ctx.int_seqlen_offsets


# The in-place functions below write into their input and return it without ctx.mark_dirty, as
# flash_attn does: mark_dirty would reject a leaf that requires grad, which flash_attn accepts.


class ApplyRotaryEmb(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        interleaved: bool = False,
        inplace: bool = False,
        seqlen_offsets: SeqlenOffsets = 0,
        cu_seqlens: Optional[Tensor] = None,
        max_seqlen: Optional[int] = None,
    ) -> Tensor:
        out = _apply_rotary(x, cos, sin, seqlen_offsets, cu_seqlens, max_seqlen, interleaved, inplace)
        _save_rotation(ctx, seqlen_offsets, cos, sin, cu_seqlens)
        ctx.interleaved = interleaved
        ctx.max_seqlen = max_seqlen
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        (cos, sin, cu_seqlens), seqlen_offsets = _load_rotation(ctx)
        grad_x = _apply_rotary(
            grad_out, cos, sin, seqlen_offsets, cu_seqlens, ctx.max_seqlen, ctx.interleaved, conjugate=True
        )
        return grad_x, None, None, None, None, None, None, None


def apply_rotary_emb(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    interleaved: bool = False,
    inplace: bool = False,
    seqlen_offsets: SeqlenOffsets = 0,
    cu_seqlens: Optional[Tensor] = None,
    max_seqlen: Optional[int] = None,
) -> Tensor:
    """Rotary embedding of the first rotary_dim features of x; differentiable in x.

    Arguments:
        x: (batch, seqlen, nheads, headdim), or (total_seqlen, nheads, headdim) with cu_seqlens.
        cos, sin: (seqlen_ro, rotary_dim / 2), rotary_dim <= headdim, seqlen_ro >= seqlen.
        interleaved: pair features (2i, 2i + 1) (GPT-J) instead of (i, i + rotary_dim / 2) (GPT-NeoX).
        inplace: write the result into x and return x.
        seqlen_offsets: int or (batch,) int32/int64 tensor; sequence b's token t takes row
            t + offset of the tables (decoding with a KV cache).
        cu_seqlens: (batch + 1,) int32 sequence starts for a packed x; each sequence starts at
            position 0 (plus its offset).
        max_seqlen: the longest sequence; required with cu_seqlens.
    Returns:
        out: shaped like x, in x's dtype.
    """
    return ApplyRotaryEmb.apply(x, cos, sin, interleaved, inplace, seqlen_offsets, cu_seqlens, max_seqlen)


apply_rotary_emb_func = apply_rotary_emb


def _query_key_views(qkv: Tensor, num_heads_q: Optional[int]) -> Tuple[Tensor, Tensor]:
    """Views of q and k inside a packed qkv, (b, s, 3, h, d) or (b, s, h_q + 2 * h_k, d)."""
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"a 5-dim qkv must be (batch, seqlen, 3, nheads, headdim), got "
                             f"{tuple(qkv.shape)}")
        return qkv[:, :, 0], qkv[:, :, 1]
    if qkv.dim() != 4 or num_heads_q is None:
        raise ValueError("qkv must be (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, "
                         "num_heads_q + 2 * num_heads_k, headdim) with num_heads_q given")
    num_heads_k = (qkv.shape[2] - num_heads_q) // 2
    if qkv.shape[2] != num_heads_q + 2 * num_heads_k:
        raise ValueError(f"{qkv.shape[2]} heads in qkv do not split into {num_heads_q} query heads "
                         "and two equal groups of key and value heads")
    return qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q : num_heads_q + num_heads_k]


def _rotate_query_key_(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    cos_k: Optional[Tensor],
    sin_k: Optional[Tensor],
    interleaved: bool,
    seqlen_offsets: SeqlenOffsets,
    num_heads_q: Optional[int],
    conjugate: bool = False,
) -> None:
    q, k = _query_key_views(qkv, num_heads_q)
    _apply_rotary(q, cos, sin, seqlen_offsets, interleaved=interleaved, inplace=True, conjugate=conjugate)
    _apply_rotary(
        k,
        cos if cos_k is None else cos_k,
        sin if sin_k is None else sin_k,
        seqlen_offsets,
        interleaved=interleaved,
        inplace=True,
        conjugate=conjugate,
    )


class ApplyRotaryEmbQKV_(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        qkv: Tensor,
        cos: Tensor,
        sin: Tensor,
        cos_k: Optional[Tensor] = None,
        sin_k: Optional[Tensor] = None,
        interleaved: bool = False,
        seqlen_offsets: SeqlenOffsets = 0,
        num_heads_q: Optional[int] = None,
    ) -> Tensor:
        _rotate_query_key_(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q)
        _save_rotation(ctx, seqlen_offsets, cos, sin, cos_k, sin_k)
        ctx.interleaved = interleaved
        ctx.num_heads_q = num_heads_q
        return qkv

    @staticmethod
    def backward(ctx, grad_qkv: Tensor):
        (cos, sin, cos_k, sin_k), seqlen_offsets = _load_rotation(ctx)
        grad_qkv = grad_qkv.clone()
        _rotate_query_key_(
            grad_qkv, cos, sin, cos_k, sin_k, ctx.interleaved, seqlen_offsets, ctx.num_heads_q, conjugate=True
        )
        return grad_qkv, None, None, None, None, None, None, None


def apply_rotary_emb_qkv_(
    qkv: Tensor,
    cos: Tensor,
    sin: Tensor,
    cos_k: Optional[Tensor] = None,
    sin_k: Optional[Tensor] = None,
    interleaved: bool = False,
    seqlen_offsets: SeqlenOffsets = 0,
    num_heads_q: Optional[int] = None,
) -> Tensor:
    """Rotary embedding of q and k inside a packed qkv, in place; v is untouched. Returns qkv.

    Arguments:
        qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, num_heads_q + 2 * num_heads_k,
            headdim) for grouped-query attention, which needs num_heads_q.
        cos, sin: (seqlen_ro, rotary_dim / 2), for q, and for k unless cos_k, sin_k are given.
        cos_k, sin_k: optional separate tables for k (xPos scales q and k differently).
        interleaved, seqlen_offsets: as in apply_rotary_emb.
    """
    return ApplyRotaryEmbQKV_.apply(qkv, cos, sin, cos_k, sin_k, interleaved, seqlen_offsets, num_heads_q)


def _key_view(kv: Tensor) -> Tensor:
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be (batch, seqlen, 2, nheads, headdim), got {tuple(kv.shape)}")
    return kv[:, :, 0]


class ApplyRotaryEmbKV_(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        kv: Tensor,
        cos: Tensor,
        sin: Tensor,
        interleaved: bool = False,
        seqlen_offsets: SeqlenOffsets = 0,
    ) -> Tensor:
        _apply_rotary(_key_view(kv), cos, sin, seqlen_offsets, interleaved=interleaved, inplace=True)
        _save_rotation(ctx, seqlen_offsets, cos, sin)
        ctx.interleaved = interleaved
        return kv

    @staticmethod
    def backward(ctx, grad_kv: Tensor):
        (cos, sin), seqlen_offsets = _load_rotation(ctx)
        grad_kv = grad_kv.clone()
        _apply_rotary(
            _key_view(grad_kv),
            cos,
            sin,
            seqlen_offsets,
            interleaved=ctx.interleaved,
            inplace=True,
            conjugate=True,
        )
        return grad_kv, None, None, None, None


def apply_rotary_emb_kv_(
    kv: Tensor, cos: Tensor, sin: Tensor, interleaved: bool = False, seqlen_offsets: SeqlenOffsets = 0
) -> Tensor:
    """Rotary embedding of k inside a packed kv (batch, seqlen, 2, nheads, headdim), in place; returns kv.

    cos, sin, interleaved and seqlen_offsets are as in apply_rotary_emb.
    """
    return ApplyRotaryEmbKV_.apply(kv, cos, sin, interleaved, seqlen_offsets)


class RotaryEmbedding(torch.nn.Module):
    """Rotary position embedding (RoFormer, https://arxiv.org/abs/2104.09864) applied in place to
    packed q, k, v, with cos/sin tables built on demand and cached.

    Pair i turns at frequency inv_freq[i] = base ** (-2i / dim). With scale_base set, this is xPos
    (https://arxiv.org/abs/2212.10554): q is also multiplied and k divided by
    scale[i] ** ((position - cache_len // 2) / scale_base), scale[i] = (2i + 0.4 dim) / (1.4 dim),
    so that q.k decays with the distance between them.
    """

    def __init__(
        self,
        dim: int,
        base: float = 10000.0,
        interleaved: bool = False,
        scale_base: Optional[float] = None,
        device: Optional[torch.device] = None,
    ):
        """dim: the rotary_dim (features rotated per head); interleaved as in apply_rotary_emb."""
        super().__init__()
        self.dim = dim
        self.base = float(base)
        self.interleaved = interleaved
        self.scale_base = scale_base
        self.register_buffer("inv_freq", self._compute_inv_freq(device), persistent=False)
        self.register_buffer(
            "scale", self._compute_scale(device) if scale_base is not None else None, persistent=False
        )
        self._seq_len_cached = 0
        self._cos_cached: Optional[Tensor] = None
        self._sin_cached: Optional[Tensor] = None
        self._cos_k_cached: Optional[Tensor] = None
        self._sin_k_cached: Optional[Tensor] = None

    def _compute_inv_freq(self, device: Optional[torch.device] = None) -> Tensor:
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32) / self.dim
        return 1.0 / self.base**exponents

    def _compute_scale(self, device: Optional[torch.device] = None) -> Tensor:
        pair_starts = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)
        return (pair_starts + 0.4 * self.dim) / (1.4 * self.dim)

    def _update_cos_sin_cache(self, seqlen: int, device=None, dtype=None) -> None:
        cached = self._cos_cached
        # An inference-mode tensor cannot be saved for a backward, so training rebuilds tables made
        # under torch.inference_mode.
        if (
            cached is not None
            and seqlen <= self._seq_len_cached
            and cached.device == device
            and cached.dtype == dtype
            and not (self.training and cached.is_inference())
        ):
            return
        self._seq_len_cached = seqlen
        # Positions, frequencies and their products stay in float32 even when the module was cast to
        # half precision: angles of thousands of radians lose their fraction in 16-bit floats.
        inv_freq = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._compute_inv_freq(device)
        positions = torch.arange(seqlen, device=device, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)  # (seqlen, dim / 2)
        cos, sin = torch.cos(angles), torch.sin(angles)
        if self.scale is None:
            self._cos_cached, self._sin_cached = cos.to(dtype), sin.to(dtype)
            return
        scale = self.scale if self.scale.dtype == torch.float32 else self._compute_scale(self.scale.device)
        exponents = (positions - seqlen // 2) / self.scale_base
        position_scale = scale.to(device=positions.device) ** exponents.unsqueeze(1)  # (seqlen, dim / 2)
        self._cos_cached = (cos * position_scale).to(dtype)
        self._sin_cached = (sin * position_scale).to(dtype)
        self._cos_k_cached = (cos / position_scale).to(dtype)
        self._sin_k_cached = (sin / position_scale).to(dtype)

    def forward(
        self,
        qkv: Tensor,
        kv: Optional[Tensor] = None,
        seqlen_offset: SeqlenOffsets = 0,
        max_seqlen: Optional[int] = None,
        num_heads_q: Optional[int] = None,
    ) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        """Rotate q and k in place.

        Arguments:
            qkv: (batch, seqlen, 3, nheads, headdim) or (batch, seqlen, num_heads_q + 2 * num_heads_k,
                headdim) with num_heads_q; or, when kv is given, q alone (batch, seqlen, nheads, headdim).
            kv: optional (batch, seqlen, 2, nheads, headdim).
            seqlen_offset: int or (batch,) tensor, as seqlen_offsets in apply_rotary_emb. The tables
                grow to seqlen + seqlen_offset for an int; for a tensor, pass max_seqlen.
            max_seqlen: if given, the tables are grown to this many positions.
        Returns:
            qkv, or (q, kv) when kv is given.
        """
        if max_seqlen is not None:
            self._update_cos_sin_cache(max_seqlen, device=qkv.device, dtype=qkv.dtype)
        elif isinstance(seqlen_offset, int):
            self._update_cos_sin_cache(qkv.shape[1] + seqlen_offset, device=qkv.device, dtype=qkv.dtype)
        if self._cos_cached is None:
            raise ValueError("with a tensor seqlen_offset, pass max_seqlen so that the cos/sin tables "
                             "can be built")
        xpos = self.scale is not None
        cos_k = self._cos_k_cached if xpos else self._cos_cached
        sin_k = self._sin_k_cached if xpos else self._sin_cached
        if kv is None:
            return apply_rotary_emb_qkv_(
                qkv,
                self._cos_cached,
                self._sin_cached,
                cos_k,
                sin_k,
                interleaved=self.interleaved,
                seqlen_offsets=seqlen_offset,
                num_heads_q=num_heads_q,
            )
        q = apply_rotary_emb_func(
            qkv,
            self._cos_cached,
            self._sin_cached,
            interleaved=self.interleaved,
            inplace=True,
            seqlen_offsets=seqlen_offset,
        )
        kv = apply_rotary_emb_kv_(
            kv, cos_k, sin_k, interleaved=self.interleaved, seqlen_offsets=seqlen_offset
        )
        return q, kv
