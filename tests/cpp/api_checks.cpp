// Host-side checks of the public C++ API's error paths, run by ctest without a
// GPU: can_implement_fwd/bwd refuse each bad argument with the right Status,
// dispatch reports kNotBuilt when nothing is registered (nothing launches),
// the KV-cache API's checks, split choice and workspace size,
// and the backward's workspace layout keeps its pieces aligned.
#include <flashtile/flashtile.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>

namespace {

int g_failures = 0;
int g_checks = 0;

void expect(bool ok, const char* what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what);
  }
}

// Never dereferenced: can_implement only looks at the address.
void* fake_pointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

flashtile::FwdParams valid_fwd() {
  flashtile::FwdParams p;
  p.q = fake_pointer(0x10000), p.k = fake_pointer(0x20000), p.v = fake_pointer(0x30000);
  p.out = fake_pointer(0x40000);
  p.lse = static_cast<float*>(fake_pointer(0x50000));
  p.batch = 2, p.seqlen_q = 17, p.seqlen_k = 33, p.nheads = 8, p.nheads_k = 2, p.head_dim = 64;
  p.q_row_stride = p.out_row_stride = 8 * 64, p.k_row_stride = p.v_row_stride = 2 * 64;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = 64;
  p.q_batch_stride = p.out_batch_stride = 17 * 8 * 64;
  p.k_batch_stride = p.v_batch_stride = 33 * 2 * 64;
  p.softmax_scale = 0.125f;
  return p;
}

flashtile::BwdParams valid_bwd() {
  const flashtile::FwdParams f = valid_fwd();
  flashtile::BwdParams p;
  p.q = f.q, p.k = f.k, p.v = f.v, p.out = f.out, p.lse = f.lse;
  p.dout = fake_pointer(0x60000), p.dq = fake_pointer(0x70000), p.dk = fake_pointer(0x80000);
  p.dv = fake_pointer(0x90000), p.workspace = fake_pointer(0xa0000);
  p.batch = f.batch, p.seqlen_q = f.seqlen_q, p.seqlen_k = f.seqlen_k;
  p.nheads = f.nheads, p.nheads_k = f.nheads_k, p.head_dim = f.head_dim;
  p.q_batch_stride = p.out_batch_stride = p.dout_batch_stride = p.dq_batch_stride = f.q_batch_stride;
  p.k_batch_stride = p.v_batch_stride = p.dk_batch_stride = p.dv_batch_stride = f.k_batch_stride;
  p.q_row_stride = p.out_row_stride = p.dout_row_stride = p.dq_row_stride = f.q_row_stride;
  p.k_row_stride = p.v_row_stride = p.dk_row_stride = p.dv_row_stride = f.k_row_stride;
  p.q_head_stride = p.k_head_stride = p.v_head_stride = p.out_head_stride = 64;
  p.dout_head_stride = p.dq_head_stride = p.dk_head_stride = p.dv_head_stride = 64;
  p.softmax_scale = f.softmax_scale;
  return p;
}

// Decoding: 3 sequences of one query, 8 query heads on 2 KV heads, d128,
// a paged cache of 16-token pages, up to 64 pages a sequence.
flashtile::KvCacheParams valid_kvcache() {
  flashtile::KvCacheParams p;
  p.q = fake_pointer(0x10000), p.k_cache = fake_pointer(0x20000), p.v_cache = fake_pointer(0x30000);
  p.out = fake_pointer(0x40000);
  p.lse = static_cast<float*>(fake_pointer(0x50000));
  p.batch = 3, p.seqlen_q = 1, p.nheads = 8, p.nheads_k = 2, p.head_dim = 128;
  p.q_head_stride = p.out_head_stride = 128, p.q_row_stride = p.out_row_stride = 8 * 128;
  p.q_batch_stride = p.out_batch_stride = 8 * 128;
  p.k_head_stride = p.v_head_stride = 128, p.k_row_stride = p.v_row_stride = 2 * 128;
  p.k_page_stride = p.v_page_stride = 16 * 2 * 128;
  p.block_table = static_cast<const int*>(fake_pointer(0x60000));
  p.block_table_batch_stride = 64, p.page_size = 16, p.seqlen_k = 64 * 16;
  p.softmax_scale = 0.088f;
  p.num_splits = 1;
  return p;
}

