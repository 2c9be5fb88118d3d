"""CPU-only tests: argument validation, the reference, the dispatch table.

Validation runs every check but the device one before looking at where a
tensor lives, so CPU tensors reach all of them; fake CUDA tensors
(FakeTensorMode needs no GPU) cover the device checks and the op's fake
implementation.
"""

import contextlib
import re
import types

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import flashtile
from flashtile import _C, _checks, _ops
from flashtile._checks import KernelNotBuiltError
from reference import (assert_close_fa_rule, attention_ref, causal_mask, dropout_keep_mask, dropout_keep_probability,
                       philox4x32_10)

FWD_BUILT = _checks.fwd_combos(_C.built_kernels())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def built_config():
    """A (head_dim, dtype) this build has, so that inputs reach the later checks."""
    head_dim, dtype_name = FWD_BUILT[0]
    return head_dim, DTYPES[dtype_name]


def make_qkv(batch=2, seqlen_q=5, seqlen_k=7, nheads=4, nheads_k=2, head_dim=None, dtype=None,
             device="cpu"):
    built_hd, built_dt = built_config()
    head_dim = built_hd if head_dim is None else head_dim
    dtype = built_dt if dtype is None else dtype
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device=device).to(dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device).to(dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device).to(dtype)
    return q, k, v


@contextlib.contextmanager
def raises(exc, *fragments):
    """pytest.raises for ``exc`` whose message contains every fragment."""
    with pytest.raises(exc) as info:
        yield info
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in the message {message!r}"


# --------------------------------------------------------------------------
# the dispatch table
# --------------------------------------------------------------------------


def test_built_kernels_well_formed():
    table = _C.built_kernels()
    assert isinstance(table, list) and len(table) > 0, f"built_kernels() is empty: {table!r}"
    for entry in table:
        assert isinstance(entry, tuple) and len(entry) == 5, f"bad entry {entry!r}"
        direction, arch, head_dim, dtype_name, variant = entry
        assert variant in ("plain", "scoremod"), entry
        assert direction in ("fwd", "bwd"), entry
        assert isinstance(arch, str) and re.fullmatch(r"sm\d+[a-z]?", arch), entry
        assert isinstance(head_dim, int) and head_dim in _checks.SUPPORTED_HEAD_DIMS, entry
        assert dtype_name in DTYPES, entry
    assert len(set(table)) == len(table), f"duplicate entries in {table!r}"
    assert FWD_BUILT, f"no forward kernel in {table!r}"
    assert _ops.BUILT_KERNELS == tuple(table)


def test_smem_budgets_cover_every_kernel():
    """Each sm80-path kernel has a launcher within every shared-memory budget
    the build was asked for (FLASHTILE_SMEM_BUDGETS), at most one tuned for
    each budget, each fitting the budget it was tuned for: generate.py's
    BUDGET_KERNELS and the C++ tile tables agree."""
    launchers = _C.built_smem_budgets()
    assert launchers, "no sm80 launcher in built_smem_budgets()"
    by_key = {}
    for direction, head_dim, dtype_name, variant, needs_kb, tuned_kb, _sm90_code in launchers:
        row = (direction, head_dim, dtype_name, variant, needs_kb, tuned_kb)
        assert needs_kb in (99, 163, 227) and tuned_kb in (99, 163, 227), row
        assert needs_kb <= tuned_kb, f"{row}: needs more shared memory than the GPUs it was tuned for have"
        by_key.setdefault((direction, head_dim, dtype_name, variant), []).append((needs_kb, tuned_kb))
    assert set(by_key) == {(d, hd, dn, v) for d, arch, hd, dn, v in _C.built_kernels() if arch == "sm80"}
    for key, budgets in by_key.items():
        tuned = [t for _, t in budgets]
        assert len(set(tuned)) == len(tuned), f"{key}: two launchers tuned for one budget: {budgets}"
        assert 227 in tuned, f"{key}: no default launcher: {budgets}"
        for budget in _C.smem_budgets_built:
            assert min(n for n, _ in budgets) <= budget, f"{key}: no launcher within {budget} KB (built: {budgets})"


def test_smem_budget_limit_is_checked():
    with pytest.raises(ValueError, match="99, 163 or 227"):
        _C.limit_smem_budget(100)


def test_fwd_combos_reduces_table():
    table = [("fwd", "sm80", 128, "fp16", "plain"), ("fwd", "sm90", 128, "fp16", "plain"),
             ("bwd", "sm80", 64, "bf16", "plain"), ("fwd", "sm80", 64, "bf16", "plain"),
             ("fwd", "sm80", 32, "bf16", "scoremod")]
    assert _checks.fwd_combos(table) == ((64, "bf16"), (128, "fp16"))
    assert _checks.fwd_combos(table, "scoremod") == ((32, "bf16"),)


def test_unbuilt_combination_is_reported_as_not_built():
    missing = [(hd, dn) for hd in _checks.SUPPORTED_HEAD_DIMS for dn in DTYPES
               if (hd, dn) not in FWD_BUILT]
    if not missing:
        pytest.skip("this build has every supported (head dim, dtype) forward kernel")
    head_dim, dtype_name = missing[0]
    q, k, v = make_qkv(head_dim=head_dim, dtype=DTYPES[dtype_name])
    with raises(KernelNotBuiltError, "q:", f"head dim {head_dim}", dtype_name,
                "not built in this flashtile build"):
        flashtile.flash_attn_func(q, k, v)


