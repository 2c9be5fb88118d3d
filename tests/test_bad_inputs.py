"""Every public function against one table of bad inputs.

Each row is a way an argument can be wrong; the test calls the function and
asks for the exception type and for message fragments that name the argument.
The table runs on CPU tensors everywhere (validation reads metadata only and
checks placement last, so CPU tensors reach every check but placement) and,
where a GPU exists, again on CUDA tensors, where the rows about placement and
pointers apply too. Python functions allocate their own outputs, so a refusal
leaves nothing to protect; the extension's entry points, which write into
caller-provided buffers, are covered in test_reliability_gpu.py, and the C++
API's own checks in tests/cpp/api_checks.cpp.

Inputs that are unusual but valid are not errors. What flash_attn accepts
and some other library might refuse (a window as a tensor or with sides below
-1, a negative softcap, any strides or start address) has a table of its own
here, ACCEPTED, each against the plain call it means; expanded k/v with stride
0 and empty tensors are in test_reliability_gpu.py.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import pytest
import torch

import flashtile
from flashtile import _C, _checks

FWD_BUILT = _checks.fwd_combos(_C.built_kernels())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@dataclasses.dataclass
class Inputs:
    """Valid tensors of the first built (head dim, dtype): q (2, 5, 4, d), k, v (2, 7, 2, d)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor

    @classmethod
    def make(cls, device: str) -> "Inputs":
        if not FWD_BUILT:
            pytest.skip("this build has no forward kernel to validate inputs for")
        head_dim, name = FWD_BUILT[0]
        dtype = DTYPES[name]
        q = torch.randn(2, 5, 4, head_dim, device=device).to(dtype)
        k = torch.randn(2, 7, 2, head_dim, device=device).to(dtype)
        v = torch.randn(2, 7, 2, head_dim, device=device).to(dtype)
        return cls(q, k, v)

    @property
    def qkv(self) -> torch.Tensor:  # (2, 5, 3, 4, d): k, v widened to q's shape
        k = self.k[:, :5].repeat_interleave(2, dim=2)
        v = self.v[:, :5].repeat_interleave(2, dim=2)
        return torch.stack([self.q, k, v], dim=2)

    @property
    def kv(self) -> torch.Tensor:  # (2, 7, 2, 2, d)
        return torch.stack([self.k, self.v], dim=2)

    # The same batch packed for the varlen functions: two sequences of 5
    # query rows and 7 keys.
    @property
    def vq(self) -> torch.Tensor:  # (10, 4, d)
        return self.q.flatten(0, 1)

    @property
    def vk(self) -> torch.Tensor:  # (14, 2, d)
        return self.k.flatten(0, 1)

    @property
    def vv(self) -> torch.Tensor:  # (14, 2, d)
        return self.v.flatten(0, 1)

    @property
    def cu_q(self) -> torch.Tensor:
        return torch.tensor([0, 5, 10], dtype=torch.int32, device=self.q.device)

    @property
    def cu_k(self) -> torch.Tensor:
        return torch.tensor([0, 7, 14], dtype=torch.int32, device=self.q.device)


def misaligned_stride(t: torch.Tensor) -> torch.Tensor:
    """The same values with a row stride of head_dim + 1 elements."""
    padded = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype, device=t.device)
    padded[..., : t.shape[-1]] = t
    return padded[..., : t.shape[-1]]


def misaligned_pointer(t: torch.Tensor) -> torch.Tensor:
    """The same values starting 2 bytes past a 16-byte boundary."""
    flat = torch.empty(t.numel() + 8, dtype=t.dtype, device=t.device)
    view = flat[1 : 1 + t.numel()].view(t.shape)
    view.copy_(t)
    return view


