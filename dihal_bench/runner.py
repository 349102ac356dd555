"""``dihal-bench run``: the whole study as resumable jobs (docs/method.md#suites).

Per seed: locate → bridge targets → bridge sweep → DiHAL at ℓ*, the worst-scored and the
oracle layer under the matched budget → every baseline under the same budget → samples from
every method → metrics → latency, in the order of :func:`dihal_bench.plan.seed_units`. Each
unit is made of jobs keyed by a hash of their inputs (``dihal_bench.jobs``), so an interrupted
run restarts where it stopped and gives the same numbers. The run ends with one record in the
results folder (``runs/results/`` by default).

The units of a stage do not depend on each other, so :func:`run_seed` hands each stage to an
executor (``dihal_bench.executors``): in order in this process by default, or in parallel on
Ray actors. A unit is a module-level function taking ``(run, *args)`` so that it can be shipped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import torch
from safetensors.torch import load_file
from tqdm.auto import tqdm

from dihal_bench.backbone import Backbone, load_backbone
from dihal_bench.bridge import HiddenStateBridge
from dihal_bench.bridge_io import load_bridge_checkpoint, save_bridge_checkpoint
from dihal_bench.bridge_training import (
    BRIDGE_PROTOCOL,
    BridgeSpec,
    SplitTensors,
    bridge_windows,
    evaluate_layer,
    packed_split,
    train_bridge,
    train_bridge_streamed,
    training_subset,
    validation_subset,
    with_states,
)
from dihal_bench.budget import Budget
from dihal_bench.corpus import load_corpus
from dihal_bench.errors import DihalError
from dihal_bench.executors import Executor, Item, LocalExecutor
from dihal_bench.geometry import check_drop_top
from dihal_bench.hybrid import HybridLM, intact_control, skip_control
from dihal_bench.jobs import JobStore, spec_hash
from dihal_bench.locate import LocateConfig, locate
from dihal_bench.mapped import map_safetensors
from dihal_bench.metrics import MetricContext, SampleSet
from dihal_bench.plan import (
    Unit,
    auto_sweep_layers,
    budget_sections,
    seed_units,
    steps_axis_points,
    steps_label,
)
from dihal_bench.plugins import get_registry
from dihal_bench.preflight import check_suite
from dihal_bench.protocol import bridge_spec, matched_budget, section_budget
from dihal_bench.provenance import environment
from dihal_bench.records import (
    RECORD_FORMAT,
    metric_description,
    record_problem,
    slug,
    write_record,
    write_safetensors_atomic,
    write_text_atomic,
)
from dihal_bench.references import held_out_windows, unigram_samples
from dihal_bench.sampling import special_ids
from dihal_bench.suite_config import SuiteConfig
from dihal_bench.sweep import check_layers, layer_correlations


class Run:
    """One suite run: the resolved config, the job store, and lazily loaded models and data.

    ``device`` loads the models elsewhere than the suite's device (and without its device_map):
    a Ray driver loads them on the CPU, a Ray actor on the one GPU Ray gave it."""

    def __init__(self, suite: str, config: SuiteConfig, out_root: Path, progress: bool = True,
                 device: str | None = None):
        self.suite, self.config, self.progress, self.device = suite, config, progress, device
        self.out_root = Path(out_root)
        self.store = JobStore(self.out_root / suite / "jobs")
        self.timings: dict[str, float] = {}
        self._valid_states: dict[int, SplitTensors] = {}
        self.targets: dict[int, dict] = {}  # the bridge-targets job's result, by sequence length
        self.units: list[Unit] = []  # this seed's plan (dihal_bench.plan.seed_units)
        self.done: list[str] = []  # the labels of the units done so far, in order
        self.bar: tqdm | None = None  # the whole seed's progress, one step per unit of work

    # -- lazily loaded, shared by the jobs that need them ---------------------------------------
    @cached_property
    def backbone(self) -> Backbone:
        return load_backbone(self.config.backbone, **self._load_options())

    @cached_property
    def evaluator(self) -> Backbone:
        if self.config.evaluator == self.config.backbone:
            return self.backbone
        return load_backbone(self.config.evaluator, **self._load_options())

    @cached_property
    def corpus(self):
        return load_corpus(self.config.corpus)

    def _load_options(self) -> dict:
        options = {"device": self.device or self.config.device, "dtype": self.config.dtype}
        if self.config.device_map and self.device is None:
            options["device_map"] = self.config.device_map
        return options

    def identity(self) -> dict:
        """What every job depends on: the data and the backbone."""
        return {"backbone": self.config.backbone, "corpus": self.config.corpus}

    def next_units(self, labels: list[str]) -> list[Unit]:
        """The plan's next units, which must be ``labels``: the runner never leaves its plan."""
        expected = self.units[len(self.done):len(self.done) + len(labels)]
        if [unit.label for unit in expected] != list(labels):
            raise AssertionError(f"the runner left its plan: doing {labels}, planned {expected}")
        return expected

    def timed(self, label: str, fn, *args, **kwargs):
        """Run the plan's next unit of work (which must be ``label``), adding its wall time to its
        stage and advancing the run's bar."""
        [expected] = self.next_units([label])
        if self.bar is not None:
            self.bar.set_postfix_str(label)
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings[expected.stage] = self.timings.get(expected.stage, 0.0) + time.perf_counter() - started
            self.done.append(label)
            if self.bar is not None:
                self.bar.update(1)

    # -- data -------------------------------------------------------------------------------------
    def check_inputs(self) -> None:
        """What can only be checked with the backbone and corpus loaded, before any job runs:
        explicit sweep layers exist, locate's tokens and dropped channels fit the validation split
        and the width, and the training split can feed every budget."""
        self.corpus  # built first: a missing corpus path is refused before the models load
        locate = self.config.locate
        check_drop_top(locate.drop_top, self.backbone.width)
        windows = len(packed_split(self.backbone, self.corpus, "validation", locate.seq_len))
        if locate.tokens > windows * (locate.seq_len - 1):
            raise DihalError(f"locate.tokens={locate.tokens} exceeds the {windows * (locate.seq_len - 1)} token "
                             f"positions of the validation split ({windows} windows of {locate.seq_len} tokens)")
        if self.config.sweep.layers != "auto":
            check_layers(self.backbone, list(self.config.sweep.layers))
        for section in budget_sections(self.config, self.backbone.num_layers):
            budget = section_budget(self.config, section, seed=0)
            budget.check_fits(len(packed_split(self.backbone, self.corpus, "train", budget.seq_len)))

    def train_sequences(self, budget: Budget, seed: int) -> torch.Tensor:
        """The training sequences a budget draws: a prefix of the seed's permutation of the
        training split, the same prefix the bridge-targets job stores."""
        packed = packed_split(self.backbone, self.corpus, "train", budget.seq_len)
        return training_subset(packed, [budget], seed)[:budget.distinct_sequences]

    def train_states(self, budget: Budget, layer: int) -> SplitTensors:
        """The bridge windows of the training sequences a budget draws, with the bridge's condition
        (h_0) and target (h_layer), from the bridge-targets job: its files memory-mapped, so that
        training, which reads a batch of rows at a time, does not hold a split's states in memory."""
        stored = self.targets[budget.seq_len]
        count = budget.distinct_sequences
        sequences = load_file(self.store.resolve(stored["sequences"]))["sequences"][:count]
        states = {at: map_safetensors(self.store.resolve(stored["layers"][str(at)]))["states"][:count]
                  for at in (0, layer)}
        return SplitTensors(sequences, states)

    def train_bridge(self, spec: BridgeSpec, layer: int, checkpoint: Path) -> tuple[HiddenStateBridge, dict]:
        """Train ``spec``'s bridge for ``layer`` on the seed's training windows: on the states the
        bridge-targets job stored, or, with ``bridge.targets = "streamed"``, on states the frozen
        layers 1..ℓ compute for each batch (nothing stored; memory bounded by the batch)."""
        if self.config.bridge.streams_targets:
            windows = bridge_windows(self.backbone, self.train_sequences(spec.budget, spec.budget.seed))
            return train_bridge_streamed(self.backbone, spec, layer, windows, checkpoint, self.progress)
        return train_bridge(self.backbone, spec, layer, self.train_states(spec.budget, layer), checkpoint,
                            self.progress)

    def valid_states(self, seq_len: int, layer: int, data_layers: list[int]) -> SplitTensors:
        """The validation windows bridgeability reads (all of them, or the seeded
        ``sweep.bridgeability_windows``; the LM measures take a seeded subset of these) with
        their states: at every bridge layer of the seed (``data_layers``) from one pass that all
        the seed's jobs share, or, when targets are streamed, at ``layer`` alone, so that memory
        holds one layer's states and the pass stops at ℓ."""
        layers = [layer] if self.config.bridge.streams_targets else data_layers
        cache = self._valid_states
        if seq_len not in cache or not set(layers) <= set(cache[seq_len].states):
            sequences = validation_subset(packed_split(self.backbone, self.corpus, "validation", seq_len),
                                          self.config.sweep.bridgeability_windows)
            cache[seq_len] = with_states(self.backbone, sequences, layers, self.progress)
        return cache[seq_len]

    def held_out_texts(self, split: str, n: int, seq_len: int, seed: int) -> tuple[list[str], torch.Tensor]:
        """Up to ``n`` windows of ``seq_len`` backbone tokens from a held-out split, a seeded random
        subset (references.held_out_windows), decoded: (texts, token ids)."""
        windows = packed_split(self.backbone, self.corpus, split, seq_len)
        picked = held_out_windows(windows, min(n, len(windows)), seed, what=split)
        return self.backbone.tokenizer.batch_decode(picked, skip_special_tokens=True), picked

    def reference_texts(self, n: int, seq_len: int, seed: int) -> list[str]:
        """MAUVE's references (its P side): up to ``n`` test-split windows, a seeded subset.
        The human reference row reads the validation split, so the two never share a window."""
        return self.held_out_texts("test", n, seq_len, seed)[0]