def test_check_head_dim_with_synthetic_tables():
    table = ((64, "bf16"),)
    _checks.check_head_dim(64, torch.bfloat16, table)
    with raises(KernelNotBuiltError, "head dim 128", "fp16", "not built", "hdim64/bf16"):
        _checks.check_head_dim(128, torch.float16, table)
    with raises(KernelNotBuiltError, "head dim 64", "fp16", "not built"):
        _checks.check_head_dim(64, torch.float16, table)
    with raises(KernelNotBuiltError, "built: none"):
        _checks.check_head_dim(64, torch.float16, ())
    with raises(KernelNotBuiltError, "softcap/ALiBi", "head dim 64", "FLASHTILE_VARIANTS"):
        _checks.check_head_dim(64, torch.float16, (), variant="scoremod")
    # Padded head dims: the kernel they run must be built; no larger one stands in.
    _checks.check_head_dim(40, torch.bfloat16, table)
    with raises(KernelNotBuiltError, "head dim 128 (which runs head dim 100, zero-padded)", "bf16"):
        _checks.check_head_dim(100, torch.bfloat16, table)
    with raises(KernelNotBuiltError, "head dim 64 (which runs head dim 40, zero-padded)"):
        _checks.check_head_dim(40, torch.bfloat16, ((128, "bf16"),))
    with raises(KernelNotBuiltError, "head dim 256 (which runs head dim 200, zero-padded)", "fp16"):
        _checks.check_head_dim(200, torch.float16, ((192, "fp16"),))
    # Unsupported is its own error, whatever the table holds.
    with raises(ValueError, "q: head dim 264 is not supported", "from 1 to 256"):
        _checks.check_head_dim(264, torch.float16, ((256, "fp16"),))
    assert not issubclass(KernelNotBuiltError, ValueError)


def test_variant_for():
    assert _checks.variant_for(0.0, None) == "plain"
    assert _checks.variant_for(0, None) == "plain"
    assert _checks.variant_for(2.5, None) == "scoremod"
    assert _checks.variant_for(0.0, torch.ones(4)) == "scoremod"
    assert _checks.variant_for(0.0, None, 0.1) == "scoremod"
    assert _checks.variant_for(0.0, None, 0.0) == "plain"


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, fragments",
    [
        ({"dropout_p": -0.1}, ValueError, ["dropout_p", "[0, 1)", "-0.1"]),
        ({"dropout_p": 1.0 - 2.0 ** -30}, ValueError, ["dropout_p", "[0, 1) as a float32"]),
        ({"dropout_p": float("nan")}, ValueError, ["dropout_p", "[0, 1)"]),
        ({"dropout_p": 1.0}, ValueError, ["dropout_p", "[0, 1)"]),
        ({"dropout_p": "0.1"}, TypeError, ["dropout_p", "str"]),
        ({"window_size": torch.tensor([[1, 2]])}, TypeError, ["window_size", "pair"]),
        ({"window_size": (1, 2, 3)}, TypeError, ["window_size", "pair"]),
        ({"window_size": 4}, TypeError, ["window_size", "pair"]),
        ({"window_size": (1.0, 2.0)}, TypeError, ["window_size", "pair"]),
        ({"softcap": float("inf")}, ValueError, ["softcap", "finite"]),
        ({"softcap": float("nan")}, ValueError, ["softcap"]),
        ({"softcap": None}, TypeError, ["softcap", "NoneType"]),
        ({"softcap": 1e39}, ValueError, ["softcap", "float32"]),
        ({"softcap": 1e-40}, ValueError, ["softcap", "normal float32"]),
        ({"alibi_slopes": torch.ones(4, dtype=torch.float64)}, ValueError, ["alibi_slopes", "float32"]),
        ({"alibi_slopes": torch.ones(3)}, ValueError, ["alibi_slopes", "(nheads,) = (4,)", "(3)"]),
        ({"alibi_slopes": torch.ones(3, 4)}, ValueError, ["alibi_slopes", "(batch, nheads) = (2, 4)"]),
        ({"alibi_slopes": torch.ones(1, 2, 4)}, ValueError, ["alibi_slopes", "(nheads,)"]),
        ({"alibi_slopes": [1.0]}, TypeError, ["alibi_slopes", "list"]),
        ({"softmax_scale": "0.1"}, TypeError, ["softmax_scale", "str"]),
        ({"softmax_scale": torch.tensor(0.1)}, TypeError, ["softmax_scale", "Tensor"]),
        ({"softmax_scale": float("inf")}, ValueError, ["softmax_scale", "finite"]),
        ({"softmax_scale": float("nan")}, ValueError, ["softmax_scale", "finite"]),
        ({"softmax_scale": 0.0}, ValueError, ["softmax_scale", "positive"]),
        ({"softmax_scale": -0.125}, ValueError, ["softmax_scale", "positive"]),
        ({"causal": "yes"}, TypeError, ["causal", "bool"]),
        ({"causal": torch.tensor(True)}, TypeError, ["causal", "bool"]),
    ],
)
def test_options_rejected(kwargs, exc, fragments):
    q, k, v = make_qkv()
    with raises(exc, *fragments):
        flashtile.flash_attn_func(q, k, v, **kwargs)


