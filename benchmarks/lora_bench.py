"""Training and sampling cost of the two pretrained rivals, ar-lora and ar2diff-lora, on the
embedded backbone under the diagnostic budget (16 x 64 tokens per step, the diagnostic bridge's
parameter allowance), and what they add to a run of the rivals suite per seed.

Each rival trains S steps (a few: every step runs the whole backbone forward and backward) on
the budget's training sequences. Reported per rival:

- the rank and target modules its allowance chose, and its trainable parameters;
- seconds per training step, wall-clock and CPU (process) time: on a machine shared with
  other work the wall-clock grows with the load, while the CPU seconds of a one-thread run stay
  close to what an idle core takes; and both extrapolated to the budget's steps;
- sampling: n sequences of T tokens in one batch after a tiny warm-up call, seconds per sequence,
  at the suite's diffusion steps for ar2diff-lora (one backbone pass per step that reveals a
  position: min(steps, T) passes);
- the rows' share of a rivals-suite run per seed: training, the suite's samples, and the latency
  stage (a warm-up of 8 tokens at batch 1 and the suite's batch, then ``latency_repeats`` timed
  decodes at each), from the figures above, taking the cost per sequence as independent of
  the batch size (a CPU running the backbone is compute-bound). Target: none (a cost estimate).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import common
from tabulate import tabulate

from dihal_bench.config.suite import resolve_suite
from dihal_bench.hybrid.training import packed_split, training_subset
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.study.runner import WARM_UP_TOKENS
from dihal_bench.training.budget import Budget

RIVALS = ("ar-lora", "ar2diff-lora")


def cpu_timed(fn, *args, **kwargs) -> tuple[object, float, float]:
    """``fn(*args, **kwargs)``, its wall-clock seconds and the process's CPU seconds over it."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - wall, time.process_time() - cpu


def measure(name: str, backbone, short: Budget, sequences, diffusion_steps: int, samples: int, seq_len: int,
            seed: int) -> dict:
    """One rival: build it under the short budget, train it, sample from it."""
    cls = get_registry().get("baseline", name).obj
    options = {cls.steps_option: diffusion_steps} if cls.steps_option else {}  # as the runner sets it
    rival = cls(backbone, short, seed, **options)
    result, fit_wall, fit_cpu = cpu_timed(rival.fit, sequences, progress=False)
    rival.sample(2, min(seq_len, WARM_UP_TOKENS), seed, batch_size=2)  # lazy setup, kept out of the figure
    _, sample_wall, sample_cpu = cpu_timed(rival.sample, samples, seq_len, seed, batch_size=samples)
    passes = min(diffusion_steps, seq_len) if cls.steps_option else seq_len
    return {
        "parameters": sum(rival.parameter_counts().values()),
        "lora": rival.lora_settings(),
        "steps": result.steps_done,
        "step_seconds": result.wall_seconds / result.steps_done,
        # the loop's share of the fit's CPU time: the fit adds only building the data dict
        "step_cpu_seconds": fit_cpu * result.wall_seconds / fit_wall / result.steps_done,
        "losses": result.losses,
        "sampling_steps": options.get(cls.steps_option),
        "samples": samples,
        "sample_len": seq_len,
        "backbone_passes_per_batch": passes,
        "sample_seconds_per_sequence": sample_wall / samples,
        "sample_cpu_seconds_per_sequence": sample_cpu / samples,
    }


def suite_share(figures: dict, full: Budget, suite) -> dict:
    """Seconds a rival adds to one seed of the rivals suite, from wall-clock and from CPU figures."""
    sampling, repeats = suite.sampling, suite.metrics.latency_repeats
    sizes = sorted({1, sampling.batch_size})
    # the timed decodes at each size, plus a warm-up of 8 tokens at each: for ar2diff-lora that is
    # min(steps, 8) passes over 9 positions, less than 8/64 of a decode's 64 passes over 65
    latency_sequences = repeats * sum(sizes) + WARM_UP_TOKENS / sampling.seq_len * sum(sizes)
    shares = {}
    for kind, step, per_sequence in (("wall", "step_seconds", "sample_seconds_per_sequence"),
                                     ("cpu", "step_cpu_seconds", "sample_cpu_seconds_per_sequence")):
        train = figures[step] * full.steps
        draw = figures[per_sequence] * sampling.samples
        latency = figures[per_sequence] * latency_sequences
        shares[kind] = {"train": train, "samples": draw, "latency": latency, "total": train + draw + latency}
    return shares