def transposed_last_dim(t: torch.Tensor) -> torch.Tensor:
    """The same values with stride(-1) != 1."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] = size
    return torch.randn(shape, device=t.device).to(t.dtype)


@dataclasses.dataclass
class Case:
    name: str
    call: Callable[[Inputs], object]  # makes the bad call
    exc: type
    fragments: tuple[str, ...]
    cuda_only: bool = False  # placement and pointer rows: CPU tensors stop at the device check


F = flashtile.flash_attn_func
QKV = flashtile.flash_attn_qkvpacked_func
KV = flashtile.flash_attn_kvpacked_func
VL = flashtile.flash_attn_varlen_func
VLQKV = flashtile.flash_attn_varlen_qkvpacked_func
VLKV = flashtile.flash_attn_varlen_kvpacked_func
KVC = flashtile.flash_attn_with_kvcache


def varlen(x: "Inputs", **changes):
    """flash_attn_varlen_func on x's packed batch, with some arguments replaced."""
    args = dict(q=x.vq, k=x.vk, v=x.vv, cu_seqlens_q=x.cu_q, cu_seqlens_k=x.cu_k, max_seqlen_q=5, max_seqlen_k=7)
    args.update(changes)
    return VL(**args)

# Options: every function takes the same ones.
OPTION_ROWS = [
    ("dropout_p < 0", {"dropout_p": -0.1}, ValueError, ("dropout_p", "[0, 1)")),
    ("dropout_p = 1", {"dropout_p": 1.0}, ValueError, ("dropout_p", "[0, 1)")),
    ("dropout_p not a number", {"dropout_p": "0.1"}, TypeError, ("dropout_p", "str")),
    ("dropout_p rounds to 1 in float32", {"dropout_p": 1.0 - 2.0 ** -30}, ValueError, ("dropout_p", "float32")),
    ("dropout_p NaN", {"dropout_p": float("nan")}, ValueError, ("dropout_p", "[0, 1)")),
    ("window_size not a pair", {"window_size": (1, 2, 3)}, TypeError, ("window_size", "pair")),
    ("window_size floats", {"window_size": (1.0, 2.0)}, TypeError, ("window_size", "pair")),
    ("window_size a 2-D tensor", {"window_size": torch.tensor([[8, 0]])}, TypeError, ("window_size", "pair")),
    ("window_size a float tensor", {"window_size": torch.tensor([8.0, 0.0])}, TypeError, ("window_size", "pair")),
    ("window_size a string", {"window_size": "ab"}, TypeError, ("window_size", "pair")),
    ("softcap NaN", {"softcap": float("nan")}, ValueError, ("softcap",)),
    ("softcap inf", {"softcap": float("inf")}, ValueError, ("softcap",)),
    ("softcap None", {"softcap": None}, TypeError, ("softcap", "NoneType")),
    ("softcap above float32", {"softcap": 1e39}, ValueError, ("softcap", "float32")),
    ("softcap subnormal", {"softcap": 1e-40}, ValueError, ("softcap", "normal float32")),
    ("alibi_slopes a list", {"alibi_slopes": [1.0]}, TypeError, ("alibi_slopes", "list")),
    ("alibi_slopes float64", {"alibi_slopes": torch.ones(4, dtype=torch.float64)}, ValueError,
     ("alibi_slopes must be float32",)),
    ("alibi_slopes of too few heads", {"alibi_slopes": torch.ones(3)}, ValueError,
     ("alibi_slopes must have shape", "(nheads,) = (4,)", "got (3)")),
    ("alibi_slopes of another batch", {"alibi_slopes": torch.ones(3, 4)}, ValueError,
     ("alibi_slopes must have shape", "(batch, nheads) = (2, 4)", "got (3, 4)")),
    ("alibi_slopes 3-D", {"alibi_slopes": torch.ones(2, 4, 1)}, ValueError, ("alibi_slopes must have shape",)),
    ("softmax_scale 0", {"softmax_scale": 0.0}, ValueError, ("softmax_scale", "positive")),
    ("softmax_scale < 0", {"softmax_scale": -0.125}, ValueError, ("softmax_scale", "positive")),
    ("softmax_scale NaN", {"softmax_scale": float("nan")}, ValueError, ("softmax_scale", "finite")),
    ("softmax_scale inf", {"softmax_scale": float("inf")}, ValueError, ("softmax_scale", "finite")),
    ("softmax_scale a string", {"softmax_scale": "0.1"}, TypeError, ("softmax_scale", "str")),
    ("softmax_scale a tensor", {"softmax_scale": torch.tensor(0.1)}, TypeError, ("softmax_scale", "Tensor")),
    ("causal a string", {"causal": "yes"}, TypeError, ("causal", "bool")),
    ("causal a tensor", {"causal": torch.tensor(True)}, TypeError, ("causal", "bool")),
]