@pytest.mark.parametrize("func", ["qkvpacked", "kvpacked"])
def test_options_rejected_by_packed_functions(func):
    q, k, v = make_qkv(seqlen_k=5, nheads_k=4)
    for kwargs, exc in (({"dropout_p": -0.5}, ValueError),
                        ({"window_size": (2, -3, 1)}, TypeError),
                        ({"softcap": float("nan")}, ValueError),
                        ({"alibi_slopes": torch.ones(4, dtype=torch.int32)}, ValueError),
                        ({"dropout_p": 2.0}, ValueError)):
        name = next(iter(kwargs))
        with raises(exc, name):
            if func == "qkvpacked":
                flashtile.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), **kwargs)
            else:
                flashtile.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"dropout_p": 0.0, "softmax_scale": 0.3, "causal": True, "window_size": [-1, -1],
          "softcap": 0.0, "alibi_slopes": None, "deterministic": True, "return_attn_probs": True},
     {"softmax_scale": 1, "causal": 1, "dropout_p": 0},
     {"window_size": (4, 0)}, {"window_size": [8, 8], "causal": True}, {"window_size": (-1, 0)},
     {"softcap": 30.0}, {"alibi_slopes": torch.ones(4)}, {"alibi_slopes": torch.ones(2, 4), "softcap": 1},
     {"dropout_p": 0.1}, {"dropout_p": 0.5, "return_attn_probs": True, "causal": True},
     {"window_size": torch.tensor([3, 2])}, {"window_size": (-4, -9)}, {"softcap": -2.0}],
)
def test_neutral_options_pass_to_device_check(kwargs):
    """Neutral values of every option, windows, softcap and ALiBi slopes are
    accepted: the call gets as far as the device check, which is the last
    one."""
    q, k, v = make_qkv()
    with raises(ValueError, "q must be on a CUDA device, got cpu"):
        flashtile.flash_attn_func(q, k, v, **kwargs)


def test_options_are_checked_before_tensors():
    with raises(ValueError, "dropout_p"):
        flashtile.flash_attn_func([1], [2], [3], dropout_p=1.5)


# --------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_tensor_rejected(which):
    args = dict(zip("qkv", make_qkv()))
    args[which] = args[which].tolist()
    with raises(TypeError, f"{which} must be a torch.Tensor, got list"):
        flashtile.flash_attn_func(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_wrong_rank_rejected(which):
    args = dict(zip("qkv", make_qkv()))
    args[which] = args[which].flatten(2)
    with raises(ValueError, f"{which} must be 4-D", "got 3-D"):
        flashtile.flash_attn_func(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int8, torch.float8_e4m3fn])
def test_unsupported_dtype_rejected(dtype):
    q, k, v = make_qkv()
    with raises(ValueError, "q must be float16 or bfloat16", str(dtype)):
        flashtile.flash_attn_func(q.to(dtype), k.to(dtype), v.to(dtype))


@pytest.mark.parametrize("which", ["k", "v"])
def test_mixed_dtypes_rejected(which):
    args = dict(zip("qkv", make_qkv()))
    other = torch.float16 if args["q"].dtype == torch.bfloat16 else torch.bfloat16
    args[which] = args[which].to(other)
    with raises(ValueError, f"{which} must have the same dtype as q", str(other)):
        flashtile.flash_attn_func(args["q"], args["k"], args["v"])


@pytest.mark.parametrize(
    "which, shape_change, fragments",
    [
        ("k", dict(batch=3), ["k must have the same batch size as q (2)"]),
        ("v", dict(batch=3), ["v must have the same batch size as q (2)"]),
        ("k", dict(head_dim=16), ["k must have the same head dim as q"]),
        ("v", dict(head_dim=16), ["v must have the same head dim as q"]),
        ("v", dict(seqlen_k=8), ["v must have the same seqlen as k (7)"]),
        ("v", dict(nheads_k=1), ["v must have the same number of heads as k (2)"]),
    ],
)
def test_mismatched_shapes_rejected(which, shape_change, fragments):
    q, k, v = make_qkv()
    dims = dict(batch=2, seqlen_k=7, nheads_k=2, head_dim=q.shape[-1])
    dims.update(shape_change)
    bad = torch.randn(dims["batch"], dims["seqlen_k"], dims["nheads_k"], dims["head_dim"]).to(q.dtype)
    args = {"q": q, "k": k, "v": v, which: bad}
    with raises(ValueError, *fragments):
        flashtile.flash_attn_func(args["q"], args["k"], args["v"])


@pytest.mark.parametrize("nheads, nheads_k", [(6, 4), (3, 2), (4, 8)])
def test_nheads_not_multiple_rejected(nheads, nheads_k):
    q, k, v = make_qkv(nheads=nheads, nheads_k=nheads_k)
    with raises(ValueError, f"nheads of q ({nheads}) must be a multiple of nheads of k ({nheads_k})"):
        flashtile.flash_attn_func(q, k, v)


def test_zero_kv_heads_rejected():
    q, k, v = make_qkv(nheads=4, nheads_k=0)
    with raises(ValueError, "k must have at least one head"):
        flashtile.flash_attn_func(q, k, v)


@pytest.mark.parametrize("head_dim, exc, fragment", [
    (0, ValueError, "head dims go from 1 to 256"),
    (257, ValueError, "head dims go from 1 to 256"),
    (512, ValueError, "head dims go from 1 to 256"),
])
def test_unsupported_head_dim_rejected(head_dim, exc, fragment):
    _, dtype = built_config()
    q, k, v = make_qkv(head_dim=head_dim, dtype=dtype)
    with raises(exc, f"q: head dim {head_dim}", fragment):
        flashtile.flash_attn_func(q, k, v)


