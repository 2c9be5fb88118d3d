"""Argument validation for the public attention functions.

Every check is a plain function that takes the caller's objects and raises;
none of them needs the compiled extension or a GPU, so the CPU test suite can
exercise all of them.

Exception types
---------------
* ``TypeError``           -- an argument is not of the right Python type
                             (a list where a tensor belongs, a string scale).
* ``ValueError``          -- a tensor or number has the wrong properties
                             (rank, dtype, shape, strides, device, range).
* ``NotImplementedError`` -- a valid request for a feature flashtile does not
                             have (a backward through paged KV).
* ``KernelNotBuiltError`` -- (a ``RuntimeError``) the request is supported by
                             flashtile, but this build was compiled without
                             the forward kernel that serves it (softcap,
                             ALiBi and dropout run kernels of their own, the
                             "scoremod" variant). (A missing
                             backward kernel is reported by the extension at
                             backward time, as a plain ``RuntimeError`` naming
                             the head dim and dtype.)

Every message begins with the name of the offending argument and says what was
expected and what was received, e.g. ``q must be on a CUDA device, got cpu``.

Order of the checks
-------------------
1. options: types and ranges of the scalar arguments;
2. tensors: Python type, rank, dtype, shapes against each other, head dim
   (supported, then built);
3. device placement, last.

Any memory layout is accepted, as flash_attn does: the ops copy a tensor
whose last dim is not contiguous, or whose start or other strides are not
16-byte aligned (in the forward also one whose rows have stride 0), into a
fresh contiguous one before the launch (_ops.py).

Placement comes last on purpose: a tensor that is wrong in any other way gets
the error that names that, whatever device it lives on, so the CPU suite can
reach every check with CPU tensors, and a well-formed CPU tensor still fails
(at step 3), so public behaviour always requires CUDA.

Everything here reads only Python scalars and tensor metadata (shape, dtype,
stride, device), never tensor data (but for a ``window_size`` given as a
tensor, whose two values are read), so the checks run unchanged on fake
tensors while ``torch.compile`` traces the public functions
(``storage_offset()`` is left out for that reason: it breaks the graph).
Containment tests compare with ``==`` against tuples (never hash a size), so
symbolic sizes work too.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = [
    "KernelNotBuiltError",
    "SUPPORTED_HEAD_DIMS",
    "MAX_HEAD_DIM",
    "kernel_head_dim",
    "DTYPE_NAMES",
    "fwd_combos",
    "check_options",
    "window_pair",
    "kernel_window",
    "kernel_softcap",
    "check_softmax_scale",
    "check_fwd_tensors",
    "check_head_dim",
    "check_devices",
    "check_alibi_slopes",
    "variant_for",
    "check_qkvpacked",
    "check_kvpacked",
    "check_varlen_tensors",
    "check_varlen_qkvpacked",
    "check_varlen_kvpacked",
]


_FLOAT32_MAX = 3.4028234663852886e38  # softcap travels as a float32
_FLOAT32_MIN_NORMAL = 1.1754943508222875e-38
# dropout_p travels as a float32 too: from halfway between 1 - 2**-24 (the
# largest float32 below 1) and 1 up, it rounds to 1 (ties go to 1, the even
# one). Plain arithmetic rather than struct.pack, so torch.compile traces it.
_FLOAT32_BELOW_ONE_ROUNDS_UP = 1.0 - 2.0 ** -25
_MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z (the forward's heads, batch)
_MAX_SEQLEN = 1 << 29  # kMaxSeqlen in flashtile.hpp: the mask arithmetic stays within int
# The backward's grids are 1-D: blocks of 64 rows (the smallest tile) × heads
# × batch, within CUDA's gridDim.x limit (flashtile.hpp's grid_blocks).
_MAX_GRID_BLOCKS = 2**31 - 1


class KernelNotBuiltError(RuntimeError):
    """The combination is supported, but this build does not contain its kernel."""


# Head dims the kernels are written for (independent of what a build contains).
SUPPORTED_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # the kernels' head dims
MAX_HEAD_DIM = 256  # flash_attn's limit, and the largest kernel's

# torch dtype -> the name the extension's dispatch table uses.
DTYPE_NAMES = ((torch.float16, "fp16"), (torch.bfloat16, "bf16"))


def _dtype_name(dtype: torch.dtype) -> str | None:
    for dt, name in DTYPE_NAMES:
        if dtype == dt:
            return name
    return None


def _fmt_shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _fmt_stride(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.stride()) + ")"


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


# --------------------------------------------------------------------------
# the dispatch table
# --------------------------------------------------------------------------


def kernel_combos(built_kernels, direction: str, variant: str = "plain") -> tuple[tuple[int, str], ...]:
    """Reduce ``_C.built_kernels()`` to the sorted ``(head_dim, dtype_name)``
    pairs that have a kernel of ``direction`` ("fwd" or "bwd") and
    ``variant`` ("plain", or "scoremod": softcap and ALiBi) for some
    architecture.

    The architecture is chosen by the extension at launch; here we only need to
    know whether a kernel exists at all.
    """
    combos = set()
    for entry in built_kernels:
        kernel_direction, _arch, head_dim, dtype_name, kernel_variant = entry
        if kernel_direction == direction and kernel_variant == variant:
            combos.add((int(head_dim), str(dtype_name)))
    return tuple(sorted(combos))


def fwd_combos(built_kernels, variant: str = "plain") -> tuple[tuple[int, str], ...]:
    """The forward's ``kernel_combos``."""
    return kernel_combos(built_kernels, "fwd", variant)