// A decode step's append: 3 sequences, one new row each, into the paged
// cache above, keys rotated over 64 of 128 features, queries into a copy.
flashtile::KvAppendParams valid_kvcache_append() {
  flashtile::KvAppendParams p;
  p.k = fake_pointer(0x10000), p.v = fake_pointer(0x20000);
  p.k_cache = fake_pointer(0x30000), p.v_cache = fake_pointer(0x40000);
  p.cache_seqlens = static_cast<const int*>(fake_pointer(0x50000));
  p.block_table = static_cast<const int*>(fake_pointer(0x60000));
  p.block_table_batch_stride = 64, p.page_size = 16, p.seqlen_k = 64 * 16;
  p.q = fake_pointer(0x70000), p.q_out = fake_pointer(0x80000);
  p.rotary_cos = fake_pointer(0x90000), p.rotary_sin = fake_pointer(0xa0000);
  p.rotary_dim = 64, p.seqlen_ro = 2048, p.rotary_row_stride = 32;
  p.batch = 3, p.seqlen_new = 1, p.seqlen_q = 1, p.nheads = 8, p.nheads_k = 2, p.head_dim = 128;
  p.k_head_stride = p.v_head_stride = 128, p.k_row_stride = p.v_row_stride = p.k_batch_stride = p.v_batch_stride = 256;
  p.k_cache_head_stride = p.v_cache_head_stride = 128, p.k_cache_row_stride = p.v_cache_row_stride = 256;
  p.k_page_stride = p.v_page_stride = 16 * 256;
  p.q_head_stride = p.q_out_head_stride = 128, p.q_row_stride = p.q_out_row_stride = 8 * 128;
  p.q_batch_stride = p.q_out_batch_stride = 8 * 128;
  return p;
}

template <class Params, class Check>
void expect_refused(const char* what, flashtile::Status want, Check check,
                    const std::function<void(Params&)>& mutate, Params base) {
  mutate(base);
  const flashtile::Status got = check(base);
  if (got != want) std::printf("  %s: got '%s'\n", what, flashtile::status_string(got));
  expect(got == want, what);
}

}  // namespace

