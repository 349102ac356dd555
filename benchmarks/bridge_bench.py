"""The DiHAL bridge at one layer: its training throughput, the hybrid's decode latency against
the intact backbone's, and the teacher-forced perplexity of backbone, hybrid and skip control.

- training: a bridge of the diagnostic suite trained for S steps of the diagnostic matched
  budget; tokens/s counts the training loop only, the extraction of its targets (hidden
  states at layers 0 and ℓ) is timed apart;
- decode: ms per generated token of the hybrid (K bridge steps per token) and of
  ``intact_control`` (the same cached sampling loop, no bridge), at batch 1 and 16, median of
  repeats after a warm-up. Target: hybrid/backbone ≤ 1.5 at K = 8;
- perplexity on validation sequences of the budget's length.
"""

from __future__ import annotations

from pathlib import Path

import common
from tabulate import tabulate

from dihal_bench.backbone import load_backbone
from dihal_bench.bridge_io import load_bridge_checkpoint, read_bridge_meta
from dihal_bench.budget import Budget
from dihal_bench.corpus import load_corpus
from dihal_bench.evaluation import teacher_forced_nll
from dihal_bench.hybrid import HybridLM, intact_control, skip_control
from dihal_bench.sweep import packed_split, train_bridge, training_subset, with_states

DEFAULT_LAYER = 3
TARGET_RATIO = 1.5  # hybrid / backbone decode time per token, at K = 8


def measure_training(backbone, corpus, spec, layer: int) -> tuple[object, dict]:
    """Train the bridge; returns it and the target-extraction and training-loop figures."""
    budget = spec.budget
    sequences = training_subset(packed_split(backbone, corpus, "train", budget.seq_len), [budget], budget.seed)
    train_data, extract_seconds = common.timed(with_states, backbone, sequences, [layer], progress=False)
    bridge, stats = train_bridge(backbone, spec, layer, train_data, progress=False)
    return bridge, {
        "train_sequences": len(sequences),
        "extract_seconds": extract_seconds,
        "extract_tokens_per_second": sequences.numel() / extract_seconds,
        "steps": stats["steps"],
        "tokens_seen": stats["tokens_seen"],
        "train_seconds": stats["train_seconds"],
        "seconds_per_step": stats["train_seconds"] / stats["steps"],
        "train_tokens_per_second": stats["tokens_seen"] / stats["train_seconds"],
        "final_loss": stats["final_loss"],
        "parameters": stats["parameters"],
    }


def measure_decode(models: dict[str, HybridLM], batch_sizes: list[int], new_tokens: int, repeats: int,
                   seed: int) -> dict[str, dict[int, float]]:
    """Milliseconds per generated token of each model at each batch size."""
    ms_per_token = {name: {} for name in models}
    for batch in batch_sizes:
        for name, model in models.items():
            seconds = common.median_seconds(
                lambda: model.generate(batch, new_tokens, seed=seed, batch_size=batch), repeats)
            ms_per_token[name][batch] = 1000 * seconds / (batch * new_tokens)
    return ms_per_token


