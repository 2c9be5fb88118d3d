"""The torch.library ops around the extension: forward and backward.

``flashtile::fwd(q, k, v, softmax_scale, causal, deterministic=False,
window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None,
cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
max_seqlen_k=0, dropout_p=0.0, dropout_seed=None, return_attn_probs=False)
-> (out, lse, attn_probs)`` allocates its outputs, handles the empty cases
without touching the extension, and otherwise launches ``_C.fwd`` on the
inputs' device and torch's current stream there. ``dropout_seed`` is the
int64 (1,) device tensor whose bits key the kernels' Philox generator (drawn
by the caller from torch's CUDA generator); ``attn_probs`` is the
testing-only probabilities tensor when ``return_attn_probs``, else empty.
``flashtile::bwd`` gives the gradients. Each op has a fake (meta)
implementation that gives torch.compile the output shapes.
``deterministic`` does not change the forward; it is an argument of the
forward op so that its autograd context can pass it to the backward.

The ops are declared with ``torch.library.Library`` (schema strings) and
their CUDA kernels are plain Python functions; flashtile::fwd's autograd
kernel is an ``autograd.Function`` (:class:`FlashAttentionFunction`) that
saves only q, k, v, out, the row logsumexp and the dropout seed and calls
flashtile::bwd. ``torch.library.custom_op`` with ``register_autograd`` would
do the same in fewer lines, but its wrappers (an aliasing check on every
call, filling in defaults, a redispatch) cost about 60 µs of host time per
forward + backward on the CPU (benchmarks/NOTES.md, "The ops' registration").

The public functions call :func:`forward_op`, which in plain eager mode
(plain CUDA tensors, no torch.compile tracing, no dispatch or torch-function
mode, no functorch transform) calls the same autograd logic and CUDA kernels
directly (:class:`EagerFlashAttentionFunction`), without the dispatcher's
layers around Python kernels (27 µs a forward and 43 µs a backward of host
time on the H200's host); anywhere else it calls the ops. The extension
gets DLPack capsules from ``torch.utils.dlpack.to_dlpack``, not tensors
(whose ``__dlpack__`` nanobind would call, in Python).

Arguments are assumed validated (``_checks``); the ops themselves check only
what tracing cannot see, the device's compute capability, and copy a tensor
the kernels cannot read in place (a last dim that is not contiguous, a start
or a stride that is not a multiple of 16 bytes; in the forward also rows of
stride 0) into a fresh contiguous one.
``run_fwd`` and ``run_bwd`` run the kernels into caller-allocated
outputs (the ops allocate theirs; the flash_attn compatibility layer passes
the caller's).
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import to_dlpack

try:
    from . import _C
except ImportError as exc:  # no fallback: say what is missing and how to get it
    raise ImportError(
        "flashtile: the compiled extension flashtile._C could not be imported; "
        "build and install flashtile from source (pip install .), which needs CUDA"
    ) from exc

# Read once: the extension's table cannot change while the process runs, and a
# tuple of Python constants is something torch.compile can trace through.
BUILT_KERNELS = tuple(tuple(entry) for entry in _C.built_kernels())
# (head_dim, dtype name) of the KV-cache kernels (flash_attn_with_kvcache).
BUILT_KVCACHE_KERNELS = tuple(tuple(entry) for entry in _C.built_kvcache_kernels())

_MIN_CAPABILITY = (8, 0)  # the sm80 (mma.sync) path runs on Ampere and newer


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _check_device_capability(device: torch.device) -> None:
    index = device.index if device.index is not None else torch.cuda.current_device()
    capability = _capability(index)
    if capability < _MIN_CAPABILITY:
        raise RuntimeError(
            "flashtile needs a GPU of compute capability "
            f"{_MIN_CAPABILITY[0]}.{_MIN_CAPABILITY[1]} or newer; q is on {device}, "
            f"of compute capability {capability[0]}.{capability[1]}"
        )


def _empty_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """out like q and lse: (batch, nheads, seqlen_q), or (nheads, total_q)
    for a variable-length batch's 3-D q."""
    out = q.new_empty(q.shape)
    if q.dim() == 3:
        total_q, nheads, _ = q.shape
        return out, q.new_empty((nheads, total_q), dtype=torch.float32)
    batch, seqlen_q, nheads, _ = q.shape
    return out, q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)