def variant_for(softcap, alibi_slopes, dropout_p=0.0) -> str:
    """The kernel variant a call needs: "scoremod" with softcap (> 0), ALiBi or dropout."""
    return "scoremod" if softcap > 0.0 or alibi_slopes is not None or dropout_p != 0.0 else "plain"


# --------------------------------------------------------------------------
# scalar options
# --------------------------------------------------------------------------


def check_softmax_scale(softmax_scale) -> None:
    """``None`` (use head_dim ** -0.5) or a finite positive real number."""
    if softmax_scale is None:
        return
    if not _is_real(softmax_scale):
        raise TypeError(
            f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
        )
    if not (-math.inf < softmax_scale < math.inf):  # also false for NaN
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    if softmax_scale <= 0:
        # The online softmax tracks the row max of the unscaled scores, which
        # is the max of the scaled ones only for a positive scale.
        raise ValueError(f"softmax_scale must be positive, got {softmax_scale}")


def check_options(
    *,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
) -> None:
    """Validate the non-tensor arguments: their types, then their ranges."""
    # -- types and ranges ------------------------------------------------
    if not _is_real(dropout_p):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not (0.0 <= dropout_p < _FLOAT32_BELOW_ONE_ROUNDS_UP):
        # The kernels take it as a float32, where 1 - 2**-30 is already 1.
        raise ValueError(f"dropout_p must be in [0, 1) as a float32, got {dropout_p}")
    check_softmax_scale(softmax_scale)
    if isinstance(causal, torch.Tensor) or not isinstance(causal, (bool, numbers.Integral)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    window_pair(window_size)
    if not _is_real(softcap):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap != softcap or softcap == math.inf:
        raise ValueError(f"softcap must be a finite number (0 or less disables it), got {softcap}")
    if softcap > _FLOAT32_MAX or 0.0 < softcap < _FLOAT32_MIN_NORMAL:
        # Below float32's smallest normal number softcap would round to 0 (off)
        # or leave softmax_scale / softcap infinite.
        raise ValueError(f"softcap must be 0 or a normal float32 ({_FLOAT32_MIN_NORMAL:.4g} to "
                         f"{_FLOAT32_MAX:.4g}), got {softcap}")
    if alibi_slopes is not None and not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(
            f"alibi_slopes must be a torch.Tensor or None, got {type(alibi_slopes).__name__}"
        )


def window_pair(window_size) -> tuple[int, int]:
    """(left, right) as Python ints from what flash_attn accepts: any
    2-element sequence or tensor of integers (the public suite passes
    ``torch.randint(0, seqlen_k, (2,))``); a negative side is unbounded, -1."""
    if isinstance(window_size, (str, bytes)) or not hasattr(window_size, "__len__"):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {type(window_size).__name__}")
    if len(window_size) != 2:
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    sides = []
    for side in window_size:
        if isinstance(side, torch.Tensor):
            if side.dim() != 0 or side.is_floating_point() or side.is_complex():
                raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
        elif isinstance(side, bool) or not isinstance(side, (numbers.Integral, torch.SymInt)):
            # (torch.compile(dynamic=True) passes the ints as SymInts.)
            raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
        sides.append(max(int(side), -1))
    return sides[0], sides[1]


def kernel_window(window_size, causal: bool, seqlen_q: int, seqlen_k: int) -> tuple[int, int]:
    """The (left, right) window the kernels get: the one asked for, with
    causal setting the right side to 0, and a side that reaches past every
    key from every row written as -1 (unbounded), so that such windows run
    the causal or the mask-free kernel. Query row i sees key j iff
    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right:
    the left side reaches key 0 from the last row once left >= seqlen_k - 1,
    the right side key seqlen_k - 1 from row 0 once right >= seqlen_q - 1.
    Varlen batches pass their max_seqlen_q and max_seqlen_k, bounds on every
    sequence's lengths (the kernels clamp the lengths to them).

    flash_attn 2.x's kernels differ from this (and from its docstring) when
    seqlen_q > seqlen_k: they treat a side of seqlen_k or more as unbounded
    and an unbounded right side next to a bounded left one as seqlen_k,
    hiding keys its docstring's definition shows (docs/compatibility.md)."""
    left, right = window_pair(window_size)
    if causal:
        right = 0
    if left >= max(seqlen_k - 1, 0):
        left = -1
    if right >= max(seqlen_q - 1, 0):
        right = -1
    return left, right


def kernel_softcap(softcap) -> float:
    """softcap as the kernels take it: flash_attn turns off a softcap of 0 or less."""
    return float(softcap) if softcap > 0 else 0.0


# --------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------


def _check_is_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def kernel_head_dim(head_dim: int):
    """The head dim of the kernel that runs ``head_dim`` (1 to MAX_HEAD_DIM):
    the smallest kernel head dim at least as large (q, k and v are
    zero-padded up to it)."""
    return next((hd for hd in SUPPORTED_HEAD_DIMS if hd >= head_dim), None)


def check_head_dim(head_dim, dtype: torch.dtype, fwd_built, name: str = "q", variant: str = "plain",
                   kind: str | None = None) -> None:
    """A head dim from 1 to 256 whose kernel (:func:`kernel_head_dim`) exists,
    and that kernel is in this build's table (``fwd_built`` as returned by
    :func:`fwd_combos` for ``variant``) for ``dtype``. The kernel is never
    chosen by what was built: a missing one is reported, not replaced by a
    larger one."""
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(
            f"{name}: head dim {head_dim} is not supported; head dims go from 1 to {MAX_HEAD_DIM}"
        )
    kernel_dim = kernel_head_dim(head_dim)
    dtype_name = _dtype_name(dtype)
    if not any(kernel_dim == hd and dtype_name == dn for hd, dn in fwd_built):
        built = ", ".join(f"hdim{hd}/{dn}" for hd, dn in fwd_built) or "none"
        padded = "" if kernel_dim == head_dim else f" (which runs head dim {head_dim}, zero-padded)"
        if kind is None:
            kind = "forward kernel with softcap/ALiBi (variant scoremod)" if variant == "scoremod" else "forward kernel"
        raise KernelNotBuiltError(
            f"{name}: the {kind} for head dim {kernel_dim}{padded} with dtype {dtype_name} "
            f"is not built in this flashtile build (built: {built}); rebuild flashtile "
            "with that combination enabled (FLASHTILE_HEAD_DIMS, FLASHTILE_DTYPES, FLASHTILE_VARIANTS)"
        )


def check_devices(tensors, names) -> None:
    """Every tensor on a CUDA device, all on the first one's device."""
    first, first_name = tensors[0], names[0]
    for t, name in zip(tensors, names):
        if t.device.type != "cuda":
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}")
        if t.device != first.device:
            raise ValueError(
                f"{name} must be on the same device as {first_name} ({first.device}), got {t.device}"
            )