def option_cases() -> list[Case]:
    cases = []
    for name, kwargs, exc, fragments in OPTION_ROWS:
        cases.append(Case(f"func: {name}", lambda x, kw=kwargs: F(x.q, x.k, x.v, **kw), exc, fragments))
        cases.append(Case(f"qkvpacked: {name}", lambda x, kw=kwargs: QKV(x.qkv, **kw), exc, fragments))
        cases.append(Case(f"kvpacked: {name}", lambda x, kw=kwargs: KV(x.q, x.kv, **kw), exc, fragments))
        cases.append(Case(f"varlen: {name}", lambda x, kw=kwargs: varlen(x, **kw), exc, fragments))
        cases.append(Case(f"varlen_qkvpacked: {name}",
                          lambda x, kw=kwargs: VLQKV(x.qkv.flatten(0, 1), x.cu_q, 5, **kw), exc, fragments))
        cases.append(Case(f"varlen_kvpacked: {name}",
                          lambda x, kw=kwargs: VLKV(x.vq, x.kv.flatten(0, 1), x.cu_q, x.cu_k, 5, 7, **kw),
                          exc, fragments))
        if "dropout_p" not in kwargs:  # flash_attn_with_kvcache has no dropout
            cases.append(Case(f"kvcache: {name}", lambda x, kw=kwargs: KVC(x.q, x.k, x.v, **kw), exc, fragments))
    return cases


def with_arg(x: Inputs, which: str, value) -> tuple:
    args = {"q": x.q, "k": x.k, "v": x.v}
    args[which] = value
    return args["q"], args["k"], args["v"]