def _round_128(n: int) -> int:
    return (n + 127) // 128 * 128


def _empty_attn_probs(q: torch.Tensor, k: torch.Tensor, cu_seqlens_q, max_seqlen_q: int, max_seqlen_k: int,
                      return_attn_probs: bool) -> torch.Tensor:
    """flash_attn's shape for the probabilities: (batch, nheads, seqlen_q
    rounded up to 128, seqlen_k rounded up to 128), the longest sequences'
    when varlen; an empty tensor when not asked for."""
    if not return_attn_probs:
        return q.new_empty((0,))
    if cu_seqlens_q is None:
        batch, seqlen_q, nheads, _ = q.shape
        seqlen_k = k.shape[1]
    else:
        batch, nheads, seqlen_q, seqlen_k = cu_seqlens_q.shape[0] - 1, q.shape[1], max_seqlen_q, max_seqlen_k
    return q.new_empty((batch, nheads, _round_128(seqlen_q), _round_128(seqlen_k)))


def _no_keys(k: torch.Tensor, cu_seqlens_q, max_seqlen_q: int, max_seqlen_k: int) -> bool:
    """No query row sees a key: no keys at all, or (varlen) no sequence with any."""
    if cu_seqlens_q is None:
        return k.shape[1] == 0
    return k.shape[0] == 0 or max_seqlen_k == 0


def _no_queries(q: torch.Tensor, cu_seqlens_q, max_seqlen_q: int) -> bool:
    if cu_seqlens_q is None:
        return q.numel() == 0
    return q.numel() == 0 or cu_seqlens_q.shape[0] <= 1 or max_seqlen_q == 0


_LIB = torch.library.Library("flashtile", "DEF")
_LIB.define(
    "fwd(Tensor q, Tensor k, Tensor v, float softmax_scale, bool causal, bool deterministic=False, "
    "int window_left=-1, int window_right=-1, float softcap=0.0, Tensor? alibi_slopes=None, "
    "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, int max_seqlen_q=0, "
    "int max_seqlen_k=0, float dropout_p=0.0, Tensor? dropout_seed=None, bool return_attn_probs=False) "
    "-> (Tensor out, Tensor lse, Tensor attn_probs)")
_LIB.define(
    "bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, float softmax_scale, bool causal, "
    "bool deterministic=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
    "Tensor? alibi_slopes=None, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? seqused_k=None, "
    "int max_seqlen_q=0, int max_seqlen_k=0, float dropout_p=0.0, Tensor? dropout_seed=None) "
    "-> (Tensor dq, Tensor dk, Tensor dv)")

# The dispatcher may hand a Python kernel fewer arguments than the schema
# has (trailing defaults left out), so the kernels below repeat the schemas'
# defaults.


def _fwd_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: Optional[torch.Tensor] = None,
    return_attn_probs: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out, lse = _empty_outputs(q)
    attn_probs = _empty_attn_probs(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, return_attn_probs)
    run_fwd(q, k, v, out, lse, attn_probs if return_attn_probs else None, softmax_scale, causal, window_left,
            window_right, softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k,
            dropout_p, dropout_seed)
    return out, lse, attn_probs