def run_suite(suite: str, config: SuiteConfig, *, out_root: Path = Path("runs"),
              results_dir: Path = Path("runs/results"), progress: bool = True,
              executor: Executor | None = None) -> Path:
    """Run every stage for every seed and write the run record; returns its path. ``executor``
    says where the units of work run (dihal_bench.executors; in order in this process by default)."""
    executor = executor or LocalExecutor()
    check_suite(config, folders={"job store": Path(out_root), "results folder": Path(results_dir)},
                here=executor.computes_here)
    run = Run(suite, config, out_root, progress, device=executor.driver_device)
    run.check_inputs()
    with run.store.lock(), executor.start(run):
        started = time.perf_counter()
        per_seed = []
        for seed in tqdm(config.seeds, desc=f"suite {suite}", unit="seed",
                         disable=not progress or len(config.seeds) < 2):
            before, seed_started = dict(run.timings), time.perf_counter()
            per_seed.append(run_seed(run, seed, executor))
            # this seed's share of the stage times: what a per-seed cost is read from (a resumed
            # run's jobs found finished cost close to nothing)
            timings = {stage: seconds - before.get(stage, 0.0) for stage, seconds in run.timings.items()}
            per_seed[-1]["timings"] = {**timings, "total_seconds": time.perf_counter() - seed_started}
        record = {
            "format": RECORD_FORMAT,
            "suite": suite,
            "backbone": config.backbone,
            "corpus": config.corpus,
            "evaluator": config.evaluator,
            "seeds": list(config.seeds),
            "config": config.to_dict(),
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(),
            "timings": {**run.timings, "total_seconds": time.perf_counter() - started},
            # relative to the working directory, as the schema says and lm_eval.record reads it
            "jobs": os.path.relpath(run.store.root),
            "metrics": {name: metric_description(get_registry().get("metric", name)) for name in metric_names(config)},
            "per_seed": per_seed,
        }
        problem = record_problem(json.loads(json.dumps(record, default=str)))
        if problem:  # a bug, not bad input: the record this code writes must follow its schema
            raise AssertionError(f"the run record does not follow its schema: {problem}")
        path = _new_record_path(Path(results_dir), f"{slug(suite)}-{slug(config.backbone)}")
        write_record(path, record, run.store.root)
    return path