def measure_perplexity(models: dict, sequences, batch_size: int = 16) -> dict[str, float]:
    """Teacher-forced validation perplexity of each next-token logits function."""
    return {name: teacher_forced_nll(logits, sequences, batch_size)["ppl"] for name, logits in models.items()}


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--layer", type=int, help=f"ℓ, the layers 1..ℓ the bridge replaces (default {DEFAULT_LAYER}; "
                                                  f"with --checkpoint: the checkpoint's)")
    parser.add_argument("--steps", type=int, help="S training steps (default 100; --quick: 5)")
    parser.add_argument("--checkpoint", type=Path, metavar="DIR",
                        help="a trained bridge (bridge_io checkpoint folder) to use instead of training one")
    parser.add_argument("--bridge-steps", type=int, help="K bridge sampling steps per token (default: the suite's, 8)")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per decode (default 32; --quick: 4)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, help="timed decode repeats, median taken (default 3; --quick: 1)")
    parser.add_argument("--eval-sequences", type=int, help="validation sequences for perplexity (default 32; --quick: 2)")
    args = parser.parse_args()
    steps = args.steps or (5 if args.quick else 100)
    new_tokens = args.new_tokens or (4 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    eval_sequences = args.eval_sequences or (2 if args.quick else 32)

    suite = common.diagnostic_suite()
    budget = Budget.from_dict({**suite["budget"], "seed": args.seed}).replace(steps=steps)
    spec = common.bridge_spec(suite, budget)
    bridge_steps = args.bridge_steps or spec.sample_steps
    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)

    if args.checkpoint:
        bridge, layer = load_bridge_checkpoint(args.checkpoint, backbone, layer=args.layer)
        training = None
    else:
        layer = args.layer or DEFAULT_LAYER
        bridge, training = measure_training(backbone, corpus, spec, backbone.check_layer(layer))

    hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=bridge_steps)
    decode = measure_decode({"backbone": intact_control(backbone), "hybrid": hybrid}, args.batch_sizes,
                            new_tokens, repeats, args.seed)
    ratios = {batch: decode["hybrid"][batch] / decode["backbone"][batch] for batch in args.batch_sizes}
    valid = packed_split(backbone, corpus, "validation", budget.seq_len)[:eval_sequences]
    ppl = measure_perplexity({"backbone": backbone.logits, "hybrid": hybrid.logits,
                              "skip control": skip_control(backbone, layer).logits}, valid)

    print(f"DiHAL bridge on {backbone.name} at ℓ={layer}, K={bridge_steps} bridge steps per token")
    if training:
        print(tabulate([[training["train_sequences"], training["extract_seconds"], training["steps"],
                         training["tokens_seen"], training["train_seconds"], training["seconds_per_step"],
                         training["train_tokens_per_second"], training["final_loss"]]],
                       headers=["train seqs", "target extract s", "steps", "tokens", "train s", "s/step",
                                "train tokens/s", "final loss"], floatfmt=".3f"))
    else:
        print(f"bridge loaded from {args.checkpoint} (no training measured)")
    print()
    print(tabulate([[batch, decode["backbone"][batch], decode["hybrid"][batch], ratios[batch],
                     common.verdict(ratios[batch], TARGET_RATIO) if bridge_steps == 8 else "n/a (K != 8)"]
                    for batch in args.batch_sizes],
                   headers=["batch", "backbone ms/token", "hybrid ms/token", "hybrid/backbone",
                            f"target <= {TARGET_RATIO}"], floatfmt=".2f"))
    print(f"({new_tokens} new tokens per sequence, median of {repeats} after a warm-up)")
    print()
    print(tabulate([[name, value, value / ppl["backbone"]] for name, value in ppl.items()],
                   headers=["model", f"validation PPL ({len(valid)} x {budget.seq_len})", "x backbone"],
                   floatfmt=".2f"))

    common.report("bridge_bench", {
        "training": training,
        "decode_ms_per_token": decode,
        "decode_ratio_hybrid_to_backbone": ratios,
        "target_ratio": TARGET_RATIO,
        "meets_target": all(ratio <= TARGET_RATIO for ratio in ratios.values()) if bridge_steps == 8 else None,
        "validation_ppl": ppl,
    }, {"backbone": backbone.name, "corpus": corpus.name, "layer": layer,
        "bridge": read_bridge_meta(args.checkpoint)["name"] if args.checkpoint else spec.name,
        "bridge_config": bridge.config(), "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "budget": None if args.checkpoint else budget.to_dict(), "seq_len": budget.seq_len, "bridge_steps": bridge_steps, "new_tokens": new_tokens,
        "batch_sizes": args.batch_sizes, "repeats": repeats, "eval_sequences": len(valid), "seed": args.seed,
        "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