int main() {
  using flashtile::Status;
  using Fwd = flashtile::FwdParams;
  using Bwd = flashtile::BwdParams;
  const auto fwd_check = [](const Fwd& p) { return flashtile::can_implement_fwd(p); };
  const auto bwd_check = [](const Bwd& p) { return flashtile::can_implement_bwd(p); };

  expect(flashtile::can_implement_fwd(valid_fwd()) == Status::kSuccess, "valid forward params pass");
  expect(flashtile::can_implement_bwd(valid_bwd()) == Status::kSuccess, "valid backward params pass");

  // K and V expanded over their heads (head stride 0) are one KV head to the
  // forward; expanded over the batch, or only one of them, they stay as they
  // are. The TMA kernels take all of these (a mode of stride 0: extent 1).
  {
    Fwd expanded = valid_fwd();
    expanded.k_head_stride = expanded.v_head_stride = 0;
    const Fwd folded = flashtile::with_broadcast_kv_as_one_head(expanded);
    expect(flashtile::can_implement_fwd(expanded) == Status::kSuccess && folded.nheads_k == 1 &&
               flashtile::sm90::fwd_supports(expanded) && flashtile::sm90::fwd_supports(folded),
           "k and v expanded over heads run as one KV head on the TMA kernels");
    Fwd k_only = valid_fwd();
    k_only.k_head_stride = 0;
    Fwd over_batch = valid_fwd();
    over_batch.k_batch_stride = over_batch.v_batch_stride = 0;
    expect(flashtile::with_broadcast_kv_as_one_head(k_only).nheads_k == 2 &&
               flashtile::with_broadcast_kv_as_one_head(over_batch).nheads_k == 2 &&
               flashtile::sm90::fwd_supports(k_only) && flashtile::sm90::fwd_supports(over_batch),
           "k alone, or k and v over the batch, keep their heads");
  }

  // Forward: each bad field, one at a time.
  expect_refused<Fwd>("fwd: null q", Status::kInvalidArgument, fwd_check, [](Fwd& p) { p.q = nullptr; }, valid_fwd());
  expect_refused<Fwd>("fwd: null lse", Status::kInvalidArgument, fwd_check, [](Fwd& p) { p.lse = nullptr; }, valid_fwd());
  expect_refused<Fwd>("fwd: seqlen_k 0", Status::kInvalidArgument, fwd_check, [](Fwd& p) { p.seqlen_k = 0; }, valid_fwd());
  expect_refused<Fwd>("fwd: batch 0", Status::kInvalidArgument, fwd_check, [](Fwd& p) { p.batch = 0; }, valid_fwd());
  expect_refused<Fwd>("fwd: nheads not a multiple of nheads_k", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.nheads_k = 3; }, valid_fwd());
  // The grid's y (heads) and z (batch) are capped at 65535.
  expect_refused<Fwd>("fwd: nheads past the grid", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) {
                        p.nheads = p.nheads_k = 65536;
                        p.out_row_stride = int64_t(65536) * 64, p.out_batch_stride = 17 * p.out_row_stride;
                      },
                      valid_fwd());
  // Strides: never negative; the output's elements all distinct.
  expect_refused<Fwd>("fwd: negative q row stride", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.q_row_stride = -8 * 64; }, valid_fwd());
  expect_refused<Fwd>("fwd: out heads overlap (head stride 0)", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.out_head_stride = 0; }, valid_fwd());
  expect_refused<Fwd>("fwd: out rows overlap (row stride < head_dim)", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.out_row_stride = 32, p.out_head_stride = 17 * 32, p.out_batch_stride = 8 * 17 * 32; },
                      valid_fwd());
  {
    Fwd bhsd = valid_fwd();  // out stored (batch, heads, seqlen, head_dim): distinct, accepted
    bhsd.out_row_stride = 64, bhsd.out_head_stride = 17 * 64, bhsd.out_batch_stride = 8 * 17 * 64;
    expect(flashtile::can_implement_fwd(bhsd) == Status::kSuccess, "fwd: out in (b, h, s, d) order passes");
    Fwd broadcast = valid_fwd();  // inputs may overlap: k and v broadcast over the batch
    broadcast.k_batch_stride = broadcast.v_batch_stride = 0;
    expect(flashtile::can_implement_fwd(broadcast) == Status::kSuccess, "fwd: k, v with batch stride 0 pass");
  }
  expect_refused<Fwd>("fwd: softmax_scale 0", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.softmax_scale = 0.f; }, valid_fwd());
  expect_refused<Fwd>("fwd: seqlen_k above kMaxSeqlen", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.seqlen_k = flashtile::kMaxSeqlen + 1; }, valid_fwd());
  expect_refused<Fwd>("fwd: window_left -2", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.window_left = -2; }, valid_fwd());
  expect_refused<Fwd>("fwd: softcap negative", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.softcap = -1.f; }, valid_fwd());
  expect_refused<Fwd>("fwd: softcap NaN", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.softcap = std::nanf(""); }, valid_fwd());
  expect_refused<Fwd>("fwd: ALiBi head stride negative", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.alibi_slopes = p.lse, p.alibi_slopes_head_stride = -1; }, valid_fwd());
  static const int kOffsets[] = {0, 1};
  expect_refused<Fwd>("fwd: cu_seqlens_q without cu_seqlens_k", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.cu_seqlens_q = kOffsets, p.total_q = p.total_k = 1; }, valid_fwd());
  expect_refused<Fwd>("fwd: seqused_k without cu_seqlens", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.seqused_k = kOffsets; }, valid_fwd());
  expect_refused<Fwd>("fwd: varlen with total_q 0", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.cu_seqlens_q = p.cu_seqlens_k = kOffsets, p.total_k = 1; }, valid_fwd());
  static const int64_t kSeed = 0;
  expect_refused<Fwd>("fwd: dropout_p 1", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.dropout_p = 1.f, p.dropout_seed = &kSeed; }, valid_fwd());
  expect_refused<Fwd>("fwd: dropout_p NaN", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.dropout_p = std::nanf(""), p.dropout_seed = &kSeed; }, valid_fwd());
  expect_refused<Fwd>("fwd: dropout without a seed", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.dropout_p = 0.1f; }, valid_fwd());
  expect_refused<Fwd>("fwd: attn_probs with fewer rows than seqlen_q", Status::kInvalidArgument, fwd_check,
                      [](Fwd& p) { p.attn_probs = fake_pointer(0xb0000), p.attn_probs_rows = p.seqlen_q - 1,
                                   p.attn_probs_cols = p.seqlen_k; }, valid_fwd());
  {
    Fwd with_dropout = valid_fwd();
    with_dropout.dropout_p = 0.5f, with_dropout.dropout_seed = &kSeed;
    with_dropout.attn_probs = fake_pointer(0xb0000);
    with_dropout.attn_probs_rows = with_dropout.seqlen_q, with_dropout.attn_probs_cols = with_dropout.seqlen_k;
    expect(flashtile::can_implement_fwd(with_dropout) == Status::kSuccess, "fwd: dropout with attn_probs passes");
    expect(flashtile::variant_for(with_dropout) == flashtile::Variant::kScoreMod, "fwd: dropout runs scoremod");
  }
  expect_refused<Fwd>("fwd: head_dim 80", Status::kUnsupportedHeadDim, fwd_check,
                      [](Fwd& p) { p.head_dim = 80; }, valid_fwd());
  expect_refused<Fwd>("fwd: misaligned k", Status::kMisalignedPointer, fwd_check,
                      [](Fwd& p) { p.k = fake_pointer(0x20008); }, valid_fwd());
  expect_refused<Fwd>("fwd: odd row stride of v", Status::kMisalignedPointer, fwd_check,
                      [](Fwd& p) { p.v_row_stride = 2 * 64 + 4; }, valid_fwd());
  expect_refused<Fwd>("fwd: odd head stride of out", Status::kMisalignedPointer, fwd_check,
                      [](Fwd& p) { p.out_head_stride = 65, p.out_row_stride = 8 * 72, p.out_batch_stride = 17 * 8 * 72; },
                      valid_fwd());

  // Backward: the fields it adds.
  expect_refused<Bwd>("bwd: null dout", Status::kInvalidArgument, bwd_check, [](Bwd& p) { p.dout = nullptr; }, valid_bwd());
  expect_refused<Bwd>("bwd: null workspace", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.workspace = nullptr; }, valid_bwd());
  // The main and dQ kernels' 1-D grids: blocks of 64 rows × nheads × batch within 2^31 − 1.
  expect_refused<Bwd>("bwd: 1-D grid past 2^31 - 1 blocks", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.nheads = p.nheads_k = 65535, p.batch = 65535; }, valid_bwd());
  {
    Bwd at_bound = valid_bwd();  // 1 block of 64 rows × 65535 heads × 32768 = 2^31 − 32768
    at_bound.nheads = at_bound.nheads_k = 65535, at_bound.batch = 32768;
    // Outputs laid out for that many heads (their elements must be distinct).
    at_bound.dq_row_stride = at_bound.dk_row_stride = at_bound.dv_row_stride = int64_t(65535) * 64;
    at_bound.dq_batch_stride = 17 * at_bound.dq_row_stride;
    at_bound.dk_batch_stride = at_bound.dv_batch_stride = 33 * at_bound.dk_row_stride;
    expect(flashtile::can_implement_bwd(at_bound) == Status::kSuccess, "bwd: 1-D grid at its bound passes");
    Bwd wide = valid_bwd();  // no y or z grid dimension caps batch or heads
    wide.batch = 65536;
    expect(flashtile::can_implement_bwd(wide) == Status::kSuccess, "bwd: batch past 65535 passes");
  }
  expect_refused<Bwd>("bwd: negative dv batch stride", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.dv_batch_stride = -p.dv_batch_stride; }, valid_bwd());
  expect_refused<Bwd>("bwd: dk rows overlap (row stride 0)", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.dk_row_stride = 0; }, valid_bwd());
  expect_refused<Bwd>("bwd: dq batches overlap", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.dq_batch_stride = 8 * 64; }, valid_bwd());
  expect_refused<Bwd>("bwd: seqlen_q above kMaxSeqlen", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.seqlen_q = flashtile::kMaxSeqlen + 1; }, valid_bwd());
  expect_refused<Bwd>("bwd: softcap infinite", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.softcap = INFINITY; }, valid_bwd());
  expect_refused<Bwd>("bwd: cu_seqlens_k without cu_seqlens_q", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.cu_seqlens_k = kOffsets; }, valid_bwd());
  expect_refused<Bwd>("bwd: dropout without a seed", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.dropout_p = 0.5f; }, valid_bwd());
  expect_refused<Bwd>("bwd: dropout_p negative", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.dropout_p = -0.5f, p.dropout_seed = &kSeed; }, valid_bwd());
  expect_refused<Bwd>("bwd: window_right -3", Status::kInvalidArgument, bwd_check,
                      [](Bwd& p) { p.window_right = -3; }, valid_bwd());
  expect_refused<Bwd>("bwd: head_dim 264", Status::kUnsupportedHeadDim, bwd_check,
                      [](Bwd& p) { p.head_dim = 264; }, valid_bwd());
  expect_refused<Bwd>("bwd: misaligned dq", Status::kMisalignedPointer, bwd_check,
                      [](Bwd& p) { p.dq = fake_pointer(0x70004); }, valid_bwd());
  expect_refused<Bwd>("bwd: odd batch stride of dk", Status::kMisalignedPointer, bwd_check,
                      [](Bwd& p) { p.dk_batch_stride += 2; }, valid_bwd());
  expect_refused<Bwd>("bwd: misaligned workspace", Status::kMisalignedPointer, bwd_check,
                      [](Bwd& p) { p.workspace = fake_pointer(0xa0002); }, valid_bwd());

  // The KV-cache API.
  using Kv = flashtile::KvCacheParams;
  const auto kv_check = [](const Kv& p) { return flashtile::can_implement_kvcache(p); };
  expect(kv_check(valid_kvcache()) == Status::kSuccess, "valid KV-cache params pass");
  expect_refused<Kv>("kvcache: null k_cache", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.k_cache = nullptr; }, valid_kvcache());
  expect_refused<Kv>("kvcache: page size 0", Status::kInvalidArgument, kv_check, [](Kv& p) { p.page_size = 0; },
                     valid_kvcache());
  expect_refused<Kv>("kvcache: block_table with cache_batch_idx", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.cache_batch_idx = static_cast<const int*>(fake_pointer(0x70000)); },
                     valid_kvcache());
  expect_refused<Kv>("kvcache: nheads not a multiple of nheads_k", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.nheads_k = 3; }, valid_kvcache());
  expect_refused<Kv>("kvcache: head dim 80 (no kernel: callers pad)", Status::kUnsupportedHeadDim, kv_check,
                     [](Kv& p) { p.head_dim = 80; }, valid_kvcache());
  expect_refused<Kv>("kvcache: splits past the limit", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.num_splits = flashtile::kMaxKvCacheSplits + 1; }, valid_kvcache());
  expect_refused<Kv>("kvcache: out heads overlap", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.out_head_stride = 0; }, valid_kvcache());
  expect_refused<Kv>("kvcache: k_cache row stride not 16-byte", Status::kMisalignedPointer, kv_check,
                     [](Kv& p) { p.k_row_stride = 2 * 128 + 4; }, valid_kvcache());
  expect_refused<Kv>("kvcache: softcap NaN", Status::kInvalidArgument, kv_check,
                     [](Kv& p) { p.softcap = std::nanf(""); }, valid_kvcache());
  using Append = flashtile::KvAppendParams;
  const auto append_check = [](const Append& p) { return flashtile::can_implement_kvcache_append(p); };
  expect(append_check(valid_kvcache_append()) == Status::kSuccess, "valid append params pass");
  expect_refused<Append>("append: no cache_seqlens", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.cache_seqlens = nullptr; }, valid_kvcache_append());
  expect_refused<Append>("append: k without v", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.v = nullptr; }, valid_kvcache_append());
  expect_refused<Append>("append: odd rotary dim", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.rotary_dim = 63; }, valid_kvcache_append());
  expect_refused<Append>("append: rotary dim above the head dim", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.rotary_dim = 130; }, valid_kvcache_append());
  expect_refused<Append>("append: q_out without tables", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.rotary_cos = p.rotary_sin = nullptr; }, valid_kvcache_append());
  expect_refused<Append>("append: block_table with cache_batch_idx", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.cache_batch_idx = static_cast<const int*>(fake_pointer(0xb0000)); },
                         valid_kvcache_append());
  expect_refused<Append>("append: negative stride", Status::kInvalidArgument, append_check,
                         [](Append& p) { p.k_cache_dim_stride = -1; }, valid_kvcache_append());
  {
    Append p = valid_kvcache_append();
    p.q = p.rotary_cos = p.rotary_sin = nullptr;
    p.q_out = nullptr;
    expect(append_check(p) == Status::kSuccess, "an append without rotary passes");
  }
  // Splits from the shapes: decoding few sequences splits their keys until
  // the GPU is full; many sequences do not split.
  expect(flashtile::pick_kvcache_splits(valid_kvcache(), 132) > 1, "a short batch splits its keys");
  Kv many = valid_kvcache();
  many.batch = 4096;
  expect(flashtile::pick_kvcache_splits(many, 132) == 1, "a long batch does not split");
  // The H200 sweep's choices (kvcache.hpp): one decode sequence, 16k keys,
  // 32 query heads on 8 KV heads, dense and in 16-token pages.
  Kv decode = valid_kvcache();
  decode.batch = 1, decode.nheads = 32, decode.nheads_k = 8, decode.seqlen_k = 16384;
  decode.block_table = nullptr;
  expect(flashtile::pick_kvcache_splits(decode, 132, true) == 16, "16 splits of 16 blocks with the deeper pipeline");
  expect(flashtile::pick_kvcache_splits(decode, 132, false) == 32, "32 splits of 8 blocks without it");
  expect(flashtile::kvcache_takes_deep_pipeline(decode, 16, true) && !flashtile::kvcache_takes_deep_pipeline(decode, 15, true) &&
             !flashtile::kvcache_takes_deep_pipeline(decode, 16, false),
         "the deeper pipeline for splits of at most 16 blocks where it fits");
  Kv paged = decode;
  paged.block_table = static_cast<const int*>(fake_pointer(0x60000));
  for (int page_size : {1, 16, 64, 256}) {
    paged.page_size = page_size;
    expect(flashtile::kvcache_takes_deep_pipeline(paged, 16, true) &&
               flashtile::pick_kvcache_splits(paged, 132, true) == 16,
           "pages of any size take the deeper pipeline and split as the dense cache");
  }
  decode.batch = 64, decode.seqlen_k = 131072;
  expect(flashtile::pick_kvcache_splits(decode, 132, true) == 1, "no split for a 1 % modelled gain");
  Kv split = valid_kvcache();
  split.num_splits = 4;
  expect(flashtile::kvcache_workspace_bytes(split) ==
             4 * ((3 * 8 * 4 + 3) / 4 * 4 + int64_t(3) * 8 * 4 * 128),
         "the workspace holds 4 splits' logsumexps and outputs");
  expect(flashtile::kvcache(split, nullptr) == Status::kInvalidArgument, "kvcache() needs the workspace to split");
  expect(flashtile::kvcache(valid_kvcache(), nullptr) == Status::kNotBuilt, "kvcache() without kernels is kNotBuilt");

  // Dispatch with nothing registered (no kernels linked here): kNotBuilt,
  // and argument errors still come first.
  expect(flashtile::KernelRegistry::instance().keys().empty(), "no kernels registered in this binary");
  expect(flashtile::fwd(valid_fwd(), nullptr) == Status::kNotBuilt, "fwd() without kernels is kNotBuilt");
  expect(flashtile::bwd(valid_bwd(), nullptr) == Status::kNotBuilt, "bwd() without kernels is kNotBuilt");
  // A launcher registered without code for compute capability 9.0 (an sm80
  // plain file of a build with 90a, compiled for its other archs) is skipped
  // where the dispatch asks for sm90 code.
  {
    flashtile::KernelRegistry registry;
    const flashtile::KernelKey plain{flashtile::Direction::kFwd, flashtile::Arch::kSm80, 64, flashtile::DType::kBf16,
                                     flashtile::Variant::kPlain};
    flashtile::FwdLauncher launch = [](const flashtile::FwdParams&, cudaStream_t) { return Status::kSuccess; };
    registry.add_fwd(plain, launch, flashtile::SmemBudget::k99KB, flashtile::SmemBudget::k227KB, false);
    expect(registry.find_fwd(flashtile::Arch::kSm80, 64, flashtile::DType::kBf16, flashtile::Variant::kPlain) == launch &&
               registry.find_fwd(flashtile::Arch::kSm80, 64, flashtile::DType::kBf16, flashtile::Variant::kPlain,
                                 flashtile::SmemBudget::k227KB, true) == nullptr,
           "a launcher without sm90 code is found except where sm90 code is asked for");
    expect(registry.keys_without_sm90_code().size() == 1 && registry.keys_without_sm90_code()[0] == plain,
           "keys_without_sm90_code lists it");
    expect(!registry.has_sm90_code(), "a registry of such launchers alone has no sm90 code (a build without 90a)");
    const flashtile::KernelKey wgmma{flashtile::Direction::kFwd, flashtile::Arch::kSm90, 64, flashtile::DType::kBf16,
                                     flashtile::Variant::kPlain};
    registry.add_fwd(wgmma, launch, flashtile::SmemBudget::k227KB);
    expect(registry.has_sm90_code(), "with an sm90 launcher it has");
    expect(flashtile::arch_listed({800, 900}, 900) && !flashtile::arch_listed({800}, 900),
           "arch_listed finds 900 in nvcc's arch list");
  }
  Fwd bad = valid_fwd();
  bad.head_dim = 80;
  expect(flashtile::fwd(bad, nullptr) == Status::kUnsupportedHeadDim, "fwd() checks before dispatch");

  // Workspace: dQ accumulator (fp32, query rows rounded up to 128, bytes to
  // 256), the deterministic mode's turn counters or the split tail's dK/dV
  // slots (no mask only), then row sums.
  const Bwd b = valid_bwd();
  const size_t rows = (size_t(b.seqlen_q) + 127) / 128 * 128;
  const size_t accum = size_t(b.batch) * rows * b.nheads * b.head_dim * sizeof(float);
  const size_t accum_rounded = (accum + 255) / 256 * 256;
  const size_t key_blocks = size_t(b.batch) * b.nheads_k * ((b.seqlen_k + 63) / 64);
  const size_t tail = std::min<size_t>(key_blocks, flashtile::kBwdTailMaxTasks) * 2 * 128 * b.head_dim * sizeof(float);
  const size_t row_sums = size_t(b.batch) * b.nheads * b.seqlen_q * sizeof(float);
  expect(!b.causal && b.window_left < 0 && b.window_right < 0, "the base backward params have no mask");
  expect(flashtile::bwd_workspace_bytes(b) == accum_rounded + tail + row_sums,
         "bwd_workspace_bytes = dQ accumulator + tail slots + row sums");
  const flashtile::BwdWorkspace ws = flashtile::bwd_workspace_layout(b, fake_pointer(0x100000));
  expect(reinterpret_cast<uintptr_t>(ws.dsum) % 256 == 0, "row sums start 256-byte aligned");
  expect(ws.dq_accum_bytes == accum_rounded, "dQ accumulator size");
  expect(ws.dkv_tail == ws.dq_accum + accum_rounded / sizeof(float) && ws.dkv_tail_bytes == tail,
         "tail slots right after the dQ accumulator");
  Bwd causal = b;
  causal.causal = true;
  expect(flashtile::bwd_workspace_bytes(causal) == accum_rounded + row_sums, "causal: no tail slots");
  Bwd windowed = b;
  windowed.window_left = 16;
  expect(flashtile::bwd_workspace_bytes(windowed) == accum_rounded + row_sums, "a window: no tail slots");
  Bwd det = b;
  det.deterministic = true;
  const size_t turns = size_t(b.batch) * b.nheads * rows / flashtile::kBwdDqTurnRows * sizeof(int);
  const size_t turns_rounded = (turns + 255) / 256 * 256;
  expect(flashtile::bwd_workspace_bytes(det) == accum_rounded + turns_rounded + row_sums,
         "deterministic: dQ accumulator, a turn counter per 64 of its rows, no tail slots, row sums");
  const flashtile::BwdWorkspace det_ws = flashtile::bwd_workspace_layout(det, fake_pointer(0x100000));
  expect(reinterpret_cast<char*>(det_ws.dq_turns) == reinterpret_cast<char*>(det_ws.dq_accum) + accum_rounded &&
             det_ws.dq_turn_bytes == turns_rounded,
         "turn counters right after the dQ accumulator");
  expect(reinterpret_cast<uintptr_t>(det_ws.dsum) % 256 == 0, "deterministic: row sums start 256-byte aligned");
  expect(ws.dq_turn_bytes == 0, "no turn counters outside the deterministic mode");

  for (Status s : {Status::kSuccess, Status::kInvalidArgument, Status::kMisalignedPointer,
                   Status::kUnsupportedHeadDim, Status::kNotBuilt, Status::kCudaError, Status::kUnsupportedDevice}) {
    expect(flashtile::status_string(s) != nullptr && flashtile::status_string(s)[0] != '\0',
           "every Status has text");
  }

  std::printf("%d passed, %d failed\n", g_checks - g_failures, g_failures);
  return g_failures == 0 ? 0 : 1;
}