def _new_record_path(folder: Path, stem: str) -> Path:
    """A record name no other run has taken: the time to the second, then -2, -3, ... if two runs
    finish within one second (claimed with O_EXCL, so two processes never pick the same name)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = folder / f"{stem}-{stamp}{'' if attempt == 1 else f'-{attempt}'}.json"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            continue
    raise DihalError(f"cannot find a free record name for {stem} in {folder}")


#: what the record keeps of locate's output (the per-layer values of every preprocessing, the
#: top-channel shares and the agreement with depth; not the environment, which the record has)
LOCATE_KEYS = ("layers", "score", "chosen_layer", "proxies", "preprocessing", "tokens_sampled", "timings",
               "depth_spearman", "variants", "drop_top", "dropped_channels", "top_channel_share", "top_channel")
#: the sweep's bridgeability measures the geometry is tested against: each dimension standardised,
#: and in locate's ``trace`` metric, where the dimensions weigh as they do for the proxies
CORRELATION_TARGETS = ("bridge_mse", "bridge_mse_trace")
#: the bridge plugin the one-step regressor control trains (docs/method.md#controls)
REGRESSOR_BRIDGE = "regressor"
#: what a point of the sampling-steps axis keeps of the bridge's validation measures
STEPS_AXIS_KEYS = ("bridge_mse", "bridge_mse_trace", "bridge_r2", "hybrid_ppl", "kl_to_backbone")
#: the suite's metrics settings that change metric values, handed to every metric (MetricContext)
METRIC_CONTEXT_KEYS = ("max_length", "min_valid", "mauve_bootstrap")
#: tokens of the warm-up decode before latency is timed: enough to touch every code path
WARM_UP_TOKENS = 8
#: sample texts per method kept in the record, for pages that show a few without the job store
EXAMPLES = 5


def eval_identity(config: SuiteConfig) -> dict:
    """What the validation measurements of a bridge job depend on: which windows each measure reads."""
    return {"eval_sequences": config.sweep.eval_sequences, "eval_subset": "seeded",
            "bridgeability_windows": config.sweep.bridgeability_windows}


def targets_identity(config: SuiteConfig) -> dict:
    """What a bridge-training job adds to its key for how its targets came: streamed states equal
    the stored ones only up to float rounding (another batch composition through the backbone), so
    a streamed bridge is another job; the stored path keeps the keys it always had."""
    return {"targets": "streamed"} if config.bridge.streams_targets else {}


def metric_names(config: SuiteConfig) -> list[str]:
    return [m for m in config.metrics.names if m != "mauve" or config.metrics.mauve]


def run_seed(run: Run, seed: int, executor: Executor | None = None) -> dict:
    """One seed's study, stage by stage through ``executor``; the record's ``per_seed`` entry.

    Stages, each a list of items independent of each other, each stage needing the ones before:
    locate → bridge targets (one per sequence length) → sweep layers → methods (every DiHAL role,
    control, reference and baseline, each with its own train → sample chain) → steps-axis points
    (DiHAL at ℓ* with other K, under each of the steps axis's samplers) → each method's metrics →
    latency (one item: it times decodes)."""
    executor = executor or LocalExecutor().start(run)
    config = run.config
    explicit = config.sweep.layers
    run.units, run.done = seed_units(config, run.backbone.num_layers), []
    run.bar = tqdm(total=len(run.units), desc=f"{run.suite} seed {seed}", unit="unit", disable=not run.progress)
    [located] = executor.map("locate", locate_unit, [Item("locate", (seed,))])
    score = dict(zip(located["layers"], located["score"], strict=True))
    chosen = located["chosen_layer"]
    worst = min(located["layers"], key=lambda layer: (score[layer], layer))
    # every DiHAL role's layer has a sweep row: ℓ* and the worst-scored layer join an automatic sweep
    layers = list(explicit) if explicit != "auto" else auto_sweep_layers(run.backbone.num_layers, {chosen, worst},
                                                                         config.sweep.count)
    sweep_spec = bridge_spec(config, "sweep.budget", seed)
    budget = matched_budget(config, seed, run.backbone.width)
    spec = bridge_spec(config, "budget", seed)
    data_layers = sorted({*layers, chosen, worst})
    by_section = {"sweep.budget": sweep_spec.budget, "budget": spec.budget}
    budgets = [by_section[section] for section in budget_sections(config, run.backbone.num_layers,
                                                                      bridge_targets=True)]
    lengths = sorted({b.seq_len for b in budgets})
    targets = executor.map("targets", bridge_targets, [
        Item(f"bridge targets T={length}", (seed, data_layers, [b for b in budgets if b.seq_len == length]))
        for length in lengths])
    run.targets = dict(zip(lengths, targets, strict=True))
    sweep_rows = executor.map("sweep", sweep_layer, [
        Item(f"sweep layer {i + 1}/{len(layers)}", (sweep_spec, layer, data_layers)) for i, layer in enumerate(layers)])
    correlations = {target: layer_correlations(located, sweep_rows, seed, target) for target in CORRELATION_TARGETS}

    roles = {
        "chosen": chosen,
        "worst": worst,
        "oracle": min(sweep_rows, key=lambda row: (row["bridge_mse"], row["layer"]))["layer"] if sweep_rows else chosen,
    }
    rows = ([(f"dihal-{role}", "dihal", role) for role in config.methods.dihal]
            + [(f"control-{name}", "control", name) for name in config.methods.controls]
            + [(f"reference-{name}", "reference", name) for name in config.methods.references]
            + [(name, "baseline", name) for name in config.methods.baselines])
    made = executor.map("methods", method_row, [Item(label, (kind, name, roles, spec, budget, seed, data_layers))
                                                for label, kind, name in rows])
    methods = {label: method for (label, _, _), method in zip(rows, made, strict=True)}
    steps_axis = executor.map("steps", steps_point, [
        Item(steps_label(k, sampler), (methods["dihal-chosen"], spec, k, seed, data_layers, sampler))
        for sampler, k in steps_axis_points(config)])

    references = run.reference_texts(config.sampling.samples, config.sampling.seq_len, seed)
    scores = executor.map("metrics", metrics_unit, [Item(f"metrics {name}", (name, method, references, seed))
                                                     for name, method in methods.items()])
    for method, metrics in zip(methods.values(), scores, strict=True):
        method["metrics"] = metrics
    latency = {} if not methods else executor.map("latency", latency_unit, [
        Item("latency", (methods, roles, spec, budget, seed))])[0]
    for name, method in methods.items():
        method["latency"] = latency.get(name)
        method["samples"]["examples"] = read_samples(run.store.resolve(method["samples"]["path"]))[0][:EXAMPLES]
    run.bar.close()
    if run.done != [u.label for u in run.units]:
        raise AssertionError(f"the runner did {run.done}, planned {[u.label for u in run.units]}")
    return {
        "seed": seed,
        "units": list(run.done),
        "locate": {key: located[key] for key in LOCATE_KEYS if key in located},
        "sweep": {"layers": sweep_rows, "budget": sweep_spec.budget.to_dict(),
                  "correlations": correlations["bridge_mse"], "correlations_trace": correlations["bridge_mse_trace"]},
        "roles": roles,
        "budget": budget.to_dict(),
        "methods": methods,
        **({"steps_axis": steps_axis} if steps_axis else {}),
    }


# -- the units of work: module-level functions of (run, *args), each a job or a chain of jobs ----------


def locate_unit(run: Run, seed: int) -> dict:
    """Locate's per-layer geometry and ℓ*."""
    settings = run.config.locate
    # "sampler" names how locate picks its N tokens, so jobs of the older whole-split sampler are not reused
    spec = {**run.identity(), **settings.to_dict(), "seed": seed, "sampler": "fewest-sequences"}
    return run.store.run("locate", spec, lambda _: locate(run.backbone, run.corpus, LocateConfig(
        tokens=settings.tokens, seq_len=settings.seq_len, seed=seed, proxies=settings.proxies,
        preprocessing=settings.preprocessing, variants=settings.variants, drop_top=settings.drop_top), run.progress))


def bridge_targets(run: Run, seed: int, layers: list[int], same_length: list[Budget]) -> dict:
    """The bridge-targets job of one sequence length: every budget of that length draws a prefix of
    one seeded subset of the training split; its hidden states at ``layers`` (and the embedding
    output) are computed once and stored as safetensors, so a killed run does not redo them. The
    result becomes ``run.targets[length]``, which :meth:`Run.train_states` reads."""
    length = same_length[0].seq_len
    spec = {**run.identity(), "seq_len": length, "layers": sorted(layers), "seed": seed,
            "budgets": [b.to_dict() for b in same_length], "windows": BRIDGE_PROTOCOL}

    def work(folder: Path) -> dict:
        packed = packed_split(run.backbone, run.corpus, "train", length)
        sequences = training_subset(packed, same_length, seed)
        states = with_states(run.backbone, sequences, layers, run.progress)
        write_safetensors_atomic(folder / "sequences.safetensors", {"sequences": states.sequences.contiguous()})
        files = {}
        for layer, tensor in states.states.items():
            write_safetensors_atomic(folder / f"layer-{layer}.safetensors", {"states": tensor.contiguous()})
            files[str(layer)] = run.store.relative(folder / f"layer-{layer}.safetensors")
        return {"sequences": run.store.relative(folder / "sequences.safetensors"), "layers": files,
                "count": len(sequences)}

    return run.store.run("bridge-targets", spec, work)


def method_row(run: Run, kind: str, name: str, roles: dict, spec: BridgeSpec, budget: Budget, seed: int,
               data_layers: list[int]) -> dict:
    """One row of the methods table: a DiHAL role, a control at ℓ*, a reference or a baseline."""
    if kind == "dihal":
        return dihal_method(run, spec, budget, roles[name], seed, data_layers)
    if kind == "control":
        return control_method(run, name, spec, budget, roles["chosen"], seed, data_layers)
    if kind == "reference":
        return reference_method(run, name, budget, seed)
    return baseline_method(run, name, budget, seed)


def metrics_unit(run: Run, name: str, method: dict, references: list[str], seed: int) -> dict:
    """The metrics job of one method's samples."""
    config = run.config
    spec = {"samples": method["samples_job"], "evaluator": config.evaluator, "metrics": metric_names(config),
            "seed": seed, "references": "seeded test windows",
            **{k: getattr(config.metrics, k) for k in METRIC_CONTEXT_KEYS}}
    return run.store.run("metrics", spec, lambda _: compute_metrics(run, name, method, references, seed))


def latency_unit(run: Run, methods: dict, roles: dict, spec: BridgeSpec, budget: Budget, seed: int) -> dict:
    """The latency job: every method that decodes, timed in one process (measure_latency)."""
    config = run.config
    job = {**run.identity(), "methods": {n: m["samples_job"] for n, m in methods.items()},
           "repeats": config.metrics.latency_repeats, "seed": seed, "protocol": "interleaved"}
    return run.store.run("latency", job, lambda _: measure_latency(run, methods, roles, spec, budget, seed))


def sweep_layer(run: Run, spec: BridgeSpec, layer: int, data_layers: list[int]) -> dict:
    """Train and evaluate the sweep's bridge for ``layer`` under the sweep's fixed protocol."""
    config = run.config
    job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer,
           **eval_identity(config), **targets_identity(config)}

    def work(folder: Path) -> dict:
        bridge, stats = run.train_bridge(spec, layer, folder / "checkpoint")
        valid = run.valid_states(spec.budget.seq_len, layer, data_layers)
        return {"layer": layer, **stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid,
                                                          lm_windows=config.sweep.eval_sequences)}

    return run.store.run("sweep-layer", job, work)