@pytest.mark.parametrize("head_dim", [1, 8, 32, 40, 63, 72, 96, 120, 136, 160, 192, 200, 256])
def test_head_dims_up_to_256_pass_to_the_device_check(head_dim):
    """They run the next kernel's head dim, zero-padded (when it is built)."""
    built_dims = {hd for hd, _ in FWD_BUILT}
    if _checks.kernel_head_dim(head_dim) not in built_dims:
        pytest.skip(f"the kernel for head dim {head_dim} is not in this build")
    q, k, v = make_qkv(head_dim=head_dim, dtype=DTYPES[dict((hd, dn) for hd, dn in FWD_BUILT)[
        _checks.kernel_head_dim(head_dim)]])
    with raises(ValueError, "q must be on a CUDA device, got cpu"):
        flashtile.flash_attn_func(q, k, v)


@pytest.mark.parametrize("which", ["q", "k"])
def test_seqlen_above_the_mask_arithmetic_bound_rejected(which):
    """Rows of q or k beyond 2^29 (kMaxSeqlen: the mask's int arithmetic) are
    refused by name; a stride-0 view stands in for the 8 GiB tensor."""
    huge = torch.empty(1, 1, 1, 8, dtype=torch.bfloat16).expand(1, 2**29 + 1, 1, 8)
    small = torch.empty(1, 5, 1, 8, dtype=torch.bfloat16)
    args = (huge, small, small) if which == "q" else (small, huge, huge)
    with raises(ValueError, f"{which}: seqlen 536870913 is above the supported 536870912"):
        flashtile.flash_attn_func(*args)


@pytest.mark.parametrize("window_size, causal, seqlen_q, seqlen_k, expected", [
    ((-1, -1), False, 100, 100, (-1, -1)),
    ((-1, -1), True, 100, 100, (-1, 0)),
    ((-5, -2), False, 100, 100, (-1, -1)),     # any negative side is unbounded
    ((99, 99), False, 100, 100, (-1, -1)),     # each side reaches every key from every row
    ((99, 98), False, 100, 100, (-1, 98)),
    ((98, 97), False, 100, 100, (98, 97)),
    ((10, 7), True, 100, 100, (10, 0)),        # causal sets the right side to 0
    ((-1, 9), True, 100, 100, (-1, 0)),        # which is plain causal
    ((0, -1), False, 63, 31, (0, -1)),         # a bounded left side leaves the right one unbounded
    ((0, 33), False, 63, 31, (0, 33)),         # right 33 >= seqlen_k still hides keys from row 0
    ((30, 62), False, 63, 31, (-1, -1)),
    ((29, 61), False, 63, 31, (29, 61)),
    ((128, -1), False, 1000, 1, (-1, -1)),     # one key: any left side reaches it
    ((5, 0), True, 1, 300, (5, -1)),           # one query row: causal hides nothing
    ((0, 0), False, 1, 1, (-1, -1)),
])
def test_kernel_window_is_the_documented_window(window_size, causal, seqlen_q, seqlen_k, expected):
    assert _checks.kernel_window(window_size, causal, seqlen_q, seqlen_k) == expected


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (1, 9), (9, 1), (7, 20), (20, 7), (33, 33)])
def test_kernel_window_hides_the_same_keys(seqlen_q, seqlen_k):
    """The window the kernels get hides exactly the keys of the one asked for,
    for every window size around the sequence lengths."""
    rows = torch.arange(seqlen_q)[:, None] + seqlen_k - seqlen_q
    cols = torch.arange(seqlen_k)[None, :]

    def hidden(left, right):
        mask = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool)
        if left >= 0:
            mask |= cols < rows - left
        if right >= 0:
            mask |= cols > rows + right
        return mask

    sizes = sorted({-3, -1, 0, 1, 2, seqlen_q - 2, seqlen_q - 1, seqlen_q, seqlen_k - 2, seqlen_k - 1, seqlen_k,
                    seqlen_q + seqlen_k, 2**31 - 1})
    for left in sizes:
        for right in sizes:
            for causal in (False, True):
                asked = hidden(left, 0 if causal else right)
                assert torch.equal(hidden(*_checks.kernel_window((left, right), causal, seqlen_q, seqlen_k)), asked)


@pytest.mark.parametrize("window_size, expected", [
    ((3, 4), (3, 4)), ([3, 4], (3, 4)), (torch.tensor([3, 4]), (3, 4)), ((torch.tensor(3), 4), (3, 4)),
    ((-9, 2), (-1, 2)), (torch.tensor([-2, -2], dtype=torch.int32), (-1, -1)),
])
def test_window_pair_takes_what_flash_attn_takes(window_size, expected):
    assert _checks.window_pair(window_size) == expected


def test_softcap_of_zero_or_less_is_off():
    assert _checks.kernel_softcap(-3.0) == 0.0 and _checks.kernel_softcap(0.0) == 0.0
    assert _checks.kernel_softcap(30.0) == 30.0
    assert _checks.variant_for(-3.0, None) == "plain" and _checks.variant_for(30.0, None) == "scoremod"


def test_kernel_head_dim_is_the_next_one_up():
    dims = (1, 32, 33, 64, 65, 96, 97, 128, 129, 192, 193, 256)
    assert [_checks.kernel_head_dim(d) for d in dims] == [32, 32, 64, 64, 96, 96, 128, 128, 192, 192, 256, 256]


@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("layout", ["last dim strided", "row stride d + 1", "size-1 dim stride 12345", "start + 2 bytes"])
def test_any_layout_passes_to_device_check(which, layout):
    """flash_attn accepts any strides (it copies what its kernels cannot
    read); so does flashtile: the ops copy such a tensor (below)."""
    q, k, v = make_qkv(batch=1)
    args = {"q": q, "k": k, "v": v}
    t = args[which]
    if layout == "last dim strided":
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout == "row stride d + 1":
        t = torch.zeros(*t.shape[:-1], t.shape[-1] + 1, dtype=t.dtype)[..., : t.shape[-1]].copy_(t)
    elif layout == "size-1 dim stride 12345":
        t = t.as_strided(t.shape, (12345, *t.stride()[1:]))
    else:
        t = torch.empty(t.numel() + 8, dtype=t.dtype)[1 : 1 + t.numel()].view(t.shape).copy_(t)
    args[which] = t
    with raises(ValueError, "must be on a CUDA device"):
        flashtile.flash_attn_func(args["q"], args["k"], args["v"])


