"""Training and sampling cost of the from-scratch rivals of issue 21, ``mdlm`` and ``ar-scratch``,
under the diagnostic matched budget on the embedded backbone.

Each rival trains S steps of the diagnostic budget (16 x 64 tokens a step, its parameter
allowance the diagnostic bridge's size, as in ``dihal-bench run``) on the same training
sequences; the figures come from ``baselines_bench.measure_baseline``, so they read like that
script's. Reported per method:

- seconds per training step (the training loop's wall-clock over its steps) and the loop
  extrapolated to the budget's full steps;
- sampling ms per sequence: n sequences of T tokens in one batch, median of repeats after a
  warm-up, ``mdlm`` with the suite's ``diffusion_steps`` (100 in the diagnostic suite) and
  ``ar-scratch`` one cached forward step per token; for ``mdlm`` also how many of its steps ran
  the denoiser (its cache skips the steps after which no token changed).
"""

from __future__ import annotations

import baselines_bench
import common
from tabulate import tabulate

from dihal_bench.hybrid.training import packed_split, training_subset
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget

RIVALS = ("mdlm", "ar-scratch")


def denoiser_calls(name: str, backbone, budget: Budget, sequences, diffusion_steps: int, samples: int,
                   seq_len: int, seed: int) -> int | None:
    """How many times one sampling run of ``mdlm`` (untrained weights: the count depends on which
    tokens unmask when, not on the weights) calls its denoiser; None for a method without one."""
    if name != "mdlm":
        return None
    cls = get_registry().get("baseline", name).obj
    model = cls(backbone, budget, seed, steps=diffusion_steps)
    model.build_for(sequences)
    model.trained = True  # counting calls only: the samples are not used
    calls = []
    handle = model.parts["denoiser"].register_forward_hook(lambda *_: calls.append(1))
    try:
        model.sample(samples, seq_len, seed, batch_size=samples)
    finally:
        handle.remove()
    return len(calls)


def table(methods: dict[str, dict], full: Budget) -> str:
    rows = [[name, m["parameters"], m["steps"], m["seconds_per_step"], m["full_train_seconds"],
             "-" if m["sampling_steps"] is None else m["sampling_steps"],
             "-" if m["denoiser_calls"] is None else m["denoiser_calls"], m["sample_ms_per_sequence"]]
            for name, m in methods.items()]
    headers = ["method", "params", "steps", "s/step", f"train s ({full.steps} steps)", "sampling steps",
               "denoiser calls", "sample ms/seq"]
    return tabulate(rows, headers=headers, floatfmt=".2f", intfmt=",")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--steps", type=int, help="S training steps per method (default 30; --quick: 2)")
    parser.add_argument("--samples", type=int, help="sequences sampled per method (default 16; --quick: 2)")
    parser.add_argument("--sample-len", type=int, help="tokens per sampled sequence (default 64; --quick: 8)")
    parser.add_argument("--repeats", type=int, default=1, help="timed sampling repeats, median taken")
    parser.add_argument("--methods", nargs="+", default=list(RIVALS), choices=RIVALS)
    args = parser.parse_args()
    steps = args.steps or (2 if args.quick else 30)
    samples = args.samples or (2 if args.quick else 16)
    sample_len = args.sample_len or (8 if args.quick else 64)

    suite = common.diagnostic_suite()
    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    full = Budget.from_dict({**suite.budget, "seed": args.seed})
    allowance = common.bridge_spec(suite, full).parameter_count(backbone.width)
    full = full.replace(param_allowance=allowance)
    short = full.replace(steps=steps)
    sequences = training_subset(packed_split(backbone, corpus, "train", short.seq_len), [short], args.seed)
    diffusion_steps = suite.sampling.diffusion_steps

    methods = {}
    for name in args.methods:
        figures = baselines_bench.measure_baseline(name, backbone, short, full, sequences, diffusion_steps, samples,
                                                   sample_len, args.repeats, args.seed)
        # their setup (the vocabulary, the sizing) does not grow with the training sequences as
        # baselines_bench's extrapolation assumes for backbone features
        figures.pop("full_setup_seconds")
        figures["seconds_per_step"] = figures["loop_seconds"] / figures["steps"]
        figures["denoiser_calls"] = denoiser_calls(name, backbone, short, sequences, diffusion_steps, samples,
                                                   sample_len, args.seed)
        methods[name] = figures

    print(f"{backbone.name} on {corpus.name}: {steps} of the diagnostic budget's {full.steps} steps "
          f"({short.batch_size} x {short.seq_len} tokens), allowance {allowance:,} parameters; "
          f"sampling {samples} x {sample_len} tokens in one batch")
    print(table(methods, full))
    common.report("rivals_bench", {"methods": methods},
                  {"backbone": backbone.name, "corpus": corpus.name, "budget": short.to_dict(), "full_steps": full.steps,
                   "train_sequences": len(sequences), "diffusion_steps": diffusion_steps, "samples": samples,
                   "sample_len": sample_len, "repeats": args.repeats, "seed": args.seed, "quick": args.quick},
                  args.json)


if __name__ == "__main__":
    main()