def dihal_method(run: Run, spec: BridgeSpec, budget: Budget, layer: int, seed: int, data_layers: list[int],
                 kind: str = "dihal") -> dict:
    """DiHAL at ``layer`` under the matched budget: train, evaluate, sample. ``spec`` names the
    bridge; the one-step regressor control comes through here too (``kind`` "control")."""
    config = run.config
    train_job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer, **eval_identity(config),
                 **targets_identity(config)}

    def train_work(folder: Path) -> dict:
        budget.check_allowance({"bridge": spec.parameter_count(run.backbone.width)}, name=f"DiHAL bridge (layer {layer})")
        bridge, stats = run.train_bridge(spec, layer, folder / "checkpoint")
        save_bridge_checkpoint(bridge, spec.name, layer, run.backbone.name, folder / "bridge")
        valid = run.valid_states(spec.budget.seq_len, layer, data_layers)
        return {**stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid,
                                          lm_windows=config.sweep.eval_sequences),
                "checkpoint": run.store.relative(folder / "bridge")}

    trained = run.store.run("dihal-train", train_job, train_work)

    def sample_work(folder: Path) -> dict:
        bridge, _ = load_bridge_checkpoint(run.store.resolve(trained["checkpoint"]), run.backbone, layer=layer)
        hybrid = HybridLM(run.backbone, bridge, layer, sink_passthrough=spec.sink_passthrough,
                          steps=spec.sample_steps)
        return write_samples(run, folder, draw_samples(run, hybrid, seed))

    sample_job = {"train": train_job, **sampling_identity(config), "seed": seed}
    samples = run.store.run("samples", sample_job, sample_work)
    return {"kind": kind, "layer": layer, "in_budget": True, "train": trained, "bridge": spec.name,
            "sample_steps": spec.sample_steps, "parameters": {"bridge": trained["parameters"]}, "samples": samples,
            "train_job": _hash("dihal-train", train_job), "samples_job": _hash("samples", sample_job)}