def test_ops_copy_what_the_kernels_cannot_read_in_place():
    head_dim, dtype = built_config()
    flat = torch.randn(2 * 5 * 4 * head_dim + 8).to(dtype)
    aligned = flat[8:].view(2, 5, 4, head_dim)
    assert _ops.vector_friendly(aligned) and _ops._kernel_ready(aligned) is aligned
    for t in (flat[1 : 1 + 2 * 5 * 4 * head_dim].view(2, 5, 4, head_dim),  # start 2 bytes past 16
              aligned.transpose(-1, -2).contiguous().transpose(-1, -2),    # stride(-1) != 1
              torch.zeros(2, 5, 4, head_dim + 1).to(dtype)[..., :head_dim]):  # rows of d + 1
        ready = _ops._kernel_ready(t)
        assert not _ops.vector_friendly(t) and _ops.vector_friendly(ready)
        assert ready.is_contiguous() and torch.equal(ready, t)


def test_strided_views_with_aligned_strides_pass_to_device_check():
    """Slices along heads, transposed storage and packed views are accepted
    (the call gets as far as the device check)."""
    head_dim, dtype = built_config()
    big = torch.randn(2, 5, 8, head_dim).to(dtype)
    q = big[:, :, 3:7]                                                    # sliced heads
    k = torch.randn(2, 2, 7, head_dim).to(dtype).transpose(1, 2)          # (b, h, s, d) storage
    v = torch.randn(2, 7, 2, 2, head_dim).to(dtype).unbind(2)[1]          # from a packed kv
    with raises(ValueError, "must be on a CUDA device"):
        flashtile.flash_attn_func(q, k, v)


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_cpu_tensor_rejected(which):
    """One CPU tensor among (fake) CUDA ones is named."""
    with FakeTensorMode():
        args = dict(zip("qkv", make_qkv(device="cuda")))
    args[which] = make_qkv()["qkv".index(which)]
    with raises(ValueError, f"{which} must be on a CUDA device, got cpu"):
        _checks.check_fwd_tensors(args["q"], args["k"], args["v"], FWD_BUILT)


def test_mixed_cuda_devices_rejected():
    # check_devices reads only ``.device``; stand-ins avoid fake cuda:1
    # tensors, which need a real cuda:1 whenever a GPU is present.
    on = lambda device: types.SimpleNamespace(device=torch.device(device))
    _checks.check_devices((on("cuda:1"), on("cuda:1"), on("cuda:1")), ("q", "k", "v"))
    with raises(ValueError, "v must be on the same device as q (cuda:0), got cuda:1"):
        _checks.check_devices((on("cuda:0"), on("cuda:0"), on("cuda:1")), ("q", "k", "v"))
    with raises(ValueError, "kv must be on the same device as q (cuda:1), got cuda:0"):
        _checks.check_devices((on("cuda:1"), on("cuda:0"), on("cuda:0")), ("q", "kv", "kv"))


def test_checks_read_metadata_only():
    """Meta tensors have no data: every check but placement passes on them."""
    q, k, v = make_qkv(device="meta")
    with raises(ValueError, "q must be on a CUDA device, got meta"):
        flashtile.flash_attn_func(q, k, v)


# --------------------------------------------------------------------------
# packed inputs
# --------------------------------------------------------------------------


def test_qkvpacked_rejections():
    q, k, v = make_qkv(seqlen_k=5, nheads_k=4)
    qkv = torch.stack([q, k, v], dim=2)
    with raises(TypeError, "qkv must be a torch.Tensor"):
        flashtile.flash_attn_qkvpacked_func((q, k, v))
    with raises(ValueError, "qkv must be 5-D (batch, seqlen, 3, nheads, headdim)", "4-D"):
        flashtile.flash_attn_qkvpacked_func(q)
    with raises(ValueError, "qkv must be 5-D", "(2, 5, 2,"):
        flashtile.flash_attn_qkvpacked_func(qkv[:, :, :2])
    with raises(ValueError, "qkv must be float16 or bfloat16"):
        flashtile.flash_attn_qkvpacked_func(qkv.float())
    with raises(ValueError, "qkv: head dim 264 is not supported"):
        flashtile.flash_attn_qkvpacked_func(torch.randn(2, 5, 3, 4, 264).to(q.dtype))
    with raises(ValueError, "qkv must be on a CUDA device, got cpu"):
        flashtile.flash_attn_qkvpacked_func(qkv)


def test_kvpacked_rejections():
    q, k, v = make_qkv()
    kv = torch.stack([k, v], dim=2)
    with raises(TypeError, "kv must be a torch.Tensor"):
        flashtile.flash_attn_kvpacked_func(q, (k, v))
    with raises(ValueError, "kv must be 5-D (batch, seqlen_k, 2, nheads_k, headdim)", "3-D"):
        flashtile.flash_attn_kvpacked_func(q, kv.flatten(2))
    with raises(ValueError, "kv must be 5-D", "(2, 7, 3,"):
        flashtile.flash_attn_kvpacked_func(q, torch.cat([kv, kv[:, :, :1]], dim=2))
    with raises(ValueError, "kv must have the same batch size as q"):
        flashtile.flash_attn_kvpacked_func(q, kv[:1])
    with raises(ValueError, "nheads of q (4) must be a multiple of nheads of kv (3)"):
        flashtile.flash_attn_kvpacked_func(q, torch.randn(2, 7, 2, 3, q.shape[-1]).to(q.dtype))
    with raises(ValueError, "q must be on a CUDA device, got cpu"):
        flashtile.flash_attn_kvpacked_func(q, kv)