def tensor_cases() -> list[Case]:
    cases = []
    for w in "qkv":
        cases += [
            Case(f"func: {w} not a tensor", lambda x, w=w: F(*with_arg(x, w, getattr(x, w).tolist())),
                 TypeError, (f"{w} must be a torch.Tensor", "list")),
            Case(f"func: {w} 3-D", lambda x, w=w: F(*with_arg(x, w, getattr(x, w).flatten(2))),
                 ValueError, (f"{w} must be 4-D", "3-D")),
            Case(f"func: {w} 5-D", lambda x, w=w: F(*with_arg(x, w, getattr(x, w).unsqueeze(0))),
                 ValueError, (f"{w} must be 4-D", "5-D")),
            Case(f"func: {w} on the CPU", lambda x, w=w: F(*with_arg(x, w, getattr(x, w).cpu())),
                 ValueError, (f"{w} must be on a CUDA device, got cpu",), cuda_only=True),
        ]
    for dtype in (torch.float32, torch.float64, torch.int8, torch.float8_e4m3fn):
        cases.append(Case(f"func: q, k, v {dtype}",
                          lambda x, d=dtype: F(x.q.to(d), x.k.to(d), x.v.to(d)),
                          ValueError, ("q must be float16 or bfloat16", str(dtype))))
    for w in "kv":
        cases.append(Case(f"func: {w} of another dtype",
                          lambda x, w=w: F(*with_arg(x, w, getattr(x, w).to(
                              torch.float16 if x.q.dtype == torch.bfloat16 else torch.bfloat16))),
                          ValueError, (f"{w} must have the same dtype as q",)))
    cases += [
        Case("func: k batch differs", lambda x: F(*with_arg(x, "k", resized(x.k, 0, 3))),
             ValueError, ("k must have the same batch size as q (2)",)),
        Case("func: v batch differs", lambda x: F(*with_arg(x, "v", resized(x.v, 0, 3))),
             ValueError, ("v must have the same batch size as q (2)",)),
        Case("func: k head dim differs", lambda x: F(*with_arg(x, "k", resized(x.k, 3, 16))),
             ValueError, ("k must have the same head dim as q",)),
        Case("func: v seqlen differs from k", lambda x: F(*with_arg(x, "v", resized(x.v, 1, 8))),
             ValueError, ("v must have the same seqlen as k (7)",)),
        Case("func: v heads differ from k", lambda x: F(*with_arg(x, "v", resized(x.v, 2, 1))),
             ValueError, ("v must have the same number of heads as k (2)",)),
        Case("func: nheads not a multiple of nheads_k",
             lambda x: F(resized(x.q, 2, 3), x.k, x.v),
             ValueError, ("nheads of q (3) must be a multiple of nheads of k (2)",)),
        Case("func: nheads_k 0", lambda x: F(x.q, resized(x.k, 2, 0), resized(x.v, 2, 0)),
             ValueError, ("k must have at least one head",)),
        Case("func: alibi_slopes on the CPU", lambda x: F(x.q, x.k, x.v, alibi_slopes=torch.ones(4)),
             ValueError, ("alibi_slopes must be on a CUDA device, got cpu",), cuda_only=True),
    ]
    for head_dim, exc, fragment in ((0, ValueError, "head dims go from 1 to 256"),
                                    (264, ValueError, "head dims go from 1 to 256"),
                                    (257, ValueError, "head dims go from 1 to 256"),
                                    (512, ValueError, "head dims go from 1 to 256")):
        cases.append(Case(f"func: head dim {head_dim}",
                          lambda x, d=head_dim: F(resized(x.q, 3, d), resized(x.k, 3, d), resized(x.v, 3, d)),
                          exc, (f"q: head dim {head_dim}", fragment)))
    return cases


def packed_cases() -> list[Case]:
    return [
        Case("qkvpacked: qkv a tuple", lambda x: QKV((x.q, x.q, x.q)), TypeError, ("qkv must be a torch.Tensor",)),
        Case("qkvpacked: qkv 4-D", lambda x: QKV(x.q), ValueError, ("qkv must be 5-D", "4-D")),
        Case("qkvpacked: 2 instead of 3", lambda x: QKV(x.qkv[:, :, :2]), ValueError, ("qkv must be 5-D",)),
        Case("qkvpacked: float32", lambda x: QKV(x.qkv.float()), ValueError, ("qkv must be float16 or bfloat16",)),
        Case("qkvpacked: head dim 264", lambda x: QKV(resized(x.qkv, 4, 264)), ValueError,
             ("qkv: head dim 264 is not supported",)),
        Case("qkvpacked: on the CPU", lambda x: QKV(x.qkv.cpu()), ValueError,
             ("qkv must be on a CUDA device, got cpu",), cuda_only=True),
        Case("kvpacked: kv a tuple", lambda x: KV(x.q, (x.k, x.v)), TypeError, ("kv must be a torch.Tensor",)),
        Case("kvpacked: kv 4-D", lambda x: KV(x.q, x.kv.flatten(2, 3)), ValueError, ("kv must be 5-D", "4-D")),
        Case("kvpacked: 3 instead of 2", lambda x: KV(x.q, torch.cat([x.kv, x.kv[:, :, :1]], dim=2)),
             ValueError, ("kv must be 5-D",)),
        Case("kvpacked: batch differs", lambda x: KV(x.q, x.kv[:1]), ValueError,
             ("kv must have the same batch size as q",)),
        Case("kvpacked: nheads not a multiple", lambda x: KV(x.q, resized(x.kv, 3, 3)), ValueError,
             ("nheads of q (4) must be a multiple of nheads of kv (3)",)),
        Case("kvpacked: dtype differs", lambda x: KV(x.q, x.kv.float()), ValueError,
             ("kv must have the same dtype as q",)),
        Case("kvpacked: q 3-D", lambda x: KV(x.q.flatten(2), x.kv), ValueError, ("q must be 4-D",)),
        Case("kvpacked: kv on the CPU", lambda x: KV(x.q, x.kv.cpu()), ValueError,
             ("kv must be on a CUDA device, got cpu",), cuda_only=True),
    ]