def _check_dtypes(q, k, v, names) -> None:
    """q float16 or bfloat16; k and v of q's dtype."""
    nq, nk, nv = names
    if _dtype_name(q.dtype) is None:
        raise ValueError(f"{nq} must be float16 or bfloat16, got {q.dtype}")
    for t, name in ((k, nk), (v, nv)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} must have the same dtype as {nq} ({q.dtype}), got {t.dtype}")


def _check_head_groups(q, k, nheads: int, nheads_k: int, nq: str, nk: str) -> None:
    """At least one K/V head, and q's heads a whole number of groups of them."""
    if nheads_k == 0:
        raise ValueError(f"{nk} must have at least one head, got shape {_fmt_shape(k)}")
    if nheads % nheads_k != 0:
        raise ValueError(
            f"{nk}: nheads of {nq} ({nheads}) must be a multiple of nheads of {nk} ({nheads_k}), "
            f"got shapes {_fmt_shape(q)} and {_fmt_shape(k)}"
        )


def check_alibi_slopes(alibi_slopes, batch: int, nheads: int) -> None:
    """ALiBi slopes: float32, shape (nheads,) or (batch, nheads), any strides
    (placement is checked with the other tensors')."""
    if alibi_slopes.dtype != torch.float32:
        raise ValueError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    shape = tuple(alibi_slopes.shape)
    if not (shape == (nheads,) or shape == (batch, nheads)):
        raise ValueError(
            f"alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
            f"({batch}, {nheads}), got {_fmt_shape(alibi_slopes)}"
        )