# --------------------------------------------------------------------------
# the op's fake implementation and the public functions' shapes, on fake CUDA
# tensors (no GPU needed)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k",
                         [(3, 17, 113), (1, 1, 1), (0, 5, 7), (2, 0, 7), (2, 5, 0)])
def test_fake_outputs_have_flash_attn_shapes(batch, seqlen_q, seqlen_k):
    with FakeTensorMode():
        q, k, v = make_qkv(batch, seqlen_q, seqlen_k, nheads=8, nheads_k=2, device="cuda")
        out, lse, probs = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
        assert out.is_contiguous()
        assert lse.shape == (batch, 8, seqlen_q) and lse.dtype == torch.float32 and lse.is_contiguous()
        assert probs is None
        out2 = flashtile.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2))
        assert out2.shape == q.shape


def test_fake_qkvpacked_shapes():
    with FakeTensorMode():
        qkv = torch.randn(2, 9, 3, 4, built_config()[0], device="cuda").to(built_config()[1])
        out = flashtile.flash_attn_qkvpacked_func(qkv)
        assert out.shape == (2, 9, 4, qkv.shape[-1]) and out.dtype == qkv.dtype


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("func", ["func", "qkvpacked", "kvpacked"])
def test_public_functions_pass_deterministic_to_the_op(monkeypatch, func, deterministic):
    """Each public function hands its deterministic flag to flashtile::fwd,
    whose autograd context carries it to the backward (next test)."""
    seen = []
    real_op = flashtile.interface._fwd_op

    def spy(*args):
        seen.append(args[5])
        return real_op(*args)

    monkeypatch.setattr(flashtile.interface, "_fwd_op", spy)
    with FakeTensorMode():
        q, k, v = make_qkv(2, 9, 9, nheads=4, nheads_k=4, device="cuda")
        if func == "func":
            flashtile.flash_attn_func(q, k, v, deterministic=deterministic)
        elif func == "qkvpacked":
            flashtile.flash_attn_qkvpacked_func(torch.stack([q, k, v], dim=2), deterministic=deterministic)
        else:
            flashtile.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2), deterministic=deterministic)
    assert seen == [deterministic]


