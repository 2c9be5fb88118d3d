"""Plain-PyTorch attention for the tests, and FlashAttention's error rule.

``attention_ref`` is the ground truth when upcast (float32, or float64 for
float64 inputs) and "PyTorch's own error" when run in the input's low-precision
dtype. ``assert_close_fa_rule`` then asks that flashtile's error against the
upcast reference be at most ``factor`` times PyTorch's low-precision error plus
a small absolute slack.
"""

from __future__ import annotations

import torch


def causal_mask(seqlen_q: int, seqlen_k: int, device=None) -> torch.Tensor:
    """Bottom-right aligned causal mask, True where a score is masked out.

    Query row i sees key j iff j <= i + seqlen_k - seqlen_q, so the last query
    row always sees every key and, when seqlen_q > seqlen_k, the first
    seqlen_q - seqlen_k rows see none.
    """
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    return cols > rows + (seqlen_k - seqlen_q)


def window_mask(seqlen_q: int, seqlen_k: int, window_size, device=None) -> torch.Tensor:
    """Bottom-right aligned sliding window, True where a score is masked out:
    query row i sees key j iff i + off - left <= j <= i + off + right, with
    off = seqlen_k - seqlen_q and a side of -1 unbounded."""
    left, right = window_size
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    hidden = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        hidden |= cols < rows - left
    if right >= 0:
        hidden |= cols > rows + right
    return hidden


def alibi_bias(alibi_slopes, batch, nheads, seqlen_q, seqlen_k, device, dtype=torch.float32) -> torch.Tensor:
    """flash_attn's ALiBi bias, (batch, nheads, seqlen_q, seqlen_k):
    -slope * |i + seqlen_k - seqlen_q - j| for slopes of shape (nheads,) or
    (batch, nheads), computed in dtype (float32 by default)."""
    slopes = alibi_slopes.to(device=device, dtype=dtype).expand(batch, nheads)
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    distance = (rows - cols).abs().to(dtype)  # (seqlen_q, seqlen_k)
    return -slopes[:, :, None, None] * distance


_U32 = 0xFFFFFFFF


def _mul_hi_lo(m: int, c: torch.Tensor):
    """(high, low) 32-bit halves of m * c for a 32-bit constant m and int64
    tensor c of 32-bit values, without int64 overflow (c split in 16-bit
    halves)."""
    c_lo, c_hi = c & 0xFFFF, c >> 16
    t_lo, t_hi = m * c_lo, m * c_hi            # each < 2**48
    mid = t_lo + ((t_hi & 0xFFFF) << 16)       # < 2**49
    return ((t_hi >> 16) + (mid >> 32)) & _U32, mid & _U32


