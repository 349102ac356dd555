"""Stage 7: decode latency of every method that decodes, timed in one process (one job per seed)."""

from __future__ import annotations

import statistics
import time

from tqdm.auto import tqdm

from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint
from dihal_bench.hybrid.model import HybridLM, intact_control, skip_control
from dihal_bench.hybrid.training import BridgeSpec
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.protocol import baseline_options
from dihal_bench.study.run import Run
from dihal_bench.training.budget import Budget

#: tokens of the warm-up decode before latency is timed: enough to touch every code path
WARM_UP_TOKENS = 8

def latency_unit(run: Run, methods: dict, roles: dict, spec: BridgeSpec, budget: Budget, seed: int) -> dict:
    """The latency job: every method that decodes, timed in one process (measure_latency)."""
    config = run.config
    job = {**run.identity(), "methods": {n: m["samples_job"] for n, m in methods.items()},
           "repeats": config.metrics.latency_repeats, "seed": seed, "protocol": "interleaved"}
    return run.store.run("latency", job, lambda _: measure_latency(run, methods, roles, spec, budget, seed))

def measure_latency(run: Run, methods: dict, roles: dict, spec: BridgeSpec, budget: Budget, seed: int) -> dict:
    """Wall-clock per sequence and per token at batch 1 and at the suite's batch size, and the
    ratio to the intact backbone's own decode in this run.

    One protocol for every method: a short warm-up decode (excluded), then ``repeats`` rounds
    in which every method decodes once per batch size, interleaved (the order rotates each
    round) so that a slow spell of a shared machine falls on all methods alike; the figure is
    the median over rounds. The reference is the method whose baseline is the intact backbone,
    or the backbone measured the same way when the suite has no such method."""
    sampling = run.config.sampling
    repeats = run.config.metrics.latency_repeats
    length, batch = sampling.seq_len, sampling.batch_size
    sizes = sorted({1, batch})
    registry = get_registry()
    timed, reference = {}, None
    for name, method in methods.items():
        if method["kind"] == "reference":  # texts drawn, not decoded: nothing to time
            continue
        if method["kind"] in ("dihal", "control"):
            if "train" in method:  # DiHAL and the regressor control: a trained bridge
                bridge, _ = load_bridge_checkpoint(run.store.resolve(method["train"]["checkpoint"]), run.backbone)
                hybrid = HybridLM(run.backbone, bridge, method["layer"], sink_passthrough=spec.sink_passthrough,
                                  steps=method["sample_steps"])
            else:  # the skip control
                hybrid = skip_control(run.backbone, method["layer"], sink_passthrough=spec.sink_passthrough)
            timed[name] = lambda n, t=length, h=hybrid: h.generate(n, t, seed=seed, batch_size=n)
        else:
            baseline = registry.get("baseline", name).obj(run.backbone, budget, seed, **baseline_options(run.config, name))
            baseline.load(run.store.resolve(method["train"]["model_dir"]))
            timed[name] = lambda n, t=length, b=baseline: b.sample(n, t, seed, batch_size=n)
            if registry.get("baseline", name).obj.intact_backbone:
                reference = name
    if reference is None:
        backbone = intact_control(run.backbone)
        timed[reference := "(intact backbone)"] = lambda n, t=length: backbone.generate(n, t, seed=seed, batch_size=n)
    names = list(timed)
    times: dict[tuple[str, int], list[float]] = {(name, size): [] for name in names for size in sizes}
    # one step per method per round, warm-up included: the job takes minutes and would otherwise
    # show nothing between its start and its end
    with tqdm(total=(repeats + 1) * len(names), desc="latency", unit="decode", disable=not run.progress,
              leave=False) as bar:
        for name in names:  # warm-up: allocations, caches and lazy setup, kept out of the figures
            bar.set_postfix_str(f"warm-up {name}")
            for size in sizes:
                timed[name](size, min(length, WARM_UP_TOKENS))
            bar.update(1)
        for round_ in range(repeats):
            for name in names[round_ % len(names):] + names[:round_ % len(names)]:
                bar.set_postfix_str(f"round {round_ + 1}/{repeats} {name}")
                for size in sizes:
                    started = time.perf_counter()
                    timed[name](size)
                    times[name, size].append(time.perf_counter() - started)
                bar.update(1)
    results = {}
    for name in names:
        values = results[name] = {}
        for size in sizes:
            seconds = statistics.median(times[name, size])
            values[f"batch{size}_seconds_per_sequence"] = seconds / size
            values[f"batch{size}_ms_per_token"] = 1000 * seconds / (size * length)
    for name, values in results.items():
        for size in sizes:
            values[f"batch{size}_ratio_to_backbone"] = (values[f"batch{size}_seconds_per_sequence"]
                                                        / results[reference][f"batch{size}_seconds_per_sequence"])
            # every round too, in round order, each against the reference's decode of the same round:
            # the spread the median hides, which a claim about the sign of the ratio needs
            values[f"batch{size}_ratio_per_round"] = [
                mine / theirs for mine, theirs in zip(times[name, size], times[reference, size])]
    return {"batch_size": batch, "seq_len": length, "repeats": repeats, "reference": reference, **results}