def run_fwd(q, k, v, out, lse, attn_probs, softmax_scale, causal, window_left=-1, window_right=-1, softcap=0.0,
            alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None, max_seqlen_q=0,
            max_seqlen_k=0, dropout_p=0.0, dropout_seed=None) -> None:
    """The forward into caller-allocated out (q's shape and dtype, a 16-byte
    aligned layout), lse and attn_probs (None, or the testing-only
    probabilities), on q's device and torch's current stream there; q, k, v
    in any layout (copied where the kernels cannot read them in place). With
    no query rows nothing is written; with no keys out is 0 and lse -inf."""
    if _no_queries(q, cu_seqlens_q, max_seqlen_q):  # batch, seqlen_q or nheads is 0: nothing to compute
        if attn_probs is not None:
            attn_probs.zero_()
        return
    if _no_keys(k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):  # every row attends to nothing
        out.zero_()
        lse.fill_(float("-inf"))
        if attn_probs is not None:
            attn_probs.zero_()
        return
    _check_device_capability(q.device)
    q, k, v = (_fwd_ready(t) for t in (q, k, v))
    # Tiles of uneven work (causal, windows, varlen) are handed out from a
    # device counter on a persistent grid by the sm90 forward.
    uneven = causal or window_left >= 0 or window_right >= 0 or cu_seqlens_q is not None
    tile_counter = torch.empty(1, dtype=torch.int32, device=q.device) if uneven else None
    with torch.cuda.device(q.device):
        stream = _current_stream(q.device)
        _C.fwd(*_arrays(q, k, v, out, lse), float(softmax_scale), bool(causal), stream, int(window_left),
               int(window_right), float(softcap), *_arrays(alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k),
               int(max_seqlen_q), int(max_seqlen_k), float(dropout_p), *_arrays(dropout_seed, attn_probs, tile_counter))


def run_kvcache(q, k_cache, v_cache, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                cache_seqlens, cache_leftpad, cache_batch_idx, block_table, num_splits):
    """flash_attn_with_kvcache's attention (the cache already appended to):
    returns (out, lse (batch, nheads, seqlen_q) fp32). cache_seqlens (int32
    (batch,)) are the keys each sequence uses; num_splits 0 lets the
    extension choose from the shapes. Nothing on the host reads a device
    value, so a CUDA graph can capture it."""
    batch, seqlen_q, nheads, head_dim = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse
    _check_device_capability(q.device)
    q, k_cache, v_cache = (_kernel_ready(t) for t in (q, k_cache, v_cache))
    cache_seqlens, cache_leftpad, cache_batch_idx, block_table = (
        t if t is None or t.is_contiguous() else t.contiguous()
        for t in (cache_seqlens, cache_leftpad, cache_batch_idx, block_table))
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    with torch.cuda.device(q.device):
        splits, workspace_bytes = _C.kvcache_plan(batch, seqlen_q, nheads, k_cache.shape[2], head_dim, capacity,
                                                  int(num_splits), k_cache.shape[1] if block_table is not None else 0,
                                                  q.dtype == torch.float16)
        workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device) if workspace_bytes else None
        stream = _current_stream(q.device)
        _C.kvcache(*_arrays(q, k_cache, v_cache, out, lse, workspace), float(softmax_scale), bool(causal), stream,
                   int(window_left), int(window_right), float(softcap),
                   *_arrays(alibi_slopes, cache_seqlens, cache_leftpad, cache_batch_idx, block_table), splits)
    return out, lse


def run_kvcache_append(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx, block_table, rotary_cos,
                       rotary_sin, rotary_interleaved, q_rows_share_position):
    """flash_attn_with_kvcache's writes before its attention, in one kernel:
    k, v (or None) into the cache at rows cache_seqlens[b] + i (int32
    (batch,), contiguous), k rotated, and q rotated into a new tensor when
    rotary_cos, rotary_sin are given (q's row i at position cache_seqlens[b]
    + i, or cache_seqlens[b] with q_rows_share_position). Returns (q rotated
    or q itself, cache_seqlens + seqlen_new or cache_seqlens itself). Nothing
    on the host reads a device value."""
    if q.shape[0] == 0:  # no sequences: nothing to write
        return q, cache_seqlens
    if rotary_cos is not None and rotary_cos.shape[1] == 0:  # rotary_dim 0: no rotation (as flash_attn)
        rotary_cos = rotary_sin = None
    rotate = rotary_cos is not None and q.numel() > 0  # (an empty q has no rows to rotate; k may)
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device) if rotate else None
    used = torch.empty_like(cache_seqlens) if k is not None else cache_seqlens
    if k is None and not rotate:
        return q, used
    if rotary_cos is not None:
        # The kernel reads both tables in one type, float32 or q's, at one pair of strides.
        if rotary_sin.dtype != rotary_cos.dtype or rotary_cos.dtype not in (torch.float32, q.dtype):
            rotary_cos, rotary_sin = rotary_cos.float(), rotary_sin.float()
        if rotary_sin.stride() != rotary_cos.stride():
            rotary_cos, rotary_sin = rotary_cos.contiguous(), rotary_sin.contiguous()
    cache_batch_idx, block_table = (t if t is None or t.is_contiguous() else t.contiguous()
                                    for t in (cache_batch_idx, block_table))
    with torch.cuda.device(q.device):
        _C.kvcache_append(*_arrays(k_cache, v_cache, cache_seqlens), _current_stream(q.device),
                          *_arrays(k, v, used if k is not None else None, cache_batch_idx, block_table,
                                   q if rotate else None, q_out), bool(q_rows_share_position),
                          *_arrays(rotary_cos, rotary_sin), bool(rotary_interleaved))
    return (q_out if rotate else q), used