def philox4x32_10(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 (Salmon et al., SC'11) on int64 tensors holding 32-bit
    counters, written from the paper for the tests (include/flashtile/common/
    dropout.hpp is the kernels'); returns the four output words."""
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & _U32, (k1 + 0xBB67AE85) & _U32
        hi0, lo0 = _mul_hi_lo(0xD2511F53, c0)
        hi1, lo1 = _mul_hi_lo(0xCD9E8D57, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def dropout_keep_threshold(dropout_p: float) -> int:
    """The kernels' 8-bit threshold round((1 - p) * 256) in [0, 256], p
    rounded to float32 first (it travels as one)."""
    p32 = torch.tensor(dropout_p, dtype=torch.float32).item()
    return min(max(int((1.0 - p32) * 256.0 + 0.5), 0), 256)


def dropout_keep_probability(dropout_p: float) -> float:
    """The probability that the kernels keep a score: threshold / 256."""
    return dropout_keep_threshold(dropout_p) / 256.0


def dropout_scale(dropout_p: float) -> float:
    """What the kernels multiply a kept probability by: 1 / (1 - p), p as
    given (rounded to float32), as FlashAttention-2; 0 when the threshold
    keeps nothing, 1 when it drops nothing."""
    threshold = dropout_keep_threshold(dropout_p)
    if threshold == 256:
        return 1.0
    p32 = torch.tensor(dropout_p, dtype=torch.float32).item()
    return 1.0 / (1.0 - p32) if threshold > 0 else 0.0


def dropout_keep_mask(seed: int, batch_index: int, nheads: int, seqlen_q: int, seqlen_k: int, dropout_p: float,
                      device, rows=None) -> torch.Tensor:
    """flashtile's documented keep decisions (common/dropout.hpp) for one
    sequence: (nheads, seqlen_q, seqlen_k) bool, True where score (i, j) of
    head h is kept. With (R, C) = (16 * (i // 16), 8 * (j // 8)), r = i - R,
    c = j - C: byte 2 * (r >= 8) + c % 2 of word c // 2 of Philox(counter =
    (C, R + r % 8, h, batch_index), key = the seed's low and high 32 bits),
    kept iff below dropout_keep_threshold(p). rows (a slice): only those
    query rows, (nheads, len(rows), seqlen_k)."""
    threshold = dropout_keep_threshold(dropout_p)
    h = torch.arange(nheads, device=device, dtype=torch.int64).view(-1, 1, 1)
    i = torch.arange(seqlen_q, device=device, dtype=torch.int64)[rows if rows is not None else slice(None)]
    i = i.view(1, -1, 1)
    j = torch.arange(seqlen_k, device=device, dtype=torch.int64).view(1, 1, -1)
    r, c = i % 16, j % 8
    shape = (nheads, i.shape[1], seqlen_k)
    c0 = (j - c).expand(shape)
    c1 = (i - r + r % 8).expand(shape)
    c2 = h.expand(shape)
    c3 = torch.full(shape, batch_index, device=device, dtype=torch.int64)
    words = torch.stack(philox4x32_10(c0, c1, c2, c3, seed & _U32, (seed >> 32) & _U32))
    word = words.gather(0, (c // 2).expand(shape).unsqueeze(0)).squeeze(0)
    byte = (word >> (8 * (2 * (r >= 8).to(torch.int64) + c % 2))) & 0xFF
    return byte < threshold


def attention_ref(q, k, v, causal=False, softmax_scale=None, upcast=True, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, dropout_p=0.0, dropout_keep=None):
    """softmax(q k^T * scale) v over (batch, seqlen, nheads, headdim) tensors.

    k and v may have fewer heads than q (GQA/MQA): kv head j serves query heads
    j * g ... (j + 1) * g - 1 with g = nheads // nheads_k, as in flash_attn.

    upcast=True computes in float32 (float64 inputs stay float64) and returns
    out in that dtype; upcast=False does the same math in the input dtype.

    Returns (out (b, sq, h, d), lse (b, h, sq)); lse is the natural-log
    logsumexp of each row of scaled, masked scores. A row that sees no key
    (seqlen_k == 0, causal with seqlen_q > seqlen_k, or an empty window) gets
    out 0, lse -inf. window_size: a sliding window (window_mask), combined
    with causal. softcap > 0: scores -> softcap * tanh(scores / softcap);
    alibi_slopes: then scores += alibi_bias(...); both before the masks, as
    flash_attn. The bias is computed and added in float32 (float64 for
    float64) and the sum rounded to the compute dtype, so in low precision
    the biased scores get one rounding, as the unbiased ones do, rather
    than the bias a rounding of its own (flash_attn's test adds its float32
    bias the same way). dropout_keep (bool, (batch, nheads, seqlen_q,
    seqlen_k)) with dropout_p: the probabilities are multiplied by
    keep * dropout_scale(dropout_p) before the product with v (the kernels'
    scale); lse is unchanged.
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    assert v.shape == k.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} differ"
    assert nheads % nheads_k == 0, f"nheads {nheads} not a multiple of nheads_k {nheads_k}"
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    if upcast:
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    else:
        dtype = q.dtype

    if seqlen_k == 0:
        out = torch.zeros(batch, seqlen_q, nheads, head_dim, dtype=dtype, device=q.device)
        lse = torch.full((batch, nheads, seqlen_q), float("-inf"), dtype=dtype, device=q.device)
        return out, lse

    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    group = nheads // nheads_k
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale  # (b, h, sq, sk)
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        wide = torch.float64 if dtype == torch.float64 else torch.float32
        bias = alibi_bias(alibi_slopes, batch, nheads, seqlen_q, seqlen_k, q.device, wide)
        scores = (scores.to(wide) + bias).to(dtype)
    if causal:
        scores = scores.masked_fill(causal_mask(seqlen_q, seqlen_k, q.device), float("-inf"))
    if tuple(window_size) != (-1, -1):
        scores = scores.masked_fill(window_mask(seqlen_q, seqlen_k, window_size, q.device), float("-inf"))

    row_max = scores.amax(dim=-1, keepdim=True)
    # A fully masked row has max -inf; shift it by 0 so exp gives 0, not NaN.
    row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
    p = torch.exp(scores - row_max)
    row_sum = p.sum(dim=-1, keepdim=True)
    lse = (row_max + torch.log(row_sum)).squeeze(-1)  # log(0) = -inf for empty rows
    p = p / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum)
    if dropout_keep is not None:
        p = p.masked_fill(~dropout_keep, 0.0) * dropout_scale(dropout_p)
    out = torch.einsum("bhqk,bkhd->bqhd", p, v)
    return out, lse


def attention_ref_backward(q, k, v, dout, causal=False, softmax_scale=None, upcast=True, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, dropout_p=0.0, dropout_keep=None):
    """out and (dq, dk, dv) of :func:`attention_ref` for the cotangent ``dout``.

    Autograd runs on detached leaf copies, so the caller's tensors (views,
    tensors that require grad) are left alone. upcast=True first copies q, k,
    v and dout to float32 (float64 stays float64): the gradients are the
    reference's own, not rounded back to the input dtype. upcast=False keeps
    the input dtype: the gradients PyTorch itself computes in low precision.
    dk and dv have k's heads (GQA/MQA: each sums over its group).

    Returns (out, (dq, dk, dv)), all detached.
    """
    if upcast:
        dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    else:
        dtype = q.dtype
    with torch.enable_grad():
        leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        out, _lse = attention_ref(*leaves, causal=causal, softmax_scale=softmax_scale,
                                  upcast=upcast, window_size=window_size, softcap=softcap,
                                  alibi_slopes=alibi_slopes, dropout_p=dropout_p, dropout_keep=dropout_keep)
        grads = torch.autograd.grad(out, leaves, dout.detach().to(out.dtype))
    return out.detach(), tuple(grads)


def varlen_attention_ref(q, k, v, dout, cu_seqlens, causal=False, softmax_scale=None, upcast=True,
                         window_size=(-1, -1)):
    """A packed varlen batch (total, nheads, d) through the reference, each
    sequence of cu_seqlens on its own (same rows of q and k): out, lse
    (nheads, total) and (dq, dk, dv) for the cotangent ``dout``, detached."""
    outs, lses, grads = [], [], ([], [], [])
    bounds = cu_seqlens.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        seq = [t[a:b].unsqueeze(0).detach() for t in (q, k, v)]
        _, lse = attention_ref(*seq, causal=causal, softmax_scale=softmax_scale, upcast=upcast,
                               window_size=window_size)
        out, seq_grads = attention_ref_backward(*seq, dout[a:b].unsqueeze(0), causal, softmax_scale, upcast,
                                                window_size)
        outs.append(out[0])
        lses.append(lse[0])
        for acc, g in zip(grads, seq_grads):
            acc.append(g[0])
    return torch.cat(outs), torch.cat(lses, dim=1), tuple(torch.cat(g) for g in grads)


def assert_close_fa_rule(actual, ref, torch_lowp, name, factor=2.0, atol=1e-5):
    """FlashAttention's bar: max|actual - ref| <= factor * max|torch_lowp - ref| + atol.

    ``ref`` is the upcast reference, ``torch_lowp`` the same math done by
    PyTorch in the low-precision dtype. Where ``ref`` is -inf (an lse row that
    sees no key) ``actual`` must be exactly -inf; everywhere else it must be
    finite. Elements where ``torch_lowp`` itself is not finite do not count
    towards PyTorch's error.
    """
    assert actual.shape == ref.shape == torch_lowp.shape, (
        f"{name}: shapes differ: actual {tuple(actual.shape)}, ref {tuple(ref.shape)}, "
        f"torch_lowp {tuple(torch_lowp.shape)}"
    )
    if actual.numel() == 0:
        return
    actual = actual.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    torch_lowp = torch_lowp.detach().to(torch.float64)

    assert not torch.isnan(ref).any() and not torch.isposinf(ref).any(), (
        f"{name}: the reference itself holds NaN or +inf"
    )
    ref_neginf = torch.isneginf(ref)
    n_nan = int(torch.isnan(actual).sum())
    assert n_nan == 0, f"{name}: {n_nan} of {actual.numel()} elements are NaN"
    wrong_inf = ref_neginf != torch.isneginf(actual)
    if wrong_inf.any():
        idx = tuple(int(i) for i in wrong_inf.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(wrong_inf.sum())} elements disagree on -inf with the reference; "
            f"first at {idx}: actual {actual[idx].item()}, ref {ref[idx].item()}"
        )
    n_posinf = int(torch.isposinf(actual).sum())
    assert n_posinf == 0, f"{name}: {n_posinf} elements are +inf"

    finite = ~ref_neginf
    if not finite.any():
        return
    err = torch.where(finite, (actual - ref).abs(), torch.zeros_like(ref))
    lowp_ok = finite & torch.isfinite(torch_lowp)
    lowp_err = torch.where(lowp_ok, (torch_lowp - ref).abs(), torch.zeros_like(ref))
    max_err = err.max().item()
    max_lowp = lowp_err.max().item()
    bound = factor * max_lowp + atol
    if not max_err <= bound:
        flat = int(err.argmax())
        idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape))
        raise AssertionError(
            f"{name}: max |actual - ref| = {max_err:.3e} exceeds {factor} * max |torch_lowp - ref| "
            f"({max_lowp:.3e}) + {atol:.1e} = {bound:.3e}; worst at {idx}: "
            f"actual {actual[idx].item():.6g}, ref {ref[idx].item():.6g}, "
            f"torch_lowp {torch_lowp[idx].item():.6g}"
        )
