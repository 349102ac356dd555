"""Where the study runs and where bridge targets come from: the local executor against Ray, and
stored against streamed training states.

(a) A 4-layer sweep (layers 1-4, the diagnostic sweep protocol) run as a geometry-only suite
    (locate, bridge targets, sweep; no methods) in a fresh job store, once with the local
    executor (one process, torch on every core) and once on a local Ray instance with 2 actors
    (one core each): the wall time of the whole run and of its sweep stage. No target: on a
    2-core machine two actors can at best halve the sweep stage; the figure shows how close.
(b) One DiHAL bridge at layer ℓ (3, then 12) trained S steps under the diagnostic budget on
    stored states (the runner's path; their extraction timed apart) and on streamed states
    (``train_bridge_streamed``: layers 1..ℓ run on every batch): seconds per step side by side.
    No target: the streamed step pays ℓ backbone layers per batch, a cost the stored path pays
    once for all bridges that share the extraction.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import common
from tabulate import tabulate

from dihal_bench.config.suite import apply_overrides
from dihal_bench.hybrid.training import (
    bridge_windows,
    packed_split,
    train_bridge,
    train_bridge_streamed,
    training_subset,
    with_states,
)
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.study.executors import make_executor
from dihal_bench.study.runner import run_suite
from dihal_bench.training.budget import Budget


def sweep_suite(quick: bool, seed: int):
    """The diagnostic suite cut to a 4-layer sweep and nothing else (a geometry-only suite)."""
    overrides = {"seeds": f"[{seed}]", "sweep.layers": "[1, 2]" if quick else "[1, 2, 3, 4]",
                 "methods.dihal": "[]", "methods.controls": "[]", "methods.references": "[]",
                 "methods.baselines": "[]", "bridge.steps_axis": "[]"}
    if quick:
        overrides.update({"sweep.budget.steps": "4", "sweep.eval_sequences": "4", "locate.tokens": "256"})
    return apply_overrides(common.diagnostic_suite(), overrides)


def measure_executors(quick: bool, seed: int) -> dict[str, dict]:
    """(a): each executor's record timings for the same suite in its own fresh store."""
    config = sweep_suite(quick, seed)
    figures = {}
    for name, options in (("local", {}), ("ray, 2 actors", {"workers": 2})):
        with tempfile.TemporaryDirectory() as folder:
            executor = make_executor("ray" if options else "local", **options)
            record_path, seconds = common.timed(run_suite, "sweep-bench", config, out_root=Path(folder),
                                                results_dir=Path(folder) / "results", progress=False,
                                                executor=executor)
            timings = json.loads(record_path.read_text())["timings"]
        figures[name] = {"run_seconds": seconds, "sweep_seconds": timings["sweep"]}
    return figures


def measure_targets(quick: bool, seed: int, layers: list[int]) -> dict[int, dict]:
    """(b): seconds per training step of one bridge, stored states against streamed ones."""
    suite = common.diagnostic_suite()
    budget = Budget.from_dict({**suite.budget, "steps": 4 if quick else 50, "seed": seed})
    backbone, corpus = load_backbone(suite.backbone), load_corpus(suite.corpus)
    spec = common.bridge_spec(suite, budget)
    sequences = training_subset(packed_split(backbone, corpus, "train", budget.seq_len), [budget], seed)
    figures = {}
    for layer in layers:
        stored, extract_seconds = common.timed(with_states, backbone, sequences, [layer], False)
        _, stored_stats = train_bridge(backbone, spec, layer, stored, progress=False)
        windows = bridge_windows(backbone, sequences)
        _, streamed_stats = train_bridge_streamed(backbone, spec, layer, windows, progress=False)
        steps = spec.budget.steps
        figures[layer] = {"extract_seconds": extract_seconds,
                          "stored_step_seconds": stored_stats["train_seconds"] / steps,
                          "streamed_step_seconds": streamed_stats["train_seconds"] / steps}
    return figures


def main() -> None:
    args = common.parser(__doc__).parse_args()
    layers = [3] if args.quick else [3, 12]
    executors = measure_executors(args.quick, args.seed)
    targets = measure_targets(args.quick, args.seed, layers)

    local = executors["local"]
    print(tabulate([[name, f"{f['run_seconds']:.1f}", f"{f['sweep_seconds']:.1f}",
                     f"{f['sweep_seconds'] / local['sweep_seconds']:.2f}"] for name, f in executors.items()],
                   headers=["executor", "run s", "sweep stage s", "sweep vs local"]))
    print()
    print(tabulate([[layer, f"{f['extract_seconds']:.2f}", f"{f['stored_step_seconds']:.3f}",
                     f"{f['streamed_step_seconds']:.3f}", f"{f['streamed_step_seconds'] / f['stored_step_seconds']:.2f}"]
                    for layer, f in targets.items()],
                   headers=["layer", "stored: extraction s", "stored s/step", "streamed s/step", "streamed/stored"]))
    common.report("executor_bench", {"executors": executors, "targets": {str(k): v for k, v in targets.items()}},
                  {"quick": args.quick, "seed": args.seed, "layers": layers}, args.json)


if __name__ == "__main__":
    main()