@pytest.mark.parametrize("window", [None, (7, 0)], ids=["window_defaulted", "window_passed"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_autograd_context_passes_options_to_bwd(monkeypatch, deterministic, window):
    """flashtile::fwd's autograd kernel saves deterministic and the window
    (the dispatcher hands it only the arguments the caller passed) and its
    backward calls flashtile::bwd with them (forward and backward called
    directly, on fake tensors: autograd itself needs a GPU here)."""
    seen = []
    real_bwd = _ops.bwd

    def spy(*args):
        seen.append(args[8:])
        return real_bwd(*args)

    class Ctx:
        def mark_non_differentiable(self, *tensors):
            self.non_differentiable = tensors

        def save_for_backward(self, *tensors):
            self.saved_tensors = tensors

        def set_materialize_grads(self, value):
            self.materialize_grads = value

    monkeypatch.setattr(_ops, "bwd", spy)
    extra = () if window is None else window
    with FakeTensorMode():
        q, k, v = make_qkv(2, 9, 11, nheads=4, nheads_k=2, device="cuda")
        ctx = Ctx()
        out, lse, attn_probs = _ops.FlashAttentionFunction.forward(ctx, q, k, v, 0.5, True, deterministic, *extra)
        assert attn_probs.numel() == 0  # not asked for
        assert ctx.non_differentiable == (lse, attn_probs) and ctx.materialize_grads is False
        grads = _ops.FlashAttentionFunction.backward(ctx, torch.ones_like(out), None, None)
    # The options after the window keep their defaults: softcap 0, no ALiBi
    # slopes, no varlen offsets, no dropout.
    assert seen == [(deterministic, *(window or (-1, -1)), 0.0, None, None, None, None, 0, 0, 0.0, None)]
    assert len(grads) >= 8 and all(g is None for g in grads[3:])
    assert [g.shape for g in grads[:3]] == [q.shape, k.shape, v.shape]


def test_the_dispatcher_is_skipped_only_for_plain_eager_tensors():
    """_ops.forward_op calls the kernels directly only where nothing would
    see the op: not for tensor subclasses (FakeTensor) nor under a dispatch
    or torch-function mode."""
    plain = torch.zeros(2)
    assert not _ops._needs_dispatcher((plain, None))
    with FakeTensorMode():
        fake = torch.zeros(2)
    assert _ops._needs_dispatcher((plain, fake))

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watching():
        assert _ops._needs_dispatcher((plain,))

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Functions():
        assert _ops._needs_dispatcher((plain,))
    assert not _ops._needs_dispatcher((plain,))


def test_only_the_forward_op_has_an_autograd_kernel():
    """flashtile::fwd is differentiable as an op (its autograd.Function sits
    at the Autograd key, where opcheck looks for it); flashtile::bwd has no
    derivative (test_double_backward_raises); both run on CUDA only."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has_kernel("flashtile::fwd", "Autograd")
    assert not has_kernel("flashtile::bwd", "Autograd")
    for name in ("fwd", "bwd"):
        assert has_kernel(f"flashtile::{name}", "CUDA") and not has_kernel(f"flashtile::{name}", "CPU")


def test_custom_ops_default_to_the_atomic_backward_without_a_window():
    """Every argument after causal has a default on both ops (deterministic,
    the window, softcap, ALiBi), so their five-argument form (the README's
    torch.ops.flashtile.fwd(q, k, v, scale, causal)) still works."""
    for op in (torch.ops.flashtile.fwd.default, torch.ops.flashtile.bwd.default):
        names = [a.name for a in op._schema.arguments]
        after_causal = op._schema.arguments[names.index("causal") + 1:]
        assert all(a.has_default_value() for a in after_causal), op._schema
        defaults = {a.name: a.default_value for a in after_causal}
        expected = {"deterministic": False, "window_left": -1, "window_right": -1, "softcap": 0.0,
                    "alibi_slopes": None, "dropout_p": 0.0, "dropout_seed": None}
        assert {n: defaults[n] for n in expected} == expected, op._schema


# --------------------------------------------------------------------------
# the reference itself
# --------------------------------------------------------------------------


def test_reference_philox_gives_the_random123_known_answers():
    """The tests' Philox (reference.py) against the Random123 vectors, as
    host_checks does for the kernels' (common/dropout.hpp)."""
    def words(counter, key):
        return [int(w) for w in philox4x32_10(*(torch.tensor([c]) for c in counter), *key)]
    assert words([0, 0, 0, 0], [0, 0]) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert words([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    assert words([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0]) == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_reference_dropout_mask_keeps_about_one_minus_p():
    keep = dropout_keep_mask(2**62 + 12345, 3, 2, 300, 200, 0.3, "cpu")
    assert keep.shape == (2, 300, 200)
    kept = dropout_keep_probability(0.3)  # 179 / 256
    assert kept == 179 / 256
    assert abs(keep.float().mean().item() - kept) < 6 * (kept * (1 - kept) / keep.numel()) ** 0.5
    assert not torch.equal(keep, dropout_keep_mask(12345, 3, 2, 300, 200, 0.3, "cpu"))


def test_dropout_attn_probs_shape_under_fake_tensors():
    """With dropout, return_attn_probs gives flash_attn's (batch, nheads,
    seqlen_q rounded up to 128, seqlen_k rounded up to 128) in q's dtype."""
    with FakeTensorMode():
        q, k, v = make_qkv(2, 9, 130, nheads=4, nheads_k=2, device="cuda")
        out, lse, attn_probs = flashtile.flash_attn_func(q, k, v, dropout_p=0.1, return_attn_probs=True)
        assert attn_probs.shape == (2, 4, 128, 256) and attn_probs.dtype == q.dtype
        assert flashtile.flash_attn_func(q, k, v, dropout_p=0.0, return_attn_probs=True)[2] is None


def sdpa64(q, k, v, scale, **kwargs):
    """SDPA in float64 on (b, s, h, d) tensors."""
    t = lambda x: x.to(torch.float64).transpose(1, 2)
    return F.scaled_dot_product_attention(t(q), t(k), t(v), scale=scale, **kwargs).transpose(1, 2)


def lse64(q, k, scale, keep=None):
    s = torch.einsum("bqhd,bkhd->bhqk", q.double(), k.double()) * scale
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return torch.logsumexp(s, dim=-1)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1, 1), (17, 17), (17, 113), (113, 17)])
def test_reference_matches_sdpa_noncausal(seqlen_q, seqlen_k):
    q, k, v = (torch.randn(2, s, 3, 32, dtype=torch.float64) for s in (seqlen_q, seqlen_k, seqlen_k))
    out, lse = attention_ref(q, k, v, softmax_scale=0.3)
    assert out.dtype == torch.float64 and lse.shape == (2, 3, seqlen_q)
    torch.testing.assert_close(out, sdpa64(q, k, v, 0.3), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse64(q, k, 0.3), rtol=1e-12, atol=1e-12)


def test_reference_matches_sdpa_causal_square():
    q, k, v = (torch.randn(2, 33, 3, 16, dtype=torch.float64) for _ in range(3))
    out, lse = attention_ref(q, k, v, causal=True)
    torch.testing.assert_close(out, sdpa64(q, k, v, 16 ** -0.5, is_causal=True), rtol=1e-12, atol=1e-12)
    keep = torch.ones(33, 33, dtype=torch.bool).tril()
    torch.testing.assert_close(lse, lse64(q, k, 16 ** -0.5, keep), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seqlen_q, seqlen_k", [(5, 9), (9, 5), (1, 7), (7, 1), (3, 3)])
def test_reference_causal_is_bottom_right_aligned(seqlen_q, seqlen_k):
    q = torch.randn(1, seqlen_q, 2, 8, dtype=torch.float64)
    k, v = (torch.randn(1, seqlen_k, 2, 8, dtype=torch.float64) for _ in range(2))
    # Hand-built: the last query row lines up with the last key.
    keep = torch.zeros(seqlen_q, seqlen_k, dtype=torch.bool)
    for i in range(seqlen_q):
        for j in range(seqlen_k):
            keep[i, j] = (seqlen_q - 1 - i) <= (seqlen_k - 1 - j)
    assert torch.equal(~keep, causal_mask(seqlen_q, seqlen_k))

    out, lse = attention_ref(q, k, v, causal=True)
    seen = keep.any(dim=1)  # rows that see at least one key
    expected = sdpa64(q, k, v, 8 ** -0.5, attn_mask=keep)
    torch.testing.assert_close(out[:, seen], expected[:, seen], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse[:, :, seen], lse64(q, k, 8 ** -0.5, keep)[:, :, seen],
                               rtol=1e-12, atol=1e-12)
    assert torch.equal(out[:, ~seen], torch.zeros_like(out[:, ~seen]))
    assert torch.isneginf(lse[:, :, ~seen]).all()
    assert int((~seen).sum()) == max(seqlen_q - seqlen_k, 0)


@pytest.mark.parametrize("nheads, nheads_k", [(8, 2), (8, 1), (6, 6)])
def test_reference_gqa_matches_per_head_sdpa(nheads, nheads_k):
    q = torch.randn(2, 11, nheads, 16, dtype=torch.float64)
    k, v = (torch.randn(2, 13, nheads_k, 16, dtype=torch.float64) for _ in range(2))
    out, _ = attention_ref(q, k, v, causal=True)
    group = nheads // nheads_k
    keep = ~causal_mask(11, 13)
    for h in range(nheads):
        kv_head = h // group
        one = lambda t, i: t[:, :, i : i + 1]
        expected = sdpa64(one(q, h), one(k, kv_head), one(v, kv_head), 16 ** -0.5, attn_mask=keep)
        torch.testing.assert_close(out[:, :, h : h + 1], expected, rtol=1e-12, atol=1e-12)


def test_reference_no_keys():
    q = torch.randn(2, 4, 3, 8)
    k = v = torch.randn(2, 0, 3, 8)
    out, lse = attention_ref(q, k, v)
    assert torch.equal(out, torch.zeros(2, 4, 3, 8)) and torch.isneginf(lse).all()
    assert lse.shape == (2, 3, 4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reference_low_precision_path(dtype):
    q, k, v = (torch.randn(1, 37, 2, 32).to(dtype) for _ in range(3))
    out, lse = attention_ref(q, k, v, causal=True, upcast=False)
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    assert out.dtype == dtype and ref_out.dtype == torch.float32 and ref_lse.dtype == torch.float32
    err = (out.float() - ref_out).abs().max().item()
    assert 0 < err < 5e-2, err  # does low-precision math, but the same math
    torch.testing.assert_close(lse.float(), ref_lse, rtol=2e-2, atol=2e-2)


# --------------------------------------------------------------------------
# the FlashAttention error rule
# --------------------------------------------------------------------------


def test_fa_rule_accepts_and_rejects():
    ref = torch.randn(4, 5, dtype=torch.float64)
    lowp = ref + 1e-3
    assert_close_fa_rule(ref + 1.9e-3, ref, lowp, "out", atol=0.0)
    assert_close_fa_rule(ref + 2.05e-3, ref, lowp, "out", atol=1e-4)
    with pytest.raises(AssertionError, match=r"out: max \|actual - ref\| = 2\.1\d*e-03 exceeds 2\.0"):
        assert_close_fa_rule(ref + 2.1e-3, ref, lowp, "out", atol=0.0)
    with pytest.raises(AssertionError, match="dq: 1 of 20 elements are NaN"):
        bad = ref.clone()
        bad[1, 2] = float("nan")
        assert_close_fa_rule(bad, ref, lowp, "dq")


def test_fa_rule_handles_neg_inf_lse():
    ref = torch.randn(2, 3, 4)
    ref[0, 1, :] = float("-inf")
    lowp = ref + 1e-3
    assert_close_fa_rule(ref.clone(), ref, lowp, "lse", atol=0.0)
    finite_where_inf = ref.clone()
    finite_where_inf[0, 1, 2] = 0.0
    with pytest.raises(AssertionError,
                       match=r"lse: 1 elements disagree on -inf .* first at \(0, 1, 2\)"):
        assert_close_fa_rule(finite_where_inf, ref, lowp, "lse")
    inf_where_finite = ref.clone()
    inf_where_finite[1, 0, 0] = float("-inf")
    with pytest.raises(AssertionError, match="lse: 1 elements disagree on -inf"):
        assert_close_fa_rule(inf_where_finite, ref, lowp, "lse")


@pytest.mark.parametrize("batch, nheads", [(65536, 1), (1, 65536)], ids=["batch", "nheads"])
def test_grid_limits_are_named(batch, nheads):
    """The forward's grid puts heads on y and batch on z, each capped at
    65535: refused with a message naming the dimension, not as a launch
    failure."""
    q, k, v = make_qkv(batch=batch, seqlen_q=1, seqlen_k=1, nheads=nheads, nheads_k=1, device="meta")
    with raises(ValueError, "q:", "batch size" if batch > 1 else "nheads", "65535"):
        flashtile.flash_attn_func(q, k, v)


def test_batch_times_heads_past_65535_passes_the_checks():
    q, k, v = make_qkv(batch=300, seqlen_q=3, seqlen_k=1, nheads=300, nheads_k=1, device="meta")
    with raises(ValueError, "q must be on a CUDA device, got meta"):
        flashtile.flash_attn_func(q, k, v)


def test_grid_bound_is_named():
    """Past 2^31 − 1 blocks of 64 rows the backward's 1-D grid cannot be
    launched: refused with a message naming the dimensions, not as a launch
    failure."""
    q, k, v = make_qkv(batch=65535, seqlen_q=64, seqlen_k=33, nheads=65535, nheads_k=65535, device="meta")
    with raises(ValueError, "q: batch × nheads × ceil(seqlen_q / 64) = 4294836225", "2147483647"):
        flashtile.flash_attn_func(q, k, v)
