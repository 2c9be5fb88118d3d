"""GPU tests of the forward against the float32 reference (FlashAttention's rule).

The parametrizations cover rather than multiply: every seqlen pair for one
configuration, every (dtype, head dim, head grouping) on one medium size, and
single tests for batch 7, layouts, packing, streams and torch.compile.
Combinations missing from this build's kernel table are skipped with a reason.
"""

import types

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)", allow_module_level=True)

import flashtile
from flashtile import _C, _checks, _ops
from kernel_names import (cuda_kernel_names, fwd_tile_of, require_short_fwd_tile, require_sm90, sm80_kernels_only,
                          sm90_built)
from reference import assert_close_fa_rule, attention_ref

KERNEL_HEAD_DIMS = list(_checks.SUPPORTED_HEAD_DIMS)  # each has a kernel of its own

FWD_BUILT = _checks.fwd_combos(_C.built_kernels())
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def require_built(head_dim, dtype):
    if (head_dim, DTYPE_NAMES[dtype]) not in FWD_BUILT:
        pytest.skip(f"forward hdim{head_dim}/{DTYPE_NAMES[dtype]} is not in this build "
                    f"(built: {FWD_BUILT})")


def default_config():
    """One built (head_dim, dtype) for the tests that sweep something else."""
    for head_dim, name in ((128, "bf16"), (64, "bf16"), (128, "fp16"), (64, "fp16")):
        if (head_dim, name) in FWD_BUILT:
            return head_dim, DTYPES[name]
    pytest.skip(f"no supported forward kernel in this build (built: {FWD_BUILT})")


def rand_qkv(batch, seqlen_q, seqlen_k, nheads, nheads_k, head_dim, dtype, device="cuda"):
    q = torch.randn(batch, seqlen_q, nheads, head_dim, device=device, dtype=dtype)
    k = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype)
    v = torch.randn(batch, seqlen_k, nheads_k, head_dim, device=device, dtype=dtype)
    return q, k, v


def check_against_reference(q, k, v, out, lse, causal, softmax_scale=None):
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale)
    pt_out, pt_lse = attention_ref(q, k, v, causal=causal, softmax_scale=softmax_scale, upcast=False)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    assert_close_fa_rule(out, ref_out, pt_out, "out")
    assert_close_fa_rule(lse, ref_lse, pt_lse, "lse")


def run_and_check(q, k, v, causal, softmax_scale=None):
    out, lse, probs = flashtile.flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal,
                                                return_attn_probs=True)
    assert probs is None
    check_against_reference(q, k, v, out, lse, causal, softmax_scale)
    return out, lse


# --------------------------------------------------------------------------
# numerics
# --------------------------------------------------------------------------

