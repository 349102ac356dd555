"""The DiHAL bridge at one layer: its training throughput, the hybrid's decode latency against
the intact backbone's, and the teacher-forced perplexity of backbone, hybrid and skip control.

- training: a bridge of the diagnostic suite trained for S steps of the diagnostic matched
  budget; tokens/s counts the training loop only, the extraction of its targets (hidden
  states at layers 0 and ℓ) is timed apart;
- decode: ms per generated token (a decode step for the whole batch, sampling included,
  divided by the batch) of the hybrid, whose bridge (K steps per token) and upper layers
  both keep caches, and of ``intact_control`` (the same cached decode loop, no bridge). The
  models take turns, one decode step each, so that the machine's load hits them alike; a
  short decode of each warms up first. (a) At batch 1 and 16, K = 1, 4, 8, 16, N new tokens
  from the start token: the median over repeats of each decode's mean over its steps (the
  prefill excluded), beside the bridge re-sampled over the whole prefix at every token (the
  hybrid without the bridge cache, and any bridge without one). (b) At batch 1 and the suite's K
  (``--bridge-steps``), one
  decode of the longest of 64, 256, 1024 tokens: the mean ms/token over each length's first
  L tokens, and the median over tokens L/2..L, the cost per token at that length.
  Target: hybrid/backbone ≤ 1.2 at the suite's K at both batch sizes and at every length (the
  bridge's cost per token as flat as the backbone's);
- perplexity on validation sequences of the budget's length.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import common
import torch
from dihal_builtin.bridge import DihalBridge
from tabulate import tabulate

from dihal_bench.api.sampling import sample_next_token
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, read_bridge_meta
from dihal_bench.hybrid.evaluation import teacher_forced_nll
from dihal_bench.hybrid.model import HybridLM, intact_control, skip_control
from dihal_bench.hybrid.training import (
    packed_split,
    train_bridge,
    training_subset,
    with_states,
)
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget

DEFAULT_LAYER = 3
TARGET_RATIO = 1.2  # hybrid / backbone decode time per token, at the K the suite samples with
WARMUP_TOKENS = 4


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


class ResampledBridge:
    """A bridge seen without its sample cache: the hybrid re-samples it over the whole prefix
    at every token (its decode before the bridge cache, and that of any bridge without one)."""

    def __init__(self, bridge):
        self.bridge = bridge

    def sample(self, cond, steps=None, *, sink=None):
        return self.bridge.sample(cond, steps, sink=sink)


def with_positions(bridge, positions: int, seed: int):
    """The bridge, or where its learned positions are fewer than ``positions`` a copy with the
    position table extended by rows drawn as ``nn.Embedding`` initialises them: the long
    decodes go past the suite's max_len, and a step's cost does not depend on those values
    (the trained bridge's rows past the training length are untrained too)."""
    if not isinstance(bridge, DihalBridge) or bridge.max_len >= positions:
        return bridge
    longer = DihalBridge(**{**bridge.config(), "max_len": positions}).to(bridge.target_mean.device)
    state = bridge.state_dict()
    extra = torch.randn(positions - bridge.max_len, bridge.d_model, generator=torch.Generator().manual_seed(seed))
    state["position.weight"] = torch.cat([state["position.weight"], extra.to(state["position.weight"])])
    longer.load_state_dict(state)
    return longer.eval()


def lockstep_decode(models: dict[str, HybridLM], batch: int, new_tokens: int, seed: int) -> dict[str, list[float]]:
    """Seconds of every decode step of each model generating ``new_tokens`` tokens for ``batch``
    sequences from the start token (temperature 1), the models taking turns one step each.
    Step 0 is the prefill (the start token); step i feeds token i and samples token i+1."""
    decoders = {name: model.decoder() for name, model in models.items()}
    generators = {name: torch.Generator(device=model.backbone.device).manual_seed(seed)
                  for name, model in models.items()}
    fed = {name: model.start_ids(batch) for name, model in models.items()}
    seconds = {name: [] for name in models}
    for _ in range(new_tokens):
        for name, decoder in decoders.items():
            started = time.perf_counter()
            logits = decoder.append(fed[name])[:, -1]
            fed[name] = sample_next_token(logits, 1.0, 1.0, generators[name])[:, None]
            if fed[name].device.type == "cuda":
                torch.cuda.synchronize(fed[name].device)
            seconds[name].append(time.perf_counter() - started)
    return seconds


def measure_decode(models: dict[str, HybridLM], batch_sizes: list[int], new_tokens: int, repeats: int,
                   seed: int) -> dict[str, dict[int, float]]:
    """Milliseconds per generated token of each model at each batch size: the median over
    ``repeats`` lockstep decodes of each one's mean step time after the prefill, per sequence."""
    ms_per_token = {name: {} for name in models}
    for batch in batch_sizes:
        lockstep_decode(models, batch, WARMUP_TOKENS, seed)
        runs = [lockstep_decode(models, batch, new_tokens, seed) for _ in range(repeats)]
        for name in models:
            seconds = statistics.median(statistics.fmean(run[name][1:]) for run in runs)
            ms_per_token[name][batch] = 1000 * seconds / batch
    return ms_per_token


def measure_decode_by_length(models: dict[str, HybridLM], lengths: list[int], batch: int, repeats: int,
                             seed: int) -> dict[str, dict[str, dict[int, float]]]:
    """Milliseconds per token of each model in decodes of the longest length, at each length L:
    ``mean``, the mean over the steps that generate tokens 2..L (a decode of L tokens, the
    prefill excluded), and ``late``, the median over those that generate tokens L/2+1..L (the
    cost at length L; a median, as one decode's steps are the repeats there). Median over
    ``repeats`` decodes."""
    lockstep_decode(models, batch, WARMUP_TOKENS, seed)
    runs = [lockstep_decode(models, batch, max(lengths), seed) for _ in range(repeats)]
    windows = {"mean": lambda steps, length: statistics.fmean(steps[1:length]),
               "late": lambda steps, length: statistics.median(steps[length // 2 : length])}
    return {name: {window: {length: 1000 * statistics.median(statistic(run[name], length) for run in runs) / batch
                            for length in lengths}
                   for window, statistic in windows.items()}
            for name in models}


def measure_decoding(backbone, bridge, layer: int, sink_passthrough: bool, bridge_steps: int, k_values: list[int],
                     batch_sizes: list[int], new_tokens: int, repeats: int, lengths: list[int], length_batch: int,
                     length_repeats: int, seed: int) -> dict:
    """The decode figures: the backbone against the hybrid at each K (``bridge_steps``
    included) and with the bridge re-sampled at ``bridge_steps``, at each batch size; then
    the backbone against the hybrid at ``bridge_steps`` by generated length."""
    def hybrid(lower, steps):
        return HybridLM(backbone, lower, layer, sink_passthrough=sink_passthrough, steps=steps)

    control = intact_control(backbone)
    k_values = sorted(set(k_values) | {bridge_steps})
    timed = measure_decode({"backbone": control, **{f"K={k}": hybrid(bridge, k) for k in k_values},
                            "re-sampled": hybrid(ResampledBridge(bridge), bridge_steps)},
                           batch_sizes, new_tokens, repeats, seed)
    by_k = {k: timed[f"K={k}"] for k in k_values}
    by_length = measure_decode_by_length(
        {"backbone": control, "hybrid": hybrid(with_positions(bridge, max(lengths), seed), bridge_steps)},
        lengths, length_batch, length_repeats, seed)

    def ratios(figures: dict, reference: dict) -> dict:
        return {key: value / reference[key] for key, value in figures.items()}

    return {
        "decode_ms_per_token": {"backbone": timed["backbone"], "hybrid": by_k[bridge_steps]},
        "decode_ratio_hybrid_to_backbone": ratios(by_k[bridge_steps], timed["backbone"]),
        "decode_ms_per_token_by_k": by_k,
        "decode_ratio_by_k": {k: ratios(by_k[k], timed["backbone"]) for k in k_values},
        "decode_ms_per_token_resampled_bridge": timed["re-sampled"],
        "decode_ratio_resampled_bridge_to_backbone": ratios(timed["re-sampled"], timed["backbone"]),
        "decode_ms_per_token_by_length": by_length,
        "decode_ratio_by_length": {window: ratios(by_length["hybrid"][window], by_length["backbone"][window])
                                   for window in ("mean", "late")},
    }


def meets_target(decoding: dict) -> bool:
    """Hybrid/backbone ≤ the target at every batch size and at every length (the cost per token
    at that length), at the K the hybrid samples with (``--bridge-steps``, the suite's K)."""
    judged = [*decoding["decode_ratio_hybrid_to_backbone"].values(),
              *decoding["decode_ratio_by_length"]["late"].values()]
    return all(ratio <= TARGET_RATIO for ratio in judged)


def print_decoding(decoding: dict, bridge_steps: int, new_tokens: int, repeats: int, length_batch: int,
                   length_repeats: int) -> None:
    ms, ratio = decoding["decode_ms_per_token"], decoding["decode_ratio_hybrid_to_backbone"]
    resampled, resampled_ratio = (decoding["decode_ms_per_token_resampled_bridge"],
                                  decoding["decode_ratio_resampled_bridge_to_backbone"])
    print(tabulate([[batch, ms["backbone"][batch], ms["hybrid"][batch], ratio[batch],
                     common.verdict(ratio[batch], TARGET_RATIO), resampled[batch], resampled_ratio[batch]]
                    for batch in ratio],
                   headers=["batch", "backbone ms/token", f"hybrid K={bridge_steps} ms/token", "hybrid/backbone",
                            f"target <= {TARGET_RATIO}", "bridge re-sampled ms/token", "re-sampled/backbone"],
                   floatfmt=".2f"))
    print()
    by_k, k_ratio = decoding["decode_ms_per_token_by_k"], decoding["decode_ratio_by_k"]
    print(tabulate([[k, *(value for batch in ratio for value in (by_k[k][batch], k_ratio[k][batch]))] for k in by_k],
                   headers=["K", *(header for batch in ratio for header in (f"batch {batch} ms/token", "x backbone"))],
                   floatfmt=".2f"))
    print(f"({new_tokens} tokens per sequence from the start token, the models in turn step by step; "
          f"median of {repeats} after a warm-up)")
    print()
    by_length, length_ratio = decoding["decode_ms_per_token_by_length"], decoding["decode_ratio_by_length"]
    print(tabulate([[length, by_length["backbone"]["mean"][length], by_length["hybrid"]["mean"][length],
                     length_ratio["mean"][length], by_length["backbone"]["late"][length],
                     by_length["hybrid"]["late"][length], length_ratio["late"][length],
                     common.verdict(length_ratio["late"][length], TARGET_RATIO)] for length in length_ratio["late"]],
                   headers=["tokens L", "backbone ms/token", "hybrid ms/token", "ratio", "backbone, tokens L/2..L",
                            "hybrid, tokens L/2..L", "ratio", f"target <= {TARGET_RATIO}"], floatfmt=".2f"))
    print(f"(batch {length_batch}, K={bridge_steps}: one decode of {max(length_ratio['late'])} tokens, "
          f"median of {length_repeats} after a warm-up)")
    print()


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
    parser.add_argument("--bridge-steps", type=int,
                        help="K bridge sampling steps per token for perplexity and the length scan, added to "
                             "--k-values (default: the suite's); the target is judged at this K")
    parser.add_argument("--k-values", type=int, nargs="+", default=[1, 4, 8, 16], help="K values timed side by side")
    parser.add_argument("--new-tokens", type=int, help="tokens generated per decode (default 32; --quick: 4)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, help="timed decode repeats, median taken (default 3; --quick: 1)")
    parser.add_argument("--lengths", type=int, nargs="+",
                        help="generated lengths of the length scan, one decode of the longest (default 64 256 1024; "
                             "--quick: 8 16)")
    parser.add_argument("--length-batch", type=int, default=1, help="batch size of the length scan (default 1)")
    parser.add_argument("--length-repeats", type=int, default=1, help="decodes of the length scan, median taken")
    parser.add_argument("--eval-sequences", type=int, help="validation sequences for perplexity (default 32; --quick: 2)")
    args = parser.parse_args()
    steps = args.steps or (5 if args.quick else 100)
    new_tokens = args.new_tokens or (4 if args.quick else 32)
    repeats = args.repeats or (1 if args.quick else 3)
    lengths = sorted(set(args.lengths or ([8, 16] if args.quick else [64, 256, 1024])))
    eval_sequences = args.eval_sequences or (2 if args.quick else 32)
    if new_tokens < 2 or min(lengths) < 2:
        parser.error("--new-tokens and --lengths must be at least 2: a decode's first step (the prefill) is not timed")

    suite = common.diagnostic_suite()
    budget = Budget.from_dict({**suite.budget, "seed": args.seed}).replace(steps=steps)
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

    decoding = measure_decoding(backbone, bridge, layer, spec.sink_passthrough, bridge_steps, args.k_values,
                                args.batch_sizes, new_tokens, repeats, lengths, args.length_batch,
                                args.length_repeats, args.seed)
    hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=bridge_steps)
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
    print_decoding(decoding, bridge_steps, new_tokens, repeats, args.length_batch, args.length_repeats)
    print(tabulate([[name, value, value / ppl["backbone"]] for name, value in ppl.items()],
                   headers=["model", f"validation PPL ({len(valid)} x {budget.seq_len})", "x backbone"],
                   floatfmt=".2f"))

    common.report("bridge_bench", {
        "training": training,
        **decoding,
        "target_ratio": TARGET_RATIO,
        "meets_target": meets_target(decoding),
        "validation_ppl": ppl,
    }, {"backbone": backbone.name, "corpus": corpus.name, "layer": layer,
        "bridge": read_bridge_meta(args.checkpoint)["name"] if args.checkpoint else spec.name,
        "bridge_config": bridge.config(), "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        "budget": None if args.checkpoint else budget.to_dict(), "seq_len": budget.seq_len, "bridge_steps": bridge_steps, "new_tokens": new_tokens,
        "batch_sizes": args.batch_sizes, "repeats": repeats, "k_values": sorted(decoding["decode_ms_per_token_by_k"]),
        "lengths": lengths, "length_batch": args.length_batch, "length_repeats": args.length_repeats,
        "warmup_tokens": WARMUP_TOKENS, "eval_sequences": len(valid), "seed": args.seed,
        "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