def control_method(run: Run, name: str, spec: BridgeSpec, budget: Budget, layer: int, seed: int,
                   data_layers: list[int]) -> dict:
    """A control at ℓ* (docs/method.md#controls). ``skip``: the upper stack fed h_0, no bridge
    and nothing trained. ``regressor``: the suite's bridge network trained under the matched
    budget to map h_0 to h_ℓ in one step, without diffusion."""
    if name == "regressor":
        regressor = dataclasses.replace(spec, name=REGRESSOR_BRIDGE, options=dict(spec.options), sample_steps=None)
        return dihal_method(run, regressor, budget, layer, seed, data_layers, kind="control")

    def sample_work(folder: Path) -> dict:
        skip = skip_control(run.backbone, layer, sink_passthrough=spec.sink_passthrough)
        return write_samples(run, folder, draw_samples(run, skip, seed))

    sample_job = {**run.identity(), "control": name, "layer": layer, "sink_passthrough": spec.sink_passthrough,
                  **sampling_identity(run.config), "seed": seed}
    samples = run.store.run("samples", sample_job, sample_work)
    return {"kind": "control", "layer": layer, "in_budget": False, "parameters": {}, "samples": samples,
            "samples_job": _hash("samples", sample_job)}


def reference_method(run: Run, name: str, budget: Budget, seed: int) -> dict:
    """A reference row that trains nothing (docs/method.md#references). ``unigram``: i.i.d.
    draws from the training split's unigram distribution, special tokens never drawn (the
    floor). ``human``: held-out validation windows (the ceiling), scored as if generated."""
    sampling = run.config.sampling
    count, length = sampling.samples, sampling.seq_len

    def work(folder: Path) -> dict:
        if name == "unigram":
            train = packed_split(run.backbone, run.corpus, "train", budget.seq_len)
            ids = unigram_samples(train, count, length, seed, banned=special_ids(run.backbone.tokenizer))
        else:
            ids = run.held_out_texts("validation", count, length, seed)[1]
        return write_samples(run, folder, ids)

    sample_job = {**run.identity(), "reference": name, "samples": count, "seq_len": length, "seed": seed,
                  **({"train_seq_len": budget.seq_len} if name == "unigram" else {})}
    samples = run.store.run("samples", sample_job, work)
    return {"kind": "reference", "in_budget": False, "parameters": {}, "samples": samples,
            "samples_job": _hash("samples", sample_job)}