SEQLEN_PAIRS = [(1, 1), (1, 17), (17, 1), (17, 113), (113, 17), (113, 1023), (1023, 113),
                (1023, 2049), (2049, 1023), (1, 2049), (2049, 1), (2049, 2049)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", SEQLEN_PAIRS)
def test_seqlens(seqlen_q, seqlen_k, causal):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(1, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("nheads, nheads_k", [(4, 4), (8, 2), (16, 2), (8, 1)],
                         ids=["mha", "gqa4", "gqa8", "mqa"])
@pytest.mark.parametrize("head_dim", KERNEL_HEAD_DIMS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_dtype_headdim_grouping(dtype, head_dim, nheads, nheads_k, causal):
    require_built(head_dim, dtype)
    q, k, v = rand_qkv(2, 257, 400, nheads, nheads_k, head_dim, dtype)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(113, 1023), (1023, 113)])
def test_batch7(seqlen_q, seqlen_k, causal):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(7, seqlen_q, seqlen_k, 8, 2, head_dim, dtype)
    run_and_check(q, k, v, causal)


@pytest.mark.parametrize("seqlen_k, tile", [(2047, (128, 128)), (2048, (128, 128)), (2049, (128, 64))])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_d64_key_tile_switch(dtype, seqlen_k, tile):
    """d64 without a mask runs 128 x 128 tiles up to 2048 keys and 128 x 64
    above (FwdShortConfig): both sides of the switch against the reference,
    and the profiler names the tile that ran (2047: the short tile's partial
    last key block)."""
    require_short_fwd_tile()
    require_built(64, dtype)
    q, k, v = rand_qkv(2, 300, seqlen_k, 4, 2, 64, dtype)
    with sm80_kernels_only():
        (out, lse, _), names = cuda_kernel_names(lambda: flashtile.flash_attn_func(q, k, v, return_attn_probs=True))
    assert fwd_tile_of(names) == tile
    check_against_reference(q, k, v, out, lse, False)


@pytest.mark.parametrize("softmax_scale", [0.5, 1e-3])
def test_softmax_scale(softmax_scale):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 130, 190, 4, 4, head_dim, dtype)
    run_and_check(q, k, v, True, softmax_scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_large_logits(causal):
    """Scores with a spread of tens: the running max must rescale correctly."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 300, 515, 4, 2, head_dim, dtype)
    run_and_check(q * 6, k, v, causal)


def test_repeated_runs_are_identical():
    """A result that moves between identical runs points at a race."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 1023, 1023, 8, 2, head_dim, dtype)
    first = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    for _ in range(3):
        again = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


# --------------------------------------------------------------------------
# every element written: the extension called directly on NaN-filled outputs
# --------------------------------------------------------------------------


def call_C_fwd(q, k, v, out, lse, causal, softmax_scale=None, **options):
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    with torch.cuda.device(q.device):
        stream = torch.cuda.current_stream(q.device).cuda_stream
        _C.fwd(q, k, v, out, lse, float(softmax_scale), bool(causal), stream, **options)


def assert_all_written(out, lse, ref_lse):
    no_keys = torch.isneginf(ref_lse)  # rows that see no key: lse -inf, out 0
    assert not torch.isnan(out).any(), f"{int(torch.isnan(out).sum())} out elements never written"
    assert not torch.isnan(lse).any(), f"{int(torch.isnan(lse).sum())} lse elements never written"
    assert torch.isfinite(out).all(), "out holds inf"
    assert torch.equal(torch.isneginf(lse), no_keys), "lse is -inf exactly where no key is visible"
    assert torch.isfinite(lse[~no_keys]).all()
    out_no_keys = out.permute(0, 2, 1, 3)[no_keys]  # (rows, d)
    assert (out_no_keys == 0).all(), "rows that see no key must be 0"


@pytest.mark.parametrize(
    "seqlen_q, seqlen_k, causal",
    [(1, 1, False), (17, 1023, True), (1023, 17, True), (113, 113, False), (2049, 1023, False),
     (1, 2049, True)],
)
def test_poisoned_outputs_are_fully_written(seqlen_q, seqlen_k, causal):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(3, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((3, 4, seqlen_q), float("nan"), device="cuda", dtype=torch.float32)
    call_C_fwd(q, k, v, out, lse, causal)
    ref_out, ref_lse = attention_ref(q, k, v, causal=causal)
    assert_all_written(out, lse, ref_lse)
    check_against_reference(q, k, v, out, lse, causal)


@pytest.mark.parametrize("window", [(-1, 0), (100, 0), (64, 64)], ids=["causal", "causal-window", "window"])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 1000), (333, 4000), (4000, 129)])
def test_tiles_from_a_counter_match_one_tile_per_cta(seqlen_q, seqlen_k, window):
    """With a tile counter the forward hands uneven tiles (causal, windows)
    out dynamically on a persistent grid (the sm90 kernels; the others ignore
    it); each tile's arithmetic is the same, so out and lse are bitwise those
    of one CTA per tile. The counter is reused dirty: the launch resets it."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(3, seqlen_q, seqlen_k, 8, 2, head_dim, dtype)
    results = []
    counter = torch.full((1,), 12345, dtype=torch.int32, device="cuda")
    for tile_counter in (None, counter, counter):
        out = torch.full_like(q, float("nan"))
        lse = torch.full((3, 8, seqlen_q), float("nan"), device="cuda", dtype=torch.float32)
        call_C_fwd(q, k, v, out, lse, causal=False, window_left=window[0], window_right=window[1],
                   tile_counter=tile_counter)
        results.append((out, lse))
    ref_out, ref_lse = attention_ref(q, k, v, window_size=window)
    assert_all_written(*results[0], ref_lse)
    for out, lse in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])


def test_strided_out_written_exactly_in_place():
    """out may be a strided view: its elements are all written and the
    surrounding buffer is left alone."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 113, 300, 4, 4, head_dim, dtype)
    buf = torch.full((2, 113, 6, head_dim + 8), float("nan"), device="cuda", dtype=dtype)
    out = buf[:, :, 1:5, :head_dim]
    lse = torch.full((2, 4, 113), float("nan"), device="cuda", dtype=torch.float32)
    call_C_fwd(q, k, v, out, lse, causal=True)
    ref_out, ref_lse = attention_ref(q, k, v, causal=True)
    assert_all_written(out, lse, ref_lse)
    check_against_reference(q, k, v, out, lse, causal=True)
    untouched = torch.ones(buf.shape, dtype=torch.bool, device="cuda")
    untouched[:, :, 1:5, :head_dim] = False
    assert torch.isnan(buf[untouched]).all(), "the kernel wrote outside the out view"