def check_fwd_tensors(q, k, v, fwd_built, names=("q", "k", "v"), alibi_slopes=None,
                      variant: str = "plain") -> None:
    """Validate q (b, sq, h, d), k and v (b, sk, h_k, d) for the forward, and
    alibi_slopes when given.

    ``fwd_built`` is the table from :func:`fwd_combos` for ``variant``.
    ``names`` are what the messages call the three tensors (the packed
    functions pass "qkv"/"kv").
    """
    nq, nk, nv = names
    for t, name in ((q, nq), (k, nk), (v, nv)):
        _check_is_tensor(t, name)

    for t, name, what in (
        (q, nq, "(batch, seqlen_q, nheads, headdim)"),
        (k, nk, "(batch, seqlen_k, nheads_k, headdim)"),
        (v, nv, "(batch, seqlen_k, nheads_k, headdim)"),
    ):
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D {what}, got {t.dim()}-D shape {_fmt_shape(t)}")

    _check_dtypes(q, k, v, names)

    batch, seqlen_q, nheads, head_dim = q.shape
    _, seqlen_k, nheads_k, _ = k.shape
    for t, name in ((k, nk), (v, nv)):
        if t.shape[0] != batch:
            raise ValueError(
                f"{name} must have the same batch size as {nq} ({batch}), got shape {_fmt_shape(t)}"
            )
        if t.shape[3] != head_dim:
            raise ValueError(
                f"{name} must have the same head dim as {nq} ({head_dim}), got shape {_fmt_shape(t)}"
            )
    if v.shape[1] != seqlen_k:
        raise ValueError(
            f"{nv} must have the same seqlen as {nk} ({seqlen_k}), got shape {_fmt_shape(v)}"
        )
    if v.shape[2] != nheads_k:
        raise ValueError(
            f"{nv} must have the same number of heads as {nk} ({nheads_k}), got shape {_fmt_shape(v)}"
        )
    _check_head_groups(q, k, nheads, nheads_k, nq, nk)

    for n, t, seqlen in ((nq, q, seqlen_q), (nk, k, seqlen_k)):
        if seqlen > _MAX_SEQLEN:
            raise ValueError(f"{n}: seqlen {seqlen} is above the supported {_MAX_SEQLEN}, "
                             f"got shape {_fmt_shape(t)}")
    # The forward's grid puts heads on y and batch on z, each at most 65535.
    if batch > _MAX_GRID_YZ:
        raise ValueError(f"{nq}: batch size {batch} is above the supported {_MAX_GRID_YZ}, "
                         f"got shape {_fmt_shape(q)}")
    if nheads > _MAX_GRID_YZ:
        raise ValueError(f"{nq}: nheads {nheads} is above the supported {_MAX_GRID_YZ}, "
                         f"got shape {_fmt_shape(q)}")
    # The backward's grids: key blocks × K/V heads × batch (main kernel) and
    # query blocks × query heads × batch (dQ and convert kernels).
    for blocks, what in ((-(-seqlen_q // 64) * nheads * batch, f"{nq}: batch × nheads × ceil(seqlen_q / 64)"),
                         (-(-seqlen_k // 64) * nheads_k * batch, f"{nk}: batch × nheads_k × ceil(seqlen_k / 64)")):
        if blocks > _MAX_GRID_BLOCKS:
            raise ValueError(
                f"{what} = {blocks} is above the {_MAX_GRID_BLOCKS} blocks of a kernel grid, "
                f"got shapes {_fmt_shape(q)} and {_fmt_shape(k)}")

    check_head_dim(head_dim, q.dtype, fwd_built, name=nq, variant=variant)

    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, batch, nheads)

    if alibi_slopes is None:
        check_devices((q, k, v), (nq, nk, nv))
    else:
        check_devices((q, k, v, alibi_slopes), (nq, nk, nv, "alibi_slopes"))


# --------------------------------------------------------------------------
# packed inputs: only the packing itself is checked here; the unpacked views
# then go through check_fwd_tensors under the packed tensor's name.
# --------------------------------------------------------------------------


def check_qkvpacked(qkv) -> None:
    _check_is_tensor(qkv, "qkv")
    if qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(
            "qkv must be 5-D (batch, seqlen, 3, nheads, headdim), "
            f"got {qkv.dim()}-D shape {_fmt_shape(qkv)}"
        )


def check_kvpacked(kv) -> None:
    _check_is_tensor(kv, "kv")
    if kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(
            "kv must be 5-D (batch, seqlen_k, 2, nheads_k, headdim), "
            f"got {kv.dim()}-D shape {_fmt_shape(kv)}"
        )


# --------------------------------------------------------------------------
# variable-length batches: q (total_q, nheads, headdim), k and v (total_k,
# nheads_k, headdim), sequence b at rows cu_seqlens[b]:cu_seqlens[b + 1]
# --------------------------------------------------------------------------


def _check_max_seqlen(value, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= _MAX_SEQLEN:
        raise ValueError(f"{name} must be in [0, {_MAX_SEQLEN}], got {value}")


def _check_offsets(t, name: str, length=None) -> None:
    """An int32, 1-D, contiguous offsets tensor (of `length` entries when given)."""
    _check_is_tensor(t, name)
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got {t.dim()}-D shape {_fmt_shape(t)}")
    if length is not None and t.shape[0] != length:
        raise ValueError(f"{name} must have {length} entries (one per sequence), got shape {_fmt_shape(t)}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got strides {_fmt_stride(t)}; call .contiguous() first")


def check_varlen_tensors(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, fwd_built,
                         names=("q", "k", "v"), seqused_k=None, alibi_slopes=None, variant: str = "plain") -> None:
    """Validate a variable-length batch for the forward. The offsets' values
    live on the device and are not read (that would synchronize); the kernels
    clamp them into the tensors, so wrong offsets give wrong rows, never
    accesses outside them."""
    nq, nk, nv = names
    for t, name in ((q, nq), (k, nk), (v, nv)):
        _check_is_tensor(t, name)
    for t, name, what in ((q, nq, "(total_q, nheads, headdim)"), (k, nk, "(total_k, nheads_k, headdim)"),
                          (v, nv, "(total_k, nheads_k, headdim)")):
        if t.dim() != 3:
            raise ValueError(f"{name} must be 3-D {what}, got {t.dim()}-D shape {_fmt_shape(t)}")
    _check_dtypes(q, k, v, names)
    total_q, nheads, head_dim = q.shape
    total_k, nheads_k, _ = k.shape
    for t, name in ((k, nk), (v, nv)):
        if t.shape[2] != head_dim:
            raise ValueError(f"{name} must have the same head dim as {nq} ({head_dim}), got shape {_fmt_shape(t)}")
    if v.shape[0] != total_k or v.shape[1] != nheads_k:
        raise ValueError(f"{nv} must have the shape of {nk} {_fmt_shape(k)}, got {_fmt_shape(v)}")
    _check_head_groups(q, k, nheads, nheads_k, nq, nk)
    for t, name in ((q, nq), (k, nk)):
        if t.shape[0] > _MAX_GRID_BLOCKS:
            raise ValueError(f"{name}: {t.shape[0]} rows are above the supported {_MAX_GRID_BLOCKS}")

    _check_offsets(cu_seqlens_q, "cu_seqlens_q")
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q must have batch + 1 >= 1 entries, got shape (0)")
    batch = cu_seqlens_q.shape[0] - 1
    _check_offsets(cu_seqlens_k, "cu_seqlens_k", batch + 1)
    if seqused_k is not None:
        _check_offsets(seqused_k, "seqused_k", batch)
    _check_max_seqlen(max_seqlen_q, "max_seqlen_q")
    _check_max_seqlen(max_seqlen_k, "max_seqlen_k")
    if batch > _MAX_GRID_YZ:
        raise ValueError(f"cu_seqlens_q: {batch} sequences are above the supported {_MAX_GRID_YZ}")
    if nheads > _MAX_GRID_YZ:
        raise ValueError(f"{nq}: nheads {nheads} is above the supported {_MAX_GRID_YZ}, got shape {_fmt_shape(q)}")
    for blocks, what in ((-(-max_seqlen_q // 64) * nheads * batch, "batch × nheads × ceil(max_seqlen_q / 64)"),
                         (-(-max_seqlen_k // 64) * nheads_k * batch, "batch × nheads_k × ceil(max_seqlen_k / 64)")):
        if blocks > _MAX_GRID_BLOCKS:
            raise ValueError(f"{what} = {blocks} is above the {_MAX_GRID_BLOCKS} blocks of a kernel grid")

    check_head_dim(head_dim, q.dtype, fwd_built, name=nq, variant=variant)
    if alibi_slopes is not None:
        check_alibi_slopes(alibi_slopes, batch, nheads)

    tensors = [(q, nq), (k, nk), (v, nv), (cu_seqlens_q, "cu_seqlens_q"), (cu_seqlens_k, "cu_seqlens_k")]
    if seqused_k is not None:
        tensors.append((seqused_k, "seqused_k"))
    if alibi_slopes is not None:
        tensors.append((alibi_slopes, "alibi_slopes"))
    check_devices(*zip(*tensors))


def check_varlen_qkvpacked(qkv) -> None:
    _check_is_tensor(qkv, "qkv")
    if qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be 4-D (total, 3, nheads, headdim), got {qkv.dim()}-D shape {_fmt_shape(qkv)}")


def check_varlen_kvpacked(kv) -> None:
    _check_is_tensor(kv, "kv")
    if kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(
            f"kv must be 4-D (total_k, 2, nheads_k, headdim), got {kv.dim()}-D shape {_fmt_shape(kv)}")