def steps_point(run: Run, method: dict, spec: BridgeSpec, steps: int, seed: int, data_layers: list[int],
                sampler: str | None = None) -> dict:
    """DiHAL at ℓ* with the same weights sampled in ``steps`` steps with the update rule
    ``sampler`` (None: the suite's): bridgeability and hybrid PPL on the validation windows, and
    the Gen.PPL of samples drawn with that K. The point records the sampler it used; its job key
    names the sampler only where it is not the suite's, so the suite's own points keep theirs."""
    layer, config = method["layer"], run.config
    suite_sampler = getattr(spec.build(run.backbone.width), "sampler", None)
    if sampler is not None and suite_sampler is None:
        raise DihalError(f"bridge {spec.name!r} has no sampler option, so bridge.steps_axis_samplers cannot "
                         f"put sampler {sampler!r} on the steps axis")
    other = sampler is not None and sampler != suite_sampler
    at_steps = dataclasses.replace(spec, sample_steps=steps)
    job = {"train": method["train_job"], "steps": steps, **eval_identity(config), **sampling_identity(config),
           "seed": seed, "evaluator": config.evaluator, "max_length": config.metrics.max_length,
           **({"sampler": sampler} if other else {})}

    def work(folder: Path) -> dict:
        bridge, _ = load_bridge_checkpoint(run.store.resolve(method["train"]["checkpoint"]), run.backbone, layer=layer)
        if other:  # the same weights; the update rule is a sampling default (docs/method.md#bridge)
            bridge.sampler = sampler
        valid = run.valid_states(spec.budget.seq_len, layer, data_layers)
        # the skip control does not depend on K: its perplexity is the sweep's
        quality = evaluate_layer(run.backbone, bridge, layer, at_steps, valid,
                                 lm_windows=config.sweep.eval_sequences, skip=False)
        hybrid = HybridLM(run.backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=steps)
        ids = draw_samples(run, hybrid, seed)
        texts = run.backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)
        name = f"K={steps}" + (f" {sampler}" if other else "")
        samples = SampleSet(method=name, texts=texts, token_ids=ids.tolist())
        scored = compute_named_metrics(run, f"DiHAL {name}", samples, [], seed, ["gen_ppl"])
        return {"steps": steps, "layer": layer, **{k: quality[k] for k in STEPS_AXIS_KEYS if k in quality},
                "gen_ppl": scored.get("gen_ppl")}

    # outside the job: points stored before samplers were recorded get it too
    return {**run.store.run("steps-point", job, work), "sampler": sampler if other else suite_sampler}