# --------------------------------------------------------------------------
# layouts and packing
# --------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_non_contiguous_views(causal):
    head_dim, dtype = default_config()
    b, sq, sk, h, hk = 2, 131, 257, 4, 2
    rand = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype)
    q = rand(b, sq, 3 * h, head_dim)[:, :, h : 2 * h]        # a slice of heads
    k = rand(b, hk, sk, head_dim).transpose(1, 2)            # (b, h, s, d) storage
    v = rand(sk, b, hk, head_dim).transpose(0, 1)            # (s, b, h, d) storage
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    out, lse = run_and_check(q, k, v, causal)
    assert out.is_contiguous()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_qkvpacked(causal):
    head_dim, dtype = default_config()
    qkv = torch.randn(2, 300, 3, 4, head_dim, device="cuda", dtype=dtype)
    out, lse, probs = flashtile.flash_attn_qkvpacked_func(qkv, causal=causal, return_attn_probs=True)
    assert probs is None
    q, k, v = qkv.unbind(2)
    check_against_reference(q, k, v, out, lse, causal)
    assert torch.equal(out, flashtile.flash_attn_qkvpacked_func(qkv, causal=causal))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kvpacked(causal):
    head_dim, dtype = default_config()
    q = torch.randn(2, 200, 8, head_dim, device="cuda", dtype=dtype)
    kv = torch.randn(2, 333, 2, 2, head_dim, device="cuda", dtype=dtype)
    out, lse, probs = flashtile.flash_attn_kvpacked_func(q, kv, causal=causal, return_attn_probs=True)
    assert probs is None
    k, v = kv.unbind(2)
    check_against_reference(q, k, v, out, lse, causal)
    assert torch.equal(out, flashtile.flash_attn_kvpacked_func(q, kv, causal=causal))


def test_return_attn_probs():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 77, 99, 4, 1, head_dim, dtype)
    plain = flashtile.flash_attn_func(q, k, v)
    assert isinstance(plain, torch.Tensor)
    result = flashtile.flash_attn_func(q, k, v, return_attn_probs=True)
    assert isinstance(result, tuple) and len(result) == 3 and result[2] is None
    out, lse, _ = result
    assert torch.equal(out, plain)
    assert lse.shape == (2, 4, 77) and lse.dtype == torch.float32 and lse.is_contiguous()


# --------------------------------------------------------------------------
# empty inputs never reach the extension
# --------------------------------------------------------------------------


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k", [(0, 17, 33), (2, 0, 33), (2, 17, 0), (0, 0, 0)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_inputs(monkeypatch, batch, seqlen_q, seqlen_k, causal):
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)

    def must_not_be_called(*args):
        raise AssertionError("_C.fwd was called for an empty input")

    monkeypatch.setattr(_ops, "_C", types.SimpleNamespace(fwd=must_not_be_called))
    out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == q.shape and out.dtype == dtype and out.device == q.device
    assert lse.shape == (batch, 4, seqlen_q) and lse.dtype == torch.float32
    if seqlen_k == 0:
        assert (out == 0).all() and torch.isneginf(lse).all()


# --------------------------------------------------------------------------
# devices and streams
# --------------------------------------------------------------------------


def test_non_default_stream():
    """The kernel runs on torch's current stream: q is written on a side stream
    behind a sleep, and a launch on any other stream would read NaN."""
    head_dim, dtype = default_config()
    src, k, v = rand_qkv(2, 513, 700, 4, 2, head_dim, dtype)
    q = torch.full_like(src, float("nan"))
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # tens of ms: keeps the side stream busy
        q.copy_(src)
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    side.synchronize()
    check_against_reference(src, k, v, out, lse, causal=True)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_runs_on_the_tensors_device():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 129, 257, 4, 2, head_dim, dtype, device="cuda:1")
    with torch.cuda.device(0):
        out, lse, _ = flashtile.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert out.device == q.device and lse.device == q.device
    check_against_reference(q, k, v, out, lse, causal=True)