def varlen_cases() -> list[Case]:
    i64 = torch.int64
    return [
        Case("varlen: q 4-D", lambda x: varlen(x, q=x.q), ValueError, ("q must be 3-D", "4-D")),
        Case("varlen: k 2-D", lambda x: varlen(x, k=x.vk[:, 0]), ValueError, ("k must be 3-D",)),
        Case("varlen: v rows differ from k", lambda x: varlen(x, v=x.vv[:13]), ValueError,
             ("v must have the shape of k",)),
        Case("varlen: k head dim differs", lambda x: varlen(x, k=resized(x.vk, 2, 16)), ValueError,
             ("k must have the same head dim as q",)),
        Case("varlen: nheads not a multiple", lambda x: varlen(x, k=resized(x.vk, 1, 3), v=resized(x.vv, 1, 3)),
             ValueError, ("nheads of q (4) must be a multiple of nheads of k (3)",)),
        Case("varlen: nheads past the grid", lambda x: varlen(x, q=x.vq[:, :1].expand(-1, 65536 * 2, -1)),
             ValueError, ("q: nheads 131072 is above the supported 65535",)),
        Case("varlen: q float32", lambda x: varlen(x, q=x.vq.float()), ValueError,
             ("q must be float16 or bfloat16",)),
        Case("varlen: head dim 264", lambda x: varlen(x, q=resized(x.vq, 2, 264), k=resized(x.vk, 2, 264),
                                                      v=resized(x.vv, 2, 264)),
             ValueError, ("q: head dim 264",)),
        Case("varlen: cu_seqlens_q a list", lambda x: varlen(x, cu_seqlens_q=[0, 5, 10]), TypeError,
             ("cu_seqlens_q must be a torch.Tensor", "list")),
        Case("varlen: cu_seqlens_q int64", lambda x: varlen(x, cu_seqlens_q=x.cu_q.to(i64)), ValueError,
             ("cu_seqlens_q must be int32", "int64")),
        Case("varlen: cu_seqlens_q 2-D", lambda x: varlen(x, cu_seqlens_q=x.cu_q[None]), ValueError,
             ("cu_seqlens_q must be 1-D",)),
        Case("varlen: cu_seqlens_q empty", lambda x: varlen(x, cu_seqlens_q=x.cu_q[:0]), ValueError,
             ("cu_seqlens_q must have batch + 1 >= 1 entries",)),
        Case("varlen: cu_seqlens_q strided",
             lambda x: varlen(x, cu_seqlens_q=torch.stack([x.cu_q, x.cu_q], dim=1)[:, 0]), ValueError,
             ("cu_seqlens_q must be contiguous",)),
        Case("varlen: cu_seqlens_k of another batch", lambda x: varlen(x, cu_seqlens_k=x.cu_k[:2]), ValueError,
             ("cu_seqlens_k must have 3 entries",)),
        Case("varlen: cu_seqlens_k float", lambda x: varlen(x, cu_seqlens_k=x.cu_k.float()), ValueError,
             ("cu_seqlens_k must be int32",)),
        Case("varlen: max_seqlen_q a float", lambda x: varlen(x, max_seqlen_q=5.0), TypeError,
             ("max_seqlen_q must be an int", "float")),
        Case("varlen: max_seqlen_q a tensor", lambda x: varlen(x, max_seqlen_q=torch.tensor(5)), TypeError,
             ("max_seqlen_q must be an int", "Tensor")),
        Case("varlen: max_seqlen_k negative", lambda x: varlen(x, max_seqlen_k=-1), ValueError,
             ("max_seqlen_k must be in [0,",)),
        Case("varlen: max_seqlen_k above the limit", lambda x: varlen(x, max_seqlen_k=2**29 + 1), ValueError,
             ("max_seqlen_k must be in [0, 536870912]",)),
        Case("varlen: seqused_k of another batch",
             lambda x: varlen(x, seqused_k=torch.tensor([7], dtype=torch.int32, device=x.q.device)), ValueError,
             ("seqused_k must have 2 entries",)),
        Case("varlen: seqused_k int64",
             lambda x: varlen(x, seqused_k=torch.tensor([7, 7], device=x.q.device)), ValueError,
             ("seqused_k must be int32",)),
        Case("varlen: block_table with unpaged k", lambda x: varlen(x, block_table=torch.zeros(2, 1, dtype=torch.int32)),
             ValueError, ("k and v must be paged caches",)),
        Case("varlen: alibi_slopes of another batch", lambda x: varlen(x, alibi_slopes=torch.ones(3, 4)),
             ValueError, ("alibi_slopes must have shape", "(batch, nheads) = (2, 4)")),
        Case("varlen: q on the CPU", lambda x: varlen(x, q=x.vq.cpu()), ValueError,
             ("q must be on a CUDA device, got cpu",), cuda_only=True),
        Case("varlen: cu_seqlens_q on the CPU", lambda x: varlen(x, cu_seqlens_q=x.cu_q.cpu()), ValueError,
             ("cu_seqlens_q must be on a CUDA device, got cpu",), cuda_only=True),
        Case("varlen_qkvpacked: qkv 5-D", lambda x: VLQKV(x.qkv, x.cu_q, 5), ValueError,
             ("qkv must be 4-D (total, 3, nheads, headdim)",)),
        Case("varlen_qkvpacked: cu_seqlens int64", lambda x: VLQKV(x.qkv.flatten(0, 1), x.cu_q.to(i64), 5),
             ValueError, ("cu_seqlens_q must be int32",)),
        Case("varlen_kvpacked: kv 5-D", lambda x: VLKV(x.vq, x.kv, x.cu_q, x.cu_k, 5, 7), ValueError,
             ("kv must be 4-D (total_k, 2, nheads_k, headdim)",)),
        Case("varlen_kvpacked: max_seqlen_k None", lambda x: VLKV(x.vq, x.kv.flatten(0, 1), x.cu_q, x.cu_k, 5, None),
             TypeError, ("max_seqlen_k must be an int",)),
    ]


