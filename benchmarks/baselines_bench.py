"""Training and sampling cost of every method of the diagnostic comparison, side by side:
the DiHAL bridge at layer 3 and the five baselines.

Each method trains for S steps of the diagnostic matched budget (its parameter allowance is
the diagnostic bridge's size, as in ``dihal-bench run``) on the same training sequences.
Reported per method:

- training tokens/s of the training loop (``TrainResult``: steps x batch x seq_len over the
  loop's wall-clock), and the loop's seconds extrapolated to the budget's full steps.
  Target: under 120 s for every method;
- setup seconds: work before the loop that grows with the training sequences, not with the
  steps (the bridge's target extraction, LD4LG's backbone features), measured here and
  extrapolated to the full budget's distinct sequences. Reported, not part of the target;
- sampling ms per sequence: n sequences of T tokens in one batch, median of repeats after a
  warm-up, with the suite's ``diffusion_steps`` for the diffusion baselines and its bridge
  steps for DiHAL.
"""

from __future__ import annotations

import common
from tabulate import tabulate

from dihal_bench.hybrid.model import HybridLM
from dihal_bench.hybrid.training import (
    packed_split,
    train_bridge,
    training_subset,
    with_states,
)
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget

DIHAL = "dihal"
BASELINES = ("diffusion-lm", "sed", "ld4lg", "codar", "ar-backbone")
DIHAL_LAYER = 3
TARGET_SECONDS = 120.0


def training_figures(steps: int, tokens: int, loop_seconds: float, setup_seconds: float,
                     short: Budget, full: Budget) -> dict:
    """Throughput of a short run and its extrapolation to the full budget: the loop scales
    with the steps, the setup with the distinct training sequences."""
    trains = steps > 0
    return {
        "steps": steps,
        "tokens_seen": tokens,
        "loop_seconds": loop_seconds,
        "train_tokens_per_second": tokens / loop_seconds if trains else None,
        "full_train_seconds": loop_seconds * full.steps / steps if trains else 0.0,
        "setup_seconds": setup_seconds,
        "full_setup_seconds": setup_seconds * full.distinct_sequences / short.distinct_sequences,
    }


def measure_dihal(backbone, spec, sequences, full: Budget, samples: int, seq_len: int, repeats: int,
                  seed: int) -> dict:
    """The DiHAL bridge at DIHAL_LAYER: extract its targets, train it, sample from the hybrid."""
    train_data, setup_seconds = common.timed(with_states, backbone, sequences, [DIHAL_LAYER], progress=False)
    bridge, stats = train_bridge(backbone, spec, DIHAL_LAYER, train_data, progress=False)
    hybrid = HybridLM(backbone, bridge, DIHAL_LAYER, sink_passthrough=spec.sink_passthrough,
                      steps=spec.sample_steps)
    sample_seconds = common.median_seconds(
        lambda: hybrid.generate(samples, seq_len, seed=seed, batch_size=samples), repeats)
    return {
        "parameters": stats["parameters"],
        "in_budget": True,
        "sampling_steps": spec.sample_steps,
        **training_figures(stats["steps"], stats["tokens_seen"], stats["train_seconds"], setup_seconds,
                           spec.budget, full),
        "sample_ms_per_sequence": 1000 * sample_seconds / samples,
    }


def measure_baseline(name: str, backbone, short: Budget, full: Budget, sequences, diffusion_steps: int,
                     samples: int, seq_len: int, repeats: int, seed: int) -> dict:
    """One baseline: build it under the short budget, fit it, sample from it."""
    cls = get_registry().get("baseline", name).obj
    options = {cls.steps_option: diffusion_steps} if cls.steps_option else {}  # as the runner sets it
    baseline = cls(backbone, short, seed, **options)
    result, fit_seconds = common.timed(baseline.fit, sequences, progress=False)
    sample_seconds = common.median_seconds(
        lambda: baseline.sample(samples, seq_len, seed, batch_size=samples), repeats)
    return {
        "parameters": sum(baseline.parameter_counts().values()),
        "in_budget": baseline.in_budget,
        "sampling_steps": options.get(cls.steps_option),
        **training_figures(result.steps_done, result.tokens_seen, result.wall_seconds,
                           fit_seconds - result.wall_seconds, short, full),
        "sample_ms_per_sequence": 1000 * sample_seconds / samples,
    }