def baseline_method(run: Run, name: str, budget: Budget, seed: int) -> dict:
    sampling = run.config.sampling
    cls = get_registry().get("baseline", name).obj
    options = baseline_options(run, name)
    # options that only shape sampling are in the sample job, so that changing them re-samples
    # the trained model rather than training it again
    sampling_only = {cls.steps_option, *cls.token_sampling_options}
    train_job = {**run.identity(), "baseline": name, "budget": budget.to_dict(),
                 "options": {k: v for k, v in options.items() if k not in sampling_only}}

    def build():
        return cls(run.backbone, budget, seed, **options)

    def train_work(folder: Path) -> dict:
        baseline = build()
        result = baseline.fit(run.train_sequences(budget, seed), checkpoint_dir=folder / "checkpoint", progress=run.progress)
        baseline.save(folder / "model")
        return {"parameters": baseline.parameter_counts(), "steps": result.steps_done,
                "tokens_seen": result.tokens_seen, "train_seconds": result.wall_seconds,
                "final_loss": (sum(result.losses[-10:]) / len(result.losses[-10:])) if result.losses else None,
                "sampling_options": baseline.sampling_options(), "in_budget": baseline.in_budget,
                "model_dir": run.store.relative(folder / "model")}

    trained = run.store.run("baseline-train", train_job, train_work)

    def sample_work(folder: Path) -> dict:
        baseline = build()
        baseline.load(run.store.resolve(trained["model_dir"]))
        ids = baseline.sample(sampling.samples, sampling.seq_len, seed, batch_size=sampling.batch_size,
                              progress=run.progress)
        return write_samples(run, folder, ids)

    sample_job = {"train": train_job, "samples": sampling.samples, "seq_len": sampling.seq_len, "seed": seed,
                  "options": {k: v for k, v in options.items() if k in sampling_only}}
    samples = run.store.run("samples", sample_job, sample_work)
    return {"kind": "baseline", "in_budget": trained["in_budget"], "train": trained,
            "parameters": trained["parameters"], "samples": samples, "samples_job": _hash("samples", sample_job)}


def sampling_identity(config: SuiteConfig) -> dict:
    """What the samples an autoregressive hybrid draws depend on, for job hashes."""
    return {key: getattr(config.sampling, key) for key in ("samples", "seq_len", "temperature", "top_p")}


