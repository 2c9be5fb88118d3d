#!/usr/bin/env python3
"""A training step of Hugging Face transformers models with flashtile as the
attention implementation, beside the same model with transformers' own
attention (sdpa; eager for Gemma 2, whose softcap sdpa refuses).

Models: random-weight Llama, Mistral (sliding window 1024) and Gemma 2
(softcap 50, sliding window 1024 on every other layer), bfloat16, hidden
2048, 16 query heads on 8 KV heads of head dim 128, MLP 5632, 4 layers,
vocabulary 32000. A step: forward, next-token cross-entropy, backward,
fused AdamW. Two batches of 2 x seqlen tokens: full (no padding mask, the
dense kernels) and padded (the second sequence a third shorter, so
flashtile unpads to a varlen batch and sdpa takes a mask).

    python3 benchmarks/bench_transformers.py                  # seqlen 4096 -> results CSV
    python3 benchmarks/bench_transformers.py --seqlen 8192 --models llama

Check before timing: the step's loss with flashtile and with the peer, from
the same weights and batch, agree to 1 % (test_transformers_gpu.py checks
logits and every gradient against float32 properly; here the check catches
a wrong dispatch, not rounding), and the profiler names a flashtile kernel
in the step. Timing: CUDA events around each step after warm-up steps,
median of the repeats; tokens/s counts the real (unpadded) tokens.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

COLUMNS = ["model", "impl", "batch", "seqlen", "padded", "layers", "ms", "tokens_per_s", "loss"]
PEERS = {"llama": "sdpa", "mistral": "sdpa", "gemma2": "eager"}
WARMUP, REPEATS = 3, 10


def model_config(kind: str, layers: int):
    import transformers

    common = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=1024)
    return transformers.Gemma2Config(**common, sliding_window=1024, attn_logit_softcapping=50.0,
                                     final_logit_softcapping=30.0, query_pre_attn_scalar=128)


def make_batch(batch: int, seqlen: int, padded: bool, vocab: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seqlen), device="cuda", generator=g)
    mask = torch.ones(batch, seqlen, dtype=torch.long, device="cuda")
    if padded:
        mask[1, : seqlen // 3] = 0  # left padding, as generation-style batches have
    labels = ids.masked_fill(mask == 0, -100)
    return ids, (mask if padded else None), labels


def train_step(model, optimizer, ids, mask, labels):
    optimizer.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    optimizer.step()
    return loss.detach()


def timed_steps(step, before=None) -> list[float]:
    """ms of REPEATS runs of `step` after WARMUP, each timed by CUDA events;
    `before` (untimed) runs ahead of each (bench_ring.py: the ranks'
    barrier)."""
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(REPEATS):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--commit", help="commit for the CSV header when the tree has no git")
    parser.add_argument("--out", type=Path, default=None,
                        help="results CSV (default $FLASHTILE_RESULTS_DIR or ~/flashtile-results, "
                             "h200-transformers.csv)")
    args = parser.parse_args(argv)

    import transformers  # noqa: F401  (a clear ImportError before any model is built)

    import flashtile.integrations.transformers as ft_transformers
    from bench_attention import run_metadata
    from kernel_names import cuda_kernel_names
    from plot_results import results_dir, write_table

    name = ft_transformers.register()
    meta = run_metadata(args)
    print(", ".join(f"{key}={value}" for key, value in meta.items()))
    print(f"{'model':<9}{'impl':<16}{'padded':>7}{'ms':>9}{'tok/s':>10}{'loss':>8}{'vs peer':>9}")
    rows, failed = [], False
    for kind in args.models:
        config = model_config(kind, args.layers)
        torch.manual_seed(0)
        state = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16).state_dict()
        for padded in (False, True):
            ids, mask, labels = make_batch(args.batch, args.seqlen, padded, config.vocab_size)
            tokens = int((labels != -100).sum())
            results = {}
            for impl in (name, PEERS[kind]):
                model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl)
                model = model.to("cuda", torch.bfloat16)
                model.load_state_dict(state)
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
                first_loss, names = cuda_kernel_names(lambda: train_step(model, optimizer, ids, mask, labels))
                if impl == name and not any("flashtile::" in n for n in names):
                    print(f"{kind:<9}{impl:<16}{padded:>7}  FAIL: no flashtile kernel ran in the step")
                    failed = True
                    break
                model.load_state_dict(state)  # the timed steps start from the shared weights again
                ms = statistics.median(timed_steps(lambda: train_step(model, optimizer, ids, mask, labels)))
                results[impl] = (ms, first_loss.item())
                del model, optimizer
                torch.cuda.empty_cache()
            if len(results) < 2:
                continue
            ours_loss, peer_loss = results[name][1], results[PEERS[kind]][1]
            if not abs(ours_loss - peer_loss) <= 0.01 * abs(peer_loss):
                print(f"{kind:<9}{name:<16}{padded:>7}  FAIL: first-step loss {ours_loss:.4f}, "
                      f"{PEERS[kind]} {peer_loss:.4f}")
                failed = True
                continue
            peer_ms = results[PEERS[kind]][0]
            for impl, (ms, loss) in results.items():
                rate = tokens / (ms * 1e-3)
                print(f"{kind:<9}{impl:<16}{padded:>7}{ms:>9.2f}{rate:>10.0f}{loss:>8.3f}{peer_ms / ms:>9.2f}",
                      flush=True)
                rows.append(dict(model=kind, impl=impl, batch=args.batch, seqlen=args.seqlen, padded=int(padded),
                                 layers=args.layers, ms=f"{ms:.3f}", tokens_per_s=f"{rate:.0f}",
                                 loss=f"{loss:.4f}"))

    out_path = args.out or results_dir() / "h200-transformers.csv"
    write_table(out_path, meta, COLUMNS, rows)
    print(f"wrote {out_path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