def _fwd_fake(q, k, v, softmax_scale, causal, deterministic=False, window_left=-1, window_right=-1,
              softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
              max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0, dropout_seed=None, return_attn_probs=False):
    return (*_empty_outputs(q),
            _empty_attn_probs(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k, return_attn_probs))


def vector_friendly(t: torch.Tensor) -> bool:
    """True if the kernels can read or write t in place: contiguous last dim,
    16-byte aligned start and strides (in 2-byte elements, multiples of 8)."""
    return (
        t.stride(-1) == 1
        and all(s % 8 == 0 for s in t.stride()[:-1])
        and t.data_ptr() % 16 == 0
    )


# torch's current stream on a device, as the integer handle the extension
# launches on. The raw query (what torch.compile's generated code calls) takes
# 0.08 µs on the H200's host, torch.cuda.current_stream(...).cuda_stream 2.8 µs
# (it builds a Stream object); the public one where this torch lacks it.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(device: torch.device) -> int:
    if _raw_stream is None:
        return torch.cuda.current_stream(device).cuda_stream
    return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())


def _arrays(*tensors):
    """The tensors as DLPack capsules for the extension (None stays None).
    torch.utils.dlpack.to_dlpack is C: 0.2 µs a tensor on the H200's host,
    against 2.4 µs for Tensor.__dlpack__ (Python), which nanobind would call
    on a tensor: 16 tensors a forward + backward (benchmarks/NOTES.md, "Host
    time per call")."""
    return tuple(None if t is None else to_dlpack(t) for t in tensors)


def _kernel_ready(t: torch.Tensor) -> torch.Tensor:
    """t, or a fresh contiguous copy of it where the kernels cannot read it in
    place (.contiguous() alone would keep a contiguous but misaligned view)."""
    return t if vector_friendly(t) else torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _fwd_ready(t: torch.Tensor) -> torch.Tensor:
    """_kernel_ready(t) for the forward, which copies rows of stride 0 too
    (t expanded along the sequence): the H100/H200 forward reads rows through
    TMA, which steps no stride of 0, and a build with 90a has no other forward
    for those GPUs (flashtile.hpp's find_sm80). Heads or batch of stride 0
    it reads in place."""
    if t.shape[-3] > 1 and t.stride(-3) == 0:
        return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)
    return _kernel_ready(t)