def draw_samples(run: Run, model: HybridLM, seed: int) -> torch.Tensor:
    """The suite's samples from a hybrid (DiHAL, a control), drawn as every AR method draws them."""
    sampling = run.config.sampling
    return model.generate(sampling.samples, sampling.seq_len, temperature=sampling.temperature,
                          top_p=sampling.top_p, seed=seed, batch_size=sampling.batch_size, progress=run.progress)


def write_samples(run: Run, folder: Path, ids: torch.Tensor) -> dict:
    texts = run.backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)
    path = folder / "samples.jsonl"
    write_text_atomic(path, "".join(json.dumps({"text": t, "token_ids": i}) + "\n" for t, i in zip(texts, ids.tolist(), strict=True)))
    return {"path": run.store.relative(path), "count": len(texts)}


def read_samples(path: Path) -> tuple[list[str], list[list[int]]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return [r["text"] for r in rows], [r["token_ids"] for r in rows]


def compute_metrics(run: Run, name: str, method: dict, references: list[str], seed: int) -> dict:
    texts, ids = read_samples(run.store.resolve(method["samples"]["path"]))
    samples = SampleSet(method=name, texts=texts, token_ids=ids)
    return compute_named_metrics(run, name, samples, references, seed, metric_names(run.config))


def compute_named_metrics(run: Run, name: str, samples: SampleSet, references: list[str], seed: int,
                          metrics: list[str]) -> dict:
    """``metrics`` of one method's samples, each value under the metric's name and its side
    values prefixed with it."""
    context = MetricContext(evaluator=run.evaluator, references=references, seed=seed, corpus=run.corpus,
                            **{key: getattr(run.config.metrics, key) for key in METRIC_CONTEXT_KEYS})
    values = {}
    registry = get_registry()
    for metric in metrics:
        registration = registry.get("metric", metric)
        try:
            computed = registration.obj(samples, context)
        except DihalError:
            raise
        except Exception as exc:  # a plugin's bug: name it; the metrics jobs done so far stay stored
            raise DihalError(f"metric {metric!r} ({registration.source}) failed on {name}: "
                             f"{type(exc).__name__}: {exc}") from exc
        # a metric's own value keeps its name; its side values (counts, warnings) are prefixed
        # with it, so that e.g. entropy's and MAUVE's sample counts cannot overwrite each other
        for key, value in computed.items():
            values[key if key == metric or key.startswith(f"{metric}_") else f"{metric}_{key}"] = value
    return values


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
            baseline = registry.get("baseline", name).obj(run.backbone, budget, seed, **baseline_options(run, name))
            baseline.load(run.store.resolve(method["train"]["model_dir"]))
            timed[name] = lambda n, t=length, b=baseline: b.sample(n, t, seed, batch_size=n)
            if registry.get("baseline", name).obj.intact_backbone:
                reference = name
    if reference is None:
        backbone = intact_control(run.backbone)
        timed[reference := "(intact backbone)"] = lambda n, t=length: backbone.generate(n, t, seed=seed, batch_size=n)
    names = list(timed)
    for name in names:  # warm-up: allocations, caches and lazy setup, kept out of the figures
        for size in sizes:
            timed[name](size, min(length, WARM_UP_TOKENS))
    times: dict[tuple[str, int], list[float]] = {(name, size): [] for name in names for size in sizes}
    for round_ in tqdm(range(repeats), desc="latency", disable=not run.progress, leave=False):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            for size in sizes:
                started = time.perf_counter()
                timed[name](size)
                times[name, size].append(time.perf_counter() - started)
    results = {}
    for name in names:
        values = results[name] = {}
        for size in sizes:
            seconds = statistics.median(times[name, size])
            values[f"batch{size}_seconds_per_sequence"] = seconds / size
            values[f"batch{size}_ms_per_token"] = 1000 * seconds / (size * length)
    for values in results.values():
        for size in sizes:
            values[f"batch{size}_ratio_to_backbone"] = (values[f"batch{size}_seconds_per_sequence"]
                                                        / results[reference][f"batch{size}_seconds_per_sequence"])
    return {"batch_size": batch, "seq_len": length, "repeats": repeats, "reference": reference, **results}


def baseline_options(run: Run, name: str) -> dict:
    """The suite's sampling settings a baseline takes: ``sampling.diffusion_steps`` for its
    diffusion steps option, ``sampling.temperature`` and ``top_p`` for its token sampler."""
    cls, sampling = get_registry().get("baseline", name).obj, run.config.sampling
    steps = {cls.steps_option: sampling.diffusion_steps} if cls.steps_option else {}
    return {**steps, **{option: getattr(sampling, option) for option in cls.token_sampling_options}}


def _hash(kind: str, spec: dict) -> str:
    return spec_hash(kind, spec)
