"""``dihal-bench run``: the whole study as resumable jobs (docs/method.md#suites).

Read top to bottom, :func:`study_seeds` is the study: locate → bridge targets → bridge sweep →
every method (DiHAL at ℓ*, the worst-scored and the oracle layer, controls, references, baselines)
→ the steps axis → metrics → frontiers → latency, the units of :func:`dihal_bench.study.plan.seed_units`. Each
stage is one executor call holding that stage's items *of every seed*, so that a pool of workers
is filled by all seeds at once (latency excepted: it times decodes, one seed at a time, alone); a
stage needs the ones before it. The units themselves live in
``dihal_bench.study.stages``, one module per stage; each is made of jobs keyed by a hash of their
inputs (``dihal_bench.study.jobs``), so an interrupted run restarts where it stopped and gives the
same numbers. The run ends with one sealed record in the results folder.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from dihal_bench.base.provenance import environment
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.config.suite import resolved_config
from dihal_bench.errors import DihalError, interrupted
from dihal_bench.hybrid.sweep import layer_correlations
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.calibration import run_throughput
from dihal_bench.study.compute import stage_compute
from dihal_bench.study.estimate import estimate_line, stage_estimate, unit_seconds
from dihal_bench.study.executors import Executor, Item, LocalExecutor
from dihal_bench.study.first_estimate import first_estimate, kept_line
from dihal_bench.study.identities import metric_names
from dihal_bench.study.metering import MeteredExecutor
from dihal_bench.study.plan import (
    frontier_points,
    method_labels,
    scaled_budget,
    seed_units,
    steps_axis_points,
    steps_label,
)
from dihal_bench.study.preflight import check_suite
from dihal_bench.study.progress import Progress
from dihal_bench.study.records import (
    RECORD_FORMAT,
    metric_description,
    new_record_path,
    record_problem,
    slug,
    write_record,
)
from dihal_bench.study.reporting import report_run
from dihal_bench.study.run import Run
from dihal_bench.study.sample_export import export_beside
from dihal_bench.study.samples import EXAMPLES, read_samples
from dihal_bench.study.seed_study import SeedStudy, plan_bridges
from dihal_bench.study.stages.frontier import frontier_point
from dihal_bench.study.stages.latency import latency_unit
from dihal_bench.study.stages.locate import LOCATE_KEYS, locate_unit
from dihal_bench.study.stages.methods import method_row
from dihal_bench.study.stages.metrics import metrics_unit
from dihal_bench.study.stages.steps_axis import steps_point
from dihal_bench.study.stages.sweep import CORRELATION_TARGETS, sweep_layer
from dihal_bench.study.stages.targets import bridge_targets


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM) during a run, with how far it got: finished jobs stay in the store, so
    the same command resumes from them."""

    def __init__(self, done: int, total: int):
        super().__init__(f"{done} of {total} units done")
        self.done, self.total = done, total


def run_suite(suite: str, config: SuiteConfig, *, out_root: Path = Path("runs"),
              results_dir: Path = Path("runs/results"), progress: bool = True,
              executor: Executor | None = None, report: Callable[[str], None] | None = None,
              calibrate: bool = False, report_to: tuple[str, ...] = (), inexact_remakes: bool = False) -> Path:
    """Run every stage for every seed and write the run record; returns its path. ``executor``
    says where the units of work run (dihal_bench.study.executors; in order in this process by default).
    An "auto" device or dtype is resolved here, once, and the record's config names what ran.
    ``report`` gets the estimate before any work starts, from rates measured on this machine when
    ``calibrate`` (seconds of timed steps; only where the work runs here), else assumed ones. The
    reporters ``report_to`` names get the written record (dihal_bench.study.reporting). ``inexact_remakes``:
    see dihal_bench.study.pruned."""
    executor = executor or LocalExecutor()
    ran_on = environment()  # at the start: the code that runs, not whatever is checked out when it ends
    config = resolved_config(config)
    check_suite(config, folders={"job store": Path(out_root), "results folder": Path(results_dir)},
                here=executor.computes_here, reporters=report_to)
    run = Run(suite, config, out_root, progress, device=executor.driver_device, inexact_remakes=inexact_remakes)
    run.check_inputs()
    plans = {seed: seed_units(config, run.backbone.num_layers) for seed in config.seeds}
    throughput = run_throughput(run, calibrate and executor.computes_here)
    costs = {seed: [unit_seconds(unit, config, None, throughput) for unit in plan] for seed, plan in plans.items()}
    if report is not None:
        report(estimate_line(config, costs, throughput))
    # a resumed run is checked against what it said before its first sitting, not against this one's
    estimate, first_sitting = first_estimate(run.store, suite, config, stage_estimate(plans, costs, throughput))
    if report is not None and not first_sitting:
        report(kept_line(estimate))
    tracker = Progress(plans, desc=f"{suite} ({len(plans)} seed{'s' if len(plans) > 1 else ''})", enabled=progress,
                       costs=costs)
    try:
        return _run_stages(suite, config, run, executor, tracker, results_dir, {
            "environment": ran_on, "estimate": estimate, "report_to": tuple(report_to)})
    except BaseException as exc:
        if not interrupted(exc):
            raise
        tracker.close()
        raise RunInterrupted(tracker.done_units, tracker.total_units) from exc