def table(methods: dict[str, dict], full: Budget) -> str:
    def number(value, fmt: str) -> str:  # tabulate would print a column mixing "-" and floats unformatted
        return "-" if value is None else format(value, fmt)

    rows = []
    for name, m in methods.items():
        meets = "n/a" if m["steps"] == 0 else "PASS" if m["full_train_seconds"] < TARGET_SECONDS else "FAIL"
        rows.append([name, m["parameters"], "yes" if m["in_budget"] else "no (reference)", m["steps"],
                     number(m["train_tokens_per_second"], ",.0f"), m["full_train_seconds"], m["full_setup_seconds"],
                     number(m["sampling_steps"], "d"), m["sample_ms_per_sequence"], meets])
    headers = ["method", "params", "in budget", "steps", "train tokens/s", f"train s ({full.steps} steps)",
               "setup s (full)", "sampling steps", "sample ms/seq", f"< {TARGET_SECONDS:.0f} s"]
    align = ["left", "right", "left"] + ["right"] * (len(headers) - 4) + ["left"]
    return tabulate(rows, headers=headers, floatfmt=".1f", intfmt=",", colalign=align)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--steps", type=int, help="S training steps per method (default 50; --quick: 2)")
    parser.add_argument("--samples", type=int, help="sequences sampled per method (default 16; --quick: 2)")
    parser.add_argument("--sample-len", type=int, help="tokens per sampled sequence (default 64; --quick: 8)")
    parser.add_argument("--repeats", type=int, default=1, help="timed sampling repeats, median taken")
    parser.add_argument("--methods", nargs="+", default=[DIHAL, *BASELINES], choices=[DIHAL, *BASELINES])
    args = parser.parse_args()
    steps = args.steps or (2 if args.quick else 50)
    samples = args.samples or (2 if args.quick else 16)
    sample_len = args.sample_len or (8 if args.quick else 64)

    suite = common.diagnostic_suite()
    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    full = Budget.from_dict({**suite.budget, "seed": args.seed})
    allowance = common.bridge_spec(suite, full).parameter_count(backbone.width)
    full = full.replace(param_allowance=allowance)
    short = full.replace(steps=steps)
    spec = common.bridge_spec(suite, short)
    sequences = training_subset(packed_split(backbone, corpus, "train", short.seq_len), [short], args.seed)
    diffusion_steps = suite.sampling.diffusion_steps

    methods = {}
    for name in args.methods:
        if name == DIHAL:
            methods[name] = measure_dihal(backbone, spec, sequences, full, samples, sample_len, args.repeats,
                                          args.seed)
        else:
            methods[name] = measure_baseline(name, backbone, short, full, sequences, diffusion_steps, samples,
                                             sample_len, args.repeats, args.seed)

    print(f"{backbone.name} on {corpus.name}: {steps} of the diagnostic budget's {full.steps} steps "
          f"({short.batch_size} x {short.seq_len} tokens), allowance {allowance:,} parameters; "
          f"sampling {samples} x {sample_len} tokens in one batch")
    print(table(methods, full))
    meets = all(m["full_train_seconds"] < TARGET_SECONDS for m in methods.values())
    print(f"every method's extrapolated training < {TARGET_SECONDS:.0f} s: {'PASS' if meets else 'FAIL'}")

    common.report("baselines_bench", {
        "methods": methods,
        "target_seconds": TARGET_SECONDS,
        "meets_target": meets,
    }, {"backbone": backbone.name, "corpus": corpus.name, "dihal_layer": DIHAL_LAYER, "bridge": spec.name,
        "bridge_options": spec.options, "budget": short.to_dict(), "full_steps": full.steps,
        "train_sequences": len(sequences), "diffusion_steps": diffusion_steps, "samples": samples,
        "sample_len": sample_len, "repeats": args.repeats, "seed": args.seed, "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