def kvcache_cases() -> list[Case]:
    """flash_attn_with_kvcache with x.k, x.v as a dense cache (2, 7, 2, d)."""
    i32 = torch.int32

    def ints(x, values, dtype=i32):
        return torch.tensor(values, dtype=dtype, device=x.q.device)

    return [
        Case("kvcache: q 3-D", lambda x: KVC(x.q[0], x.k, x.v), ValueError, ("q must be 4-D",)),
        Case("kvcache: k_cache not a tensor", lambda x: KVC(x.q, x.k.tolist(), x.v), TypeError,
             ("k_cache must be a torch.Tensor", "list")),
        Case("kvcache: v_cache of another shape", lambda x: KVC(x.q, x.k, x.v[:, :3]), ValueError,
             ("v_cache must have k_cache's shape",)),
        Case("kvcache: k_cache head dim differs", lambda x: KVC(x.q, resized(x.k, 3, 16), resized(x.v, 3, 16)),
             ValueError, ("k_cache", "head dim")),
        Case("kvcache: nheads not a multiple", lambda x: KVC(x.q, resized(x.k, 2, 3), resized(x.v, 2, 3)),
             ValueError, ("nheads (4) must be a multiple of k_cache's nheads_k (3)",)),
        Case("kvcache: q float32", lambda x: KVC(x.q.float(), x.k.float(), x.v.float()), ValueError,
             ("q must be float16 or bfloat16",)),
        Case("kvcache: k_cache of another dtype", lambda x: KVC(x.q, x.k.float(), x.v.float()), TypeError,
             ("k_cache must have q's dtype",)),
        Case("kvcache: head dim 264", lambda x: KVC(resized(x.q, 3, 264), resized(x.k, 3, 264), resized(x.v, 3, 264)),
             ValueError, ("q: head dim 264",)),
        Case("kvcache: k without v", lambda x: KVC(x.q, x.k, x.v, k=x.k[:, :1]), ValueError, ("k and v",)),
        Case("kvcache: new k of another nheads_k", lambda x: KVC(x.q, x.k, x.v, k=x.q[:, :1], v=x.q[:, :1]),
             ValueError, ("k must be (2, seqlen_new, 2,",)),
        Case("kvcache: cache_seqlens int64", lambda x: KVC(x.q, x.k, x.v, cache_seqlens=ints(x, [1, 2], torch.int64)),
             TypeError, ("cache_seqlens must be int32",)),
        Case("kvcache: cache_seqlens of another batch", lambda x: KVC(x.q, x.k, x.v, cache_seqlens=ints(x, [1])),
             ValueError, ("cache_seqlens must be (2,)",)),
        Case("kvcache: cache_seqlens negative", lambda x: KVC(x.q, x.k, x.v, cache_seqlens=-1), ValueError,
             ("cache_seqlens must be a non-negative int",)),
        Case("kvcache: rotary_cos without rotary_sin", lambda x: KVC(x.q, x.k, x.v, rotary_cos=torch.ones(7, 8)),
             ValueError, ("rotary_cos and rotary_sin",)),
        Case("kvcache: block_table int64",
             lambda x: KVC(x.q, x.k, x.v, block_table=ints(x, [[0], [1]], torch.int64)), TypeError,
             ("block_table must be int32",)),
        Case("kvcache: block_table with cache_batch_idx",
             lambda x: KVC(x.q, x.k, x.v, block_table=ints(x, [[0], [1]]), cache_batch_idx=ints(x, [0, 1])),
             ValueError, ("cache_batch_idx: not with a paged cache",)),
        Case("kvcache: cache_leftpad of another batch", lambda x: KVC(x.q, x.k, x.v, cache_leftpad=ints(x, [0])),
             ValueError, ("cache_leftpad must be (2,)",)),
        Case("kvcache: num_splits negative", lambda x: KVC(x.q, x.k, x.v, num_splits=-1), ValueError,
             ("num_splits must be an int >= 0",)),
        Case("kvcache: on the CPU", lambda x: KVC(x.q.cpu(), x.k.cpu(), x.v.cpu()), ValueError,
             ("q must be on a CUDA device, got cpu",), cuda_only=True),
        Case("kvcache: k_cache on another device than q", lambda x: KVC(x.q, x.k.cpu(), x.v.cpu()), ValueError,
             ("k_cache is on cpu",), cuda_only=True),
    ]