def test_device_errors_on_gpu():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 17, 33, 4, 2, head_dim, dtype)
    with pytest.raises(ValueError, match="k must be on a CUDA device, got cpu"):
        flashtile.flash_attn_func(q, k.cpu(), v)
    with pytest.raises(ValueError, match="q must be on a CUDA device, got cpu"):
        flashtile.flash_attn_func(q.cpu(), k, v)


def test_misaligned_pointer_is_copied():
    """A start 2 bytes past a 16-byte boundary (the kernels' vectors need 16)
    is copied, as flash_attn accepts it: the same result as the aligned copy."""
    head_dim, dtype = default_config()
    numel = 2 * 17 * 4 * head_dim
    flat = torch.randn(numel + 1, device="cuda", dtype=dtype)
    q = flat[1:].view(2, 17, 4, head_dim)  # strides fine, start 2 bytes off
    k, v = rand_qkv(2, 17, 33, 4, 2, head_dim, dtype)[1:]
    assert torch.equal(flashtile.flash_attn_func(q, k, v), flashtile.flash_attn_func(q.clone(), k, v))


# --------------------------------------------------------------------------
# torch integration: custom op, autograd, torch.compile
# --------------------------------------------------------------------------


def test_opcheck():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 65, 130, 4, 2, head_dim, dtype)
    torch.library.opcheck(torch.ops.flashtile.fwd.default, (q, k, v, 0.1, True, False))


def test_out_is_differentiable_lse_is_not():
    """The numerics of the gradients are tested in test_backward_gpu.py."""
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(1, 33, 33, 4, 4, head_dim, dtype)
    q.requires_grad_()
    out, lse, _ = flashtile.flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad


def test_torch_compile_fullgraph_matches_eager():
    head_dim, dtype = default_config()
    q, k, v = rand_qkv(2, 257, 300, 8, 2, head_dim, dtype)
    qkv = torch.randn(2, 129, 3, 4, head_dim, device="cuda", dtype=dtype)

    def block(q, k, v, qkv):
        out, lse, _ = flashtile.flash_attn_func(q * 0.5, k, v, causal=True, return_attn_probs=True)
        packed = flashtile.flash_attn_qkvpacked_func(qkv, softmax_scale=0.2)
        kvp = flashtile.flash_attn_kvpacked_func(q, torch.stack([k, v], dim=2))
        return out + 1, lse, packed, kvp

    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True)
    for got, want in zip(compiled(q, k, v, qkv), block(q, k, v, qkv)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_torch_compile_dynamic_shapes():
    head_dim, dtype = default_config()
    torch._dynamo.reset()
    compiled = torch.compile(flashtile.flash_attn_func, fullgraph=True, dynamic=True)
    for seqlen_q, seqlen_k in ((65, 130), (200, 77)):
        q, k, v = rand_qkv(2, seqlen_q, seqlen_k, 4, 2, head_dim, dtype)
        got = compiled(q, k, v, causal=True)
        torch.testing.assert_close(got, flashtile.flash_attn_func(q, k, v, causal=True), rtol=0, atol=0)


# --------------------------------------------------------------------------
# the wgmma + TMA forward (include/flashtile/sm90/fwd_*.hpp)
# --------------------------------------------------------------------------

SM90_FWD_BUILT = sm90_built("fwd")
SM90_SCOREMOD_FWD_BUILT = sm90_built("fwd", "scoremod")


def require_sm90_forward():
    require_sm90("fwd")


def forward_kernel_names(q, k, v, **kwargs):
    (out, lse, _), names = cuda_kernel_names(
        lambda: flashtile.flash_attn_func(q, k, v, return_attn_probs=True, **kwargs))
    return out, lse, names


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sm90_forward_is_the_kernel_that_runs(causal):
    """On an sm90 device the forward of an sm90-built head dim runs the wgmma
    kernel: the plain variant, and the scoremod one for softcap and ALiBi;
    the other tests of this file and test_score_mod_gpu.py then check their
    results there. K and V expanded over their heads run as one KV head
    there too; so do dropout and return_attn_probs, in the scoremod variant,
    and q, k or v expanded over the batch or heads (stride 0: described with
    extent 1 and read at index 0)."""
    require_sm90_forward()
    for head_dim, name in SM90_FWD_BUILT:
        q, k, v = rand_qkv(1, 200, 300, 4, 2, head_dim, DTYPES[name])
        out, lse, names = forward_kernel_names(q, k, v, causal=causal)
        assert any("flashtile::sm90::fwd_kernel" in n for n in names), names
        check_against_reference(q, k, v, out, lse, causal)

        if (head_dim, name) in SM90_SCOREMOD_FWD_BUILT:  # (FLASHTILE_VARIANTS)
            slopes = torch.rand(4, device="cuda")
            for mods in (dict(softcap=30.0), dict(alibi_slopes=slopes), dict(softcap=30.0, alibi_slopes=slopes)):
                _, _, names = forward_kernel_names(q, k, v, causal=causal, **mods)
                assert any("flashtile::sm90::fwd_kernel" in n for n in names), (mods, names)
            for probs in (False, True):
                _, names = cuda_kernel_names(lambda: flashtile.flash_attn_func(
                    q, k, v, dropout_p=0.1, causal=causal, return_attn_probs=probs))
                assert any("flashtile::sm90::fwd_kernel" in n for n in names), (probs, names)
                assert any("attn_probs_kernel" in n for n in names) == probs, (probs, names)

        k1, v1 = k[:, :, :1].expand(-1, -1, 4, -1), v[:, :, :1].expand(-1, -1, 4, -1)  # head stride 0
        out, lse, names = forward_kernel_names(q, k1, v1, causal=causal)
        assert any("flashtile::sm90::fwd_kernel" in n for n in names), names
        check_against_reference(q, k1, v1, out, lse, causal)
        q2 = torch.cat([q, torch.randn_like(q)])
        k2, v2 = k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1)  # batch stride 0
        q3 = q[:, :, :1].expand(-1, -1, 4, -1)  # q's head stride 0
        v_own = torch.cat([v, torch.randn_like(v)])
        for qx, kx, vx in ((q2, k2, v2), (q2, k2, v_own), (q.expand(2, -1, -1, -1), k2, v2), (q3, k, v)):
            out, lse, names = forward_kernel_names(qx, kx, vx, causal=causal)
            assert any("flashtile::sm90::fwd_kernel" in n for n in names), names
            check_against_reference(qx, kx, vx, out, lse, causal)



@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_rows_of_stride_zero(causal):
    """q, k or v expanded along the sequence (rows of stride 0, which TMA
    cannot step) are copied before the forward (_ops._fwd_ready): on an sm90
    device the wgmma kernel runs them, as it runs every other layout (a build
    with 90a has no other forward there), and the caller's tensors are read,
    not written."""
    require_sm90_forward()
    for head_dim, name in SM90_FWD_BUILT:
        q, k, v = rand_qkv(2, 150, 190, 4, 2, head_dim, DTYPES[name])
        q1, k1, v1 = (t[:, :1] for t in (q, k, v))
        for qx, kx, vx in ((q1.expand_as(q), k, v), (q, k1.expand_as(k), v), (q, k, v1.expand_as(v))):
            assert 0 in (qx.stride(1), kx.stride(1), vx.stride(1))
            before = [t.clone() for t in (q1, k1, v1)]
            out, lse, names = forward_kernel_names(qx, kx, vx, causal=causal)
            assert any("flashtile::sm90::fwd_kernel" in n for n in names), names
            check_against_reference(qx, kx, vx, out, lse, causal)
            assert all(torch.equal(a, b) for a, b in zip(before, (q1, k1, v1)))


def test_sm90_forward_several_tiles_per_cta():
    """Without a mask the wgmma forward's grid is persistent, one CTA per SM:
    384 tiles of 128 rows (288 of 192 at d64; the last query block of each
    head partial) on the H200's 132 SMs, so each CTA runs two or three,
    reusing Q's buffer and carrying its K/V pipeline from one tile to the
    next."""
    require_sm90_forward()
    for head_dim, name in SM90_FWD_BUILT:
        q, k, v = rand_qkv(3, 1000, 777, 16, 4, head_dim, DTYPES[name])
        run_and_check(q, k, v, causal=False)