def _run_stages(suite: str, config: SuiteConfig, run: Run, executor: Executor, tracker: Progress,
                results_dir: Path, started_with: dict) -> Path:
    with run.store.lock(), executor.start(run, tracker):
        started = time.perf_counter()
        metered = MeteredExecutor(executor, started_with["environment"]["git_revision"])
        per_seed = study_seeds(run, metered, list(config.seeds))
        tracker.close()
        tracker.check_complete()
        for i, entry in enumerate(per_seed):
            seconds = tracker.seconds[entry["seed"]]
            # a seed's compute time: the sum of its units' times (seeds share the wall clock)
            per_seed[i] = {"seed": entry["seed"], "units": list(tracker.claimed[entry["seed"]]), **entry,
                           "timings": {**seconds, "total_seconds": sum(seconds.values())}}
        stage_totals: dict[str, float] = {}
        for seconds in tracker.seconds.values():
            for stage, value in seconds.items():
                stage_totals[stage] = stage_totals.get(stage, 0.0) + value
        record = {
            "format": RECORD_FORMAT,
            "suite": suite,
            "backbone": config.backbone,
            "corpus": config.corpus,
            "evaluator": config.evaluator,
            "seeds": list(config.seeds),
            "config": config.to_dict(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": started_with["environment"],
            "timings": {**stage_totals, "total_seconds": time.perf_counter() - started},
            **metered.sections(),  # per stage: how contended the machine was, which revisions did the jobs
            "estimate": started_with["estimate"],
            # relative to the working directory, as the schema says and lm_eval.record reads it
            "jobs": os.path.relpath(run.store.root),
            "metrics": {name: metric_description(get_registry().get("metric", name)) for name in metric_names(config)},
            "per_seed": per_seed,
        }
        record["compute"] = stage_compute(record)  # each stage's FLOPs counted and FLOP/s achieved
        problem = record_problem(json.loads(json.dumps(record, default=str)))
        if problem:  # a bug, not bad input: the record this code writes must follow its schema
            raise AssertionError(f"the run record does not follow its schema: {problem}")
        path = new_record_path(Path(results_dir), f"{slug(suite)}-{slug(config.backbone)}")
        try:
            write_record(path, record, run.store.root)
        except BaseException:
            path.unlink(missing_ok=True)  # the name claimed (empty): no record, whole or half
            raise
        export_beside(path, record, run.store)  # every sample beside the record; a failure only warns
        report_run(path, started_with["report_to"], run.out_root)  # --report-to; a failure only warns
    return path


def study_seeds(run: Run, executor: Executor, seeds: list[int]) -> list[dict]:
    """Every seed's study, one stage at a time, each stage one executor call over all seeds' items;
    the record's ``per_seed`` entries (without units and timings, which the run's progress holds)."""
    config, num_layers = run.config, run.backbone.num_layers
    studies = [SeedStudy(seed) for seed in seeds]

    located = executor.map("locate", locate_unit, [Item("locate", (s.seed,), s.seed) for s in studies])
    for study, found in zip(studies, located, strict=True):
        plan_bridges(run, study, found)

    items, owners = [], []
    for study in studies:
        budgets = study.stage_budgets(config, num_layers)
        for length in sorted({b.seq_len for b in budgets}):
            same_length = [b for b in budgets if b.seq_len == length]
            items.append(Item(f"bridge targets T={length}", (study.seed, study.data_layers, same_length), study.seed))
            owners.append((study, length))
    for (study, length), result in zip(owners, executor.map("targets", bridge_targets, items), strict=True):
        study.targets[length] = result

    rows = each_seed(executor, "sweep", sweep_layer, studies, lambda s: [
        Item(f"sweep layer {i + 1}/{len(s.layers)}", (s.sweep_spec, layer, s.data_layers, s.targets), s.seed)
        for i, layer in enumerate(s.layers)])
    for study, sweep_rows in zip(studies, rows, strict=True):
        study.sweep_rows = sweep_rows
        oracle = min(sweep_rows, key=lambda row: (row["bridge_mse"], row["layer"]))["layer"] if sweep_rows else None
        study.roles["oracle"] = oracle if oracle is not None else study.roles["chosen"]

    labels = method_labels(config)
    made = each_seed(executor, "methods", method_row, studies, lambda s: [
        Item(label, (kind, name, s.roles, s.scaled_spec(scale), scaled_budget(s.budget, scale), s.seed, s.data_layers,
                     s.targets), s.seed)
        for label, kind, name, scale in labels])
    for study, methods in zip(studies, made, strict=True):
        # a scaled row keeps its own budget: the seed's `budget` is the scale-1 one
        study.methods = {label: {**method, "scale": scale,
                                 **({"budget": scaled_budget(study.budget, scale).to_dict()} if scale != 1 else {})}
                         for (label, _, _, scale), method in zip(labels, methods, strict=True)}

    points = each_seed(executor, "steps", steps_point, studies, lambda s: [
        Item(steps_label(k, sampler), (s.methods["dihal-chosen"], s.spec, k, s.seed, s.data_layers, sampler), s.seed)
        for sampler, k in steps_axis_points(config)])
    for study, steps_axis in zip(studies, points, strict=True):
        study.steps_axis = steps_axis

    references = {s.seed: run.reference_texts(config.sampling.samples, config.sampling.seq_len, s.seed)
                  for s in studies}
    scores = each_seed(executor, "metrics", metrics_unit, studies, lambda s: [
        Item(f"metrics {name}", (name, method, references[s.seed], s.seed), s.seed) for name, method in s.methods.items()])
    for study, metrics in zip(studies, scores, strict=True):
        for method, values in zip(study.methods.values(), metrics, strict=True):
            method["metrics"] = values

    frontier = frontier_points(config)
    made = each_seed(executor, "frontier", frontier_point, studies, lambda s: [
        Item(p.unit_label, (p, s.roles, s.spec, s.budget, s.seed, s.data_layers, s.targets, references[s.seed]), s.seed)
        for p in frontier]) if frontier else [[] for _ in studies]  # no frontier: no stage to meter
    for study, points in zip(studies, made, strict=True):
        study.frontier = points

    # one seed at a time: a latency job times decodes, so it must not share the machine with another;
    # of the scale-1 rows alone (a row at another scale is the same network)
    latency_of = {s.seed: executor.map("latency", latency_unit, [
        Item("latency", ({name: m for name, m in s.methods.items() if m["scale"] == 1}, s.roles, s.spec, s.budget,
                         s.seed), s.seed)])[0] for s in studies if s.methods}
    return [seed_entry(run, study, latency_of.get(study.seed, {})) for study in studies]


def each_seed(executor: Executor, stage: str, fn, studies: list[SeedStudy], items_of) -> list[list]:
    """One executor call over every seed's items of a stage; the results split back per seed."""
    per_seed = [items_of(study) for study in studies]
    results = executor.map(stage, fn, [item for items in per_seed for item in items])
    split, start = [], 0
    for items in per_seed:
        split.append(results[start:start + len(items)])
        start += len(items)
    return split


def seed_entry(run: Run, study: SeedStudy, latency: dict) -> dict:
    """The record's ``per_seed`` entry of one finished seed."""
    correlations = {target: layer_correlations(study.located, study.sweep_rows, study.seed, target)
                    for target in CORRELATION_TARGETS}
    for name, method in study.methods.items():
        method["latency"] = latency.get(name)
        method["samples"]["examples"] = read_samples(run.store.resolve(method["samples"]["path"]))[0][:EXAMPLES]
    return {
        "seed": study.seed,
        "locate": {key: study.located[key] for key in LOCATE_KEYS if key in study.located},
        "sweep": {"layers": study.sweep_rows, "budget": study.sweep_spec.budget.to_dict(),
                  "correlations": correlations["bridge_mse"], "correlations_trace": correlations["bridge_mse_trace"]},
        "roles": study.roles,
        "budget": study.budget.to_dict(),
        "methods": study.methods,
        **({"steps_axis": study.steps_axis} if study.steps_axis else {}),
        **({"frontier": study.frontier} if study.frontier else {}),
    }