CASES = option_cases() + tensor_cases() + packed_cases() + varlen_cases() + kvcache_cases()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_refused_naming_the_argument(case, device):
    if case.cuda_only and device != "cuda":
        pytest.skip("placement and pointer rows need CUDA tensors")
    inputs = Inputs.make(device)
    with pytest.raises(case.exc) as info:
        case.call(inputs)
    message = str(info.value)
    for fragment in case.fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# The row prefix of each public function; a new public function fails
# test_the_table_covers_every_public_function until it has rows here.
ROW_PREFIX = {"flash_attn_func": "func", "flash_attn_qkvpacked_func": "qkvpacked",
              "flash_attn_kvpacked_func": "kvpacked", "flash_attn_varlen_func": "varlen",
              "flash_attn_varlen_qkvpacked_func": "varlen_qkvpacked",
              "flash_attn_varlen_kvpacked_func": "varlen_kvpacked", "flash_attn_with_kvcache": "kvcache"}


@pytest.mark.parametrize("device", DEVICES)
def test_refused_kvcache_call_leaves_the_cache_alone(device):
    """The new keys are appended in place, so every check runs first: a call
    refused for its ALiBi slopes (checked last before placement) writes nothing."""
    x = Inputs.make(device)
    k_cache, v_cache = x.k.clone(), x.v.clone()
    with pytest.raises(ValueError, match="alibi_slopes"):
        KVC(x.q, k_cache, v_cache, k=x.k[:, :2], v=x.v[:, :2], cache_seqlens=1,
            alibi_slopes=torch.ones(3, device=device))
    assert torch.equal(k_cache, x.k) and torch.equal(v_cache, x.v)