def _bwd_cuda(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    deterministic: bool = False,
    window_left: int = -1,
    window_right: int = -1,
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    seqused_k: Optional[torch.Tensor] = None,
    max_seqlen_q: int = 0,
    max_seqlen_k: int = 0,
    dropout_p: float = 0.0,
    dropout_seed: Optional[torch.Tensor] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of flashtile::fwd: (dq, dk, dv), contiguous, in q's dtype; with
    GQA each of dk and dv sums over the query heads of its group. With
    deterministic=True dq is summed in a fixed order (bitwise reproducible).
    Varlen: rows outside every sequence are not written, as in flash_attn;
    keys past seqused_k get zero dk and dv."""
    dq, dk, dv = _empty_grads(q, k, v)
    run_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, window_left, window_right,
            softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k, dropout_p,
            dropout_seed)
    return dq, dk, dv


def run_bwd(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic=False, window_left=-1,
            window_right=-1, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, seqused_k=None,
            max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0, dropout_seed=None) -> None:
    """The backward into caller-allocated dq, dk, dv (q's and k's shapes and
    dtype, 16-byte aligned layouts), with the device workspace it needs, on
    q's device and torch's current stream there; dout, q, k, v, out in any
    layout. With no query rows or no keys, every gradient is zero."""
    if _no_queries(q, cu_seqlens_q, max_seqlen_q) or _no_keys(k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
        # No query rows, or no keys (out was 0): every gradient is zero.
        dq.zero_(), dk.zero_(), dv.zero_()
        return
    _check_device_capability(q.device)
    dout, q, k, v, out = (_kernel_ready(t) for t in (dout, q, k, v, out))
    options = (bool(causal), int(window_left), int(window_right), bool(deterministic))
    if cu_seqlens_q is None:
        batch, seqlen_q, nheads, head_dim = q.shape
        workspace_bytes = _C.bwd_workspace_bytes(batch, seqlen_q, k.shape[1], nheads, k.shape[2], head_dim, *options)
    else:
        total_q, nheads, head_dim = q.shape
        workspace_bytes = _C.bwd_workspace_bytes(cu_seqlens_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k),
                                                 nheads, k.shape[1], head_dim, *options, varlen_total_q=total_q)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=q.device)
    with torch.cuda.device(q.device):
        stream = _current_stream(q.device)
        _C.bwd(*_arrays(dout, q, k, v, out, lse, dq, dk, dv, workspace), float(softmax_scale), bool(causal),
               bool(deterministic), stream, int(window_left), int(window_right), float(softcap),
               *_arrays(alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k), int(max_seqlen_q),
               int(max_seqlen_k), float(dropout_p), *_arrays(dropout_seed))


def _empty_grads(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic=False, window_left=-1,
              window_right=-1, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
              seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0, dropout_seed=None):
    return _empty_grads(q, k, v)


_LIB.impl("fwd", _fwd_cuda, "CUDA")
_LIB.impl("bwd", _bwd_cuda, "CUDA")
torch.library.register_fake("flashtile::fwd", _fwd_fake, lib=_LIB)
torch.library.register_fake("flashtile::bwd", _bwd_fake, lib=_LIB)

fwd = torch.ops.flashtile.fwd.default
bwd = torch.ops.flashtile.bwd.default


def _forward_saving(ctx, forward, q, k, v, softmax_scale, causal, deterministic=False, window_left=-1,
                    window_right=-1, softcap=0.0, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                    seqused_k=None, max_seqlen_q=0, max_seqlen_k=0, dropout_p=0.0, dropout_seed=None,
                    return_attn_probs=False):
    """An autograd.Function's forward: forward (the op or its CUDA kernel)
    and what the backward needs, in ctx."""
    out, lse, attn_probs = forward(q, k, v, softmax_scale, causal, deterministic, window_left, window_right,
                                   softcap, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                   max_seqlen_k, dropout_p, dropout_seed, return_attn_probs)
    ctx.mark_non_differentiable(lse, attn_probs)
    # lse and attn_probs have no gradient: let the engine pass None for
    # them instead of filling zeros (two allocations and two fills of
    # host time per backward). out always gets one (it is the node's
    # only differentiable output).
    ctx.set_materialize_grads(False)
    # Only these: the backward recomputes P from q, k and the row
    # logsumexp, and dropout's mask from the seed (the ALiBi slopes and
    # the varlen offsets are inputs, not results, and get no gradient).
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, dropout_seed)
    ctx.options = (softmax_scale, causal, deterministic, window_left, window_right, softcap)
    ctx.max_seqlens = (max_seqlen_q, max_seqlen_k)
    ctx.dropout_p = dropout_p
    return out, lse, attn_probs


def _gradients(ctx, grad_out, backward):
    """An autograd.Function's backward: backward (the op or its CUDA kernel)
    on what _forward_saving kept."""
    q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seqused_k, dropout_seed = ctx.saved_tensors
    dq, dk, dv = backward(grad_out, q, k, v, out, lse, *ctx.options, alibi_slopes, cu_seqlens_q, cu_seqlens_k,
                          seqused_k, *ctx.max_seqlens, ctx.dropout_p, dropout_seed)
    # No gradient for the options, alibi_slopes (as flash_attn), the
    # offsets or the seed; Nones past the inputs the call passed are
    # allowed.
    return (dq, dk, dv) + (None,) * 15


class FlashAttentionFunction(torch.autograd.Function):
    """flashtile::fwd's autograd kernel: the forward op below autograd, and
    flashtile::bwd for the gradients of q, k and v."""

    @staticmethod
    def forward(ctx, *args):
        with torch._C._AutoDispatchBelowAutograd():  # on to the CUDA (or fake) kernel
            return _forward_saving(ctx, fwd, *args)

    @staticmethod
    @once_differentiable  # flashtile::bwd has no derivative of its own: a double backward raises
    def backward(ctx, grad_out, grad_lse, grad_attn_probs):
        return _gradients(ctx, grad_out, bwd)


def _fwd_autograd(*args):
    """flashtile::fwd at the Autograd key (where torch's
    autograd_registration_check looks, so the op itself is differentiable
    and opcheck checks it): FlashAttentionFunction when grad mode is on;
    under no_grad straight on to the CUDA kernel, without building an
    autograd context (4 of 13 µs of a dummy op's host time on the CPU)."""
    if torch.is_grad_enabled():
        return FlashAttentionFunction.apply(*args)
    with torch._C._AutoDispatchBelowAutograd():
        return fwd(*args)


# Plain eager calls skip the dispatcher: its layers around a Python kernel
# cost 27 µs of host time a forward and 43 µs a backward on the H200's host
# (benchmarks/NOTES.md, "Host time per call"). Whatever has to see the ops
# gets them: torch.compile's tracing, a dispatch or torch-function mode
# (FakeTensorMode, FlopCounterMode, ...), functorch transforms, jit tracing,
# tensor subclasses. Where this torch lacks a query, every call dispatches.
_DISPATCH_QUERIES = tuple(getattr(torch._C, name, None) for name in (
    "_len_torch_dispatch_stack", "_is_torch_function_mode_enabled", "_are_functorch_transforms_active",
    "_is_tracing"))
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)


def _needs_dispatcher(tensors) -> bool:
    """True unless torch's eager CUDA kernel is all the op would reach for
    these tensors (None entries allowed)."""
    if _is_compiling is None or None in _DISPATCH_QUERIES:
        return True
    dispatch_modes, function_modes, functorch, jit_tracing = _DISPATCH_QUERIES
    return bool(_is_compiling() or dispatch_modes() or function_modes() or functorch() or jit_tracing()
                or any(t is not None and type(t) is not torch.Tensor for t in tensors))


class EagerFlashAttentionFunction(torch.autograd.Function):
    """FlashAttentionFunction for plain eager calls: the CUDA kernels called
    directly (forward_op's test), and in the backward unless a mode has
    been entered since."""

    @staticmethod
    def forward(ctx, *args):
        return _forward_saving(ctx, _fwd_cuda, *args)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, grad_lse, grad_attn_probs):
        return _gradients(ctx, grad_out, bwd if _needs_dispatcher((grad_out,)) else _bwd_cuda)


def forward_op(q, k, v, *options):
    """flashtile::fwd as the public functions call it (the schema's
    arguments, positional): through the dispatcher where anything needs to
    see the op (_needs_dispatcher), else its autograd and CUDA kernels
    called directly, with the same results."""
    tensors = (q, k, v, *(o for o in options if isinstance(o, torch.Tensor)))
    if _needs_dispatcher(tensors):
        return fwd(q, k, v, *options)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return EagerFlashAttentionFunction.apply(q, k, v, *options)
    return _fwd_cuda(q, k, v, *options)


_LIB.impl("fwd", _fwd_autograd, "Autograd")