def table(methods: dict[str, dict], full: Budget) -> str:
    rows = [[name, m["parameters"], f"{m['lora']['targets']} r={m['lora']['rank']}", m["steps"], m["step_seconds"],
             m["step_cpu_seconds"], m["step_seconds"] * full.steps / 60, m["sampling_steps"] or "-",
             m["sample_seconds_per_sequence"], m["sample_cpu_seconds_per_sequence"],
             m["rivals_suite_seconds"]["wall"]["total"] / 60, m["rivals_suite_seconds"]["cpu"]["total"] / 60]
            for name, m in methods.items()]
    headers = ["rival", "params", "adapters", "steps", "s/step", "CPU s/step", f"train min ({full.steps})",
               "sampling steps", "sample s/seq", "CPU s/seq", "suite min/seed", "suite CPU min/seed"]
    return tabulate(rows, headers=headers, floatfmt=".2f", intfmt=",")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--steps", type=int, help="S training steps per rival (default 3; --quick: 1)")
    parser.add_argument("--samples", type=int, help="sequences sampled per rival in one batch (default 16; --quick: 2)")
    parser.add_argument("--sample-len", type=int, help="tokens per sampled sequence (default 64; --quick: 8)")
    parser.add_argument("--methods", nargs="+", default=list(RIVALS), choices=RIVALS)
    parser.add_argument("--merge", nargs="+", type=Path, default=[], metavar="REPORT",
                        help="earlier JSON reports of this script whose rivals join this report (each keeps the "
                             "settings and environment it ran under): one rival per run keeps each run short")
    args = parser.parse_args()
    steps = args.steps or (1 if args.quick else 3)
    samples = args.samples or (2 if args.quick else 16)
    sample_len = args.sample_len or (8 if args.quick else 64)

    suite = resolve_suite("rivals")[1]
    backbone = load_backbone(args.backbone)
    corpus = load_corpus(args.corpus)
    full = Budget.from_dict({**suite.budget, "seed": args.seed})
    allowance = common.bridge_spec(suite, full).parameter_count(backbone.width)
    full = full.replace(param_allowance=allowance)
    short = full.replace(steps=steps, warmup_frac=0.0)
    sequences = training_subset(packed_split(backbone, corpus, "train", short.seq_len), [short], args.seed)
    diffusion_steps = suite.sampling.diffusion_steps

    methods = {}
    for name in args.methods:
        figures = measure(name, backbone, short, sequences, diffusion_steps, samples, sample_len, args.seed)
        figures["rivals_suite_seconds"] = suite_share(figures, full, suite)
        methods[name] = figures
    for path in args.merge:
        earlier = json.loads(path.read_text(encoding="utf-8"))
        measured_in = {key: earlier[key] for key in ("settings", "environment")}
        for name, figures in earlier["figures"]["methods"].items():
            methods.setdefault(name, {**figures, "measured_in": measured_in})

    print(f"{backbone.name} on {corpus.name}: {steps} of the rivals budget's {full.steps} steps "
          f"({short.batch_size} x {short.seq_len} tokens), allowance {allowance:,} parameters; sampling {samples} x "
          f"{sample_len} tokens in one batch; {common.environment()['torch_threads']} torch thread(s)")
    print(table(methods, full))
    common.report("lora_bench", {"methods": methods}, {
        "backbone": backbone.name, "corpus": corpus.name, "budget": short.to_dict(), "full_steps": full.steps,
        "train_sequences": len(sequences), "diffusion_steps": diffusion_steps, "samples": samples,
        "sample_len": sample_len, "suite_sampling": {"samples": suite.sampling.samples,
                                                     "batch_size": suite.sampling.batch_size,
                                                     "seq_len": suite.sampling.seq_len},
        "latency_repeats": suite.metrics.latency_repeats, "seed": args.seed, "quick": args.quick}, args.json)


if __name__ == "__main__":
    main()