def test_the_table_covers_every_public_function():
    public = {name for name in flashtile.__all__ if callable(getattr(flashtile, name))}
    assert public == set(ROW_PREFIX), f"public functions without rows: {public - set(ROW_PREFIX)}"
    rows = {prefix: sum(c.name.startswith(prefix + ":") for c in CASES) for prefix in ROW_PREFIX.values()}
    assert all(n >= len(OPTION_ROWS) for n in rows.values()), rows


@dataclasses.dataclass
class Accepted:
    name: str
    call: Callable[[Inputs], torch.Tensor]
    same_as: Callable[[Inputs], torch.Tensor]  # the plain call it means


def accepted_cases() -> list[Accepted]:
    cases = [
        Accepted("window_size a tensor", lambda x: F(x.q, x.k, x.v, window_size=torch.tensor([3, 1])),
                 lambda x: F(x.q, x.k, x.v, window_size=(3, 1))),
        Accepted("window_size a list of 0-d tensors",
                 lambda x: F(x.q, x.k, x.v, window_size=list(torch.tensor([2, 0]))),
                 lambda x: F(x.q, x.k, x.v, window_size=(2, 0))),
        Accepted("window_size below -1", lambda x: F(x.q, x.k, x.v, window_size=(-7, -2)),
                 lambda x: F(x.q, x.k, x.v)),
        Accepted("window_size left below -1", lambda x: F(x.q, x.k, x.v, window_size=(-3, 0)),
                 lambda x: F(x.q, x.k, x.v, causal=True)),
        Accepted("softcap < 0", lambda x: F(x.q, x.k, x.v, softcap=-1.0), lambda x: F(x.q, x.k, x.v)),
        Accepted("qkvpacked: last dim not contiguous", lambda x: QKV(transposed_last_dim(x.qkv)),
                 lambda x: QKV(x.qkv)),
        Accepted("varlen: q last dim not contiguous", lambda x: varlen(x, q=transposed_last_dim(x.vq)),
                 lambda x: varlen(x)),
        Accepted("varlen: k row stride not a multiple of 8", lambda x: varlen(x, k=misaligned_stride(x.vk)),
                 lambda x: varlen(x)),
    ]
    for w in "qkv":
        for how, make in (("last dim not contiguous", transposed_last_dim),
                          ("row stride not a multiple of 8", misaligned_stride),
                          ("not 16-byte aligned", misaligned_pointer)):
            cases.append(Accepted(f"func: {w} {how}", lambda x, w=w, make=make: F(*with_arg(x, w, make(getattr(x, w)))),
                                  lambda x: F(x.q, x.k, x.v)))
    return cases


ACCEPTED = accepted_cases()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ACCEPTED, ids=[c.name for c in ACCEPTED])
def test_what_flash_attn_accepts_is_accepted(case, device):
    """On CPU tensors the call gets past every check to the placement one;
    on a GPU it runs and gives the plain call's bits."""
    inputs = Inputs.make(device)
    if device == "cpu":
        with pytest.raises(ValueError, match="must be on a CUDA device, got cpu"):
            case.call(inputs)
    else:
        assert torch.equal(case.call(inputs), case.same_as(inputs))
