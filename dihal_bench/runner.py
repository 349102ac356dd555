"""``dihal-bench run``: the whole study as resumable jobs (DESIGN.md §4.2-§4.6).

Per seed: locate → bridge sweep → DiHAL at ℓ*, the worst-scored and the oracle layer
under the matched budget → every baseline under the same budget → samples from every
method → metrics → latency. Each unit is a job keyed by a hash of its inputs
(``dihal_bench.jobs``), so an interrupted run restarts where it stopped and gives the
same numbers. The run ends with one record in ``results/``.
"""

from __future__ import annotations

import json
import statistics
import time
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

import torch
from tqdm.auto import tqdm

from dihal_bench.backbone import Backbone, load_backbone
from dihal_bench.bridge_io import load_bridge_checkpoint, save_bridge_checkpoint
from dihal_bench.budget import Budget
from dihal_bench.corpus import load_corpus, pack, tokenize_documents
from dihal_bench.errors import DihalError
from dihal_bench.hybrid import HybridLM
from dihal_bench.jobs import JobStore
from dihal_bench.locate import LocateConfig, locate
from dihal_bench.metrics import MetricContext, SampleSet
from dihal_bench.plugins import get_registry
from dihal_bench.provenance import environment
from dihal_bench.records import RECORD_FORMAT, write_json_atomic
from dihal_bench.sweep import (
    BridgeSpec,
    SplitTensors,
    auto_layers,
    distinct_sequences,
    evaluate_layer,
    layer_correlations,
    packed_split,
    train_bridge,
    training_subset,
    with_states,
)


class Run:
    """One suite run: the resolved config, the job store, and lazily loaded models and data."""

    def __init__(self, suite: str, config: dict, out_root: Path, progress: bool = True):
        self.suite, self.config, self.progress = suite, config, progress
        self.store = JobStore(Path(out_root) / suite / "jobs")
        self.timings: dict[str, float] = {}
        self._train_states: dict[int, SplitTensors] = {}  # by sequence length
        self._valid_states: dict[int, SplitTensors] = {}
        self.bar: tqdm | None = None  # the whole seed's progress, one step per unit of work

    # -- lazily loaded, shared by the jobs that need them ---------------------------------------
    @cached_property
    def backbone(self) -> Backbone:
        return load_backbone(self.config["backbone"], **self._load_options())

    @cached_property
    def evaluator(self) -> Backbone:
        if self.config["evaluator"] == self.config["backbone"]:
            return self.backbone
        return load_backbone(self.config["evaluator"], **self._load_options())

    @cached_property
    def corpus(self):
        return load_corpus(self.config["corpus"])

    def _load_options(self) -> dict:
        options = {"device": self.config["device"], "dtype": self.config["dtype"]}
        if self.config["device_map"]:
            options["device_map"] = self.config["device_map"]
        return options

    def identity(self) -> dict:
        """What every job depends on: the data and the backbone."""
        return {"backbone": self.config["backbone"], "corpus": self.config["corpus"]}

    def timed(self, stage: str, fn, *args, **kwargs):
        """Run one unit of work, adding its wall time to its stage and advancing the run's bar."""
        if self.bar is not None:
            self.bar.set_postfix_str(stage)
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - started
            if self.bar is not None:
                self.bar.update(1)

    # -- budgets --------------------------------------------------------------------------------
    def bridge_spec(self, budget_table: dict, seed: int) -> BridgeSpec:
        bridge = self.config["bridge"]
        return BridgeSpec(name=bridge["name"], options=dict(bridge["options"]),
                          budget=Budget.from_dict({**budget_table, "seed": seed}),
                          sample_steps=bridge["sample_steps"], sink_passthrough=bridge["sink_passthrough"])

    def matched_budget(self, seed: int) -> Budget:
        """The one budget every method trains under; its allowance is the DiHAL bridge's size."""
        table = dict(self.config["budget"])
        if table.get("param_allowance") is None:
            table["param_allowance"] = self.bridge_spec(table, seed).parameter_count(self.backbone.width)
        return Budget.from_dict({**table, "seed": seed})

    # -- data -------------------------------------------------------------------------------------
    def prepare_data(self, seed: int, layers: list[int], budgets: list[Budget]) -> None:
        """Declare what this seed's jobs train on: every budget draws a prefix of one seeded
        subset of the training split, and bridges need hidden states at ``layers``. Nothing is
        computed until a job that is not finished yet asks for it."""
        self.data_seed, self.data_layers, self.data_budgets = seed, sorted(layers), budgets
        self._train_states.clear()

    def train_sequences(self, budget: Budget) -> torch.Tensor:
        same_length = [b for b in self.data_budgets if b.seq_len == budget.seq_len] or [budget]
        packed = packed_split(self.backbone, self.corpus, "train", budget.seq_len)
        return training_subset(packed, same_length, self.data_seed)[:distinct_sequences(budget)]

    def train_states(self, budget: Budget) -> SplitTensors:
        """Training sequences with their hidden states, extracted once for all layers of the seed."""
        cache = self._train_states
        if budget.seq_len not in cache:
            cache.clear()  # hidden states of the training split are large: keep one set at a time
            longest = max((b for b in self.data_budgets if b.seq_len == budget.seq_len), key=distinct_sequences,
                          default=budget)
            cache[budget.seq_len] = with_states(self.backbone, self.train_sequences(longest), self.data_layers,
                                                self.progress)
        return cache[budget.seq_len].head(distinct_sequences(budget))

    def valid_states(self, seq_len: int) -> SplitTensors:
        cache = self._valid_states
        if seq_len not in cache or not set(self.data_layers) <= set(cache[seq_len].states):
            sequences = packed_split(self.backbone, self.corpus, "validation", seq_len)
            cache[seq_len] = with_states(self.backbone, sequences[:self.config["sweep"]["eval_sequences"]],
                                         self.data_layers, self.progress)
        return cache[seq_len]

    def reference_texts(self, n: int, seq_len: int) -> list[str]:
        """Held-out human text: the first ``n`` test-split windows of ``seq_len`` backbone tokens."""
        windows = pack(tokenize_documents(self.corpus.split("test"), self.backbone.tokenizer), seq_len,
                       split_name="test")[:n]
        return self.backbone.tokenizer.batch_decode(windows, skip_special_tokens=True)


def run_suite(suite: str, config: dict, *, out_root: Path = Path("runs"), results_dir: Path = Path("results"),
              progress: bool = True) -> Path:
    """Run every stage for every seed and write the run record; returns its path."""
    check_methods(config)
    run = Run(suite, config, out_root, progress)
    started = time.perf_counter()
    per_seed = []
    for seed in tqdm(config["seeds"], desc=f"suite {suite}", unit="seed", disable=not progress or len(config["seeds"]) < 2):
        per_seed.append(run_seed(run, seed))
    record = {
        "format": RECORD_FORMAT,
        "suite": suite,
        "backbone": config["backbone"],
        "corpus": config["corpus"],
        "evaluator": config["evaluator"],
        "seeds": list(config["seeds"]),
        "config": config,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "timings": {**run.timings, "total_seconds": time.perf_counter() - started},
        "jobs": str(run.store.root),
        "per_seed": per_seed,
    }
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(results_dir) / f"{suite}-{_slug(config['backbone'])}-{stamp}.json"
    write_json_atomic(path, record)
    return path


def check_methods(config: dict) -> None:
    registry = get_registry()
    for name in config["methods"]["baselines"]:
        registry.get("baseline", name)
    unknown_roles = set(config["methods"]["dihal"]) - {"chosen", "worst", "oracle"}
    if unknown_roles:
        raise DihalError(f"unknown DiHAL role(s) {sorted(unknown_roles)}; known: chosen, worst, oracle")
    for name in metric_names(config):
        registry.get("metric", name)


def metric_names(config: dict) -> list[str]:
    return [m for m in config["metrics"]["names"] if m != "mauve" or config["metrics"]["mauve"]]


def run_seed(run: Run, seed: int) -> dict:
    config = run.config
    methods_count = len(config["methods"]["dihal"]) + len(config["methods"]["baselines"])
    sweep_count = len(config["sweep"]["layers"]) if config["sweep"]["layers"] != "auto" else config["sweep"]["count"] + 1
    run.bar = tqdm(total=2 + sweep_count + 2 * methods_count, desc=f"{run.suite} seed {seed}", unit="job",
                   disable=not run.progress)
    located = run.timed("locate", run.store.run, "locate", {**run.identity(), **config["locate"], "seed": seed},
                        lambda _: locate(run.backbone, run.corpus, LocateConfig(
                            tokens=config["locate"]["tokens"], seq_len=config["locate"]["seq_len"], seed=seed,
                            proxies=tuple(config["locate"]["proxies"]),
                            preprocessing=config["locate"]["preprocessing"]), run.progress))
    score = dict(zip(located["layers"], located["score"]))
    chosen = located["chosen_layer"]
    worst = min(located["layers"], key=lambda layer: (score[layer], layer))
    layers = config["sweep"]["layers"]
    if layers == "auto":
        # the worst-scored layer joins the sweep so that every DiHAL role's layer has a sweep row
        layers = sorted(set(auto_layers(located["backbone"]["layers"], chosen, config["sweep"]["count"])) | {worst})
    sweep_spec = run.bridge_spec(config["sweep"]["budget"], seed)
    budget = run.matched_budget(seed)
    spec = run.bridge_spec(config["budget"], seed)
    run.prepare_data(seed, sorted({*layers, chosen, worst}), [sweep_spec.budget, spec.budget])
    sweep_rows = [run.timed("sweep", sweep_layer, run, sweep_spec, layer) for layer in layers]
    correlations = layer_correlations(located, sweep_rows, seed)

    roles = {
        "chosen": chosen,
        "worst": worst,
        "oracle": min(sweep_rows, key=lambda row: (row["bridge_mse"], row["layer"]))["layer"],
    }
    methods = {}
    for role in config["methods"]["dihal"]:
        methods[f"dihal-{role}"] = run.timed("dihal", dihal_method, run, spec, budget, roles[role], seed)
    for name in config["methods"]["baselines"]:
        methods[name] = run.timed("baselines", baseline_method, run, name, budget, seed)

    references = run.reference_texts(config["sampling"]["samples"], config["sampling"]["seq_len"])
    for name, method in methods.items():
        method["metrics"] = run.timed("metrics", run.store.run, "metrics",
                                      {"samples": method["samples_job"], "evaluator": config["evaluator"],
                                       "metrics": metric_names(config), "seed": seed,
                                       "max_length": config["metrics"]["max_length"]},
                                      lambda _, m=method, n=name: compute_metrics(run, n, m, references, seed))
    latency = run.timed("latency", run.store.run, "latency",
                        {**run.identity(), "methods": {n: m["samples_job"] for n, m in methods.items()},
                         "repeats": config["metrics"]["latency_repeats"], "seed": seed},
                        lambda _: measure_latency(run, methods, roles, spec, budget, seed))
    for name, method in methods.items():
        method["latency"] = latency.get(name)
    run.bar.close()
    return {
        "seed": seed,
        "locate": {key: located[key] for key in ("layers", "score", "chosen_layer", "proxies", "preprocessing",
                                                 "tokens_sampled", "timings")},
        "sweep": {"layers": sweep_rows, "budget": sweep_spec.budget.to_dict(), "correlations": correlations},
        "roles": roles,
        "budget": budget.to_dict(),
        "methods": methods,
    }


def sweep_layer(run: Run, spec: BridgeSpec, layer: int) -> dict:
    """Train and evaluate the sweep's bridge for ``layer`` under the sweep's fixed protocol."""
    config = run.config
    job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer,
           "eval_sequences": config["sweep"]["eval_sequences"]}

    def work(folder: Path) -> dict:
        train = run.train_states(spec.budget)
        bridge, stats = train_bridge(run.backbone, spec, layer, train, folder / "checkpoint", run.progress)
        valid = run.valid_states(spec.budget.seq_len)
        return {"layer": layer, **stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid)}

    return run.store.run("sweep-layer", job, work)


def dihal_method(run: Run, spec: BridgeSpec, budget: Budget, layer: int, seed: int) -> dict:
    """DiHAL at ``layer`` under the matched budget: train, evaluate, sample."""
    config = run.config
    train_job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer}

    def train_work(folder: Path) -> dict:
        budget.check_allowance({"bridge": spec.parameter_count(run.backbone.width)}, name=f"DiHAL bridge (layer {layer})")
        train = run.train_states(spec.budget)
        bridge, stats = train_bridge(run.backbone, spec, layer, train, folder / "checkpoint", run.progress)
        save_bridge_checkpoint(bridge, spec.name, layer, run.backbone.name, folder / "bridge")
        valid = run.valid_states(spec.budget.seq_len)
        return {**stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid),
                "checkpoint": run.store.relative(folder / "bridge")}

    trained = run.store.run("dihal-train", train_job, train_work)
    sampling = config["sampling"]

    def sample_work(folder: Path) -> dict:
        bridge, _ = load_bridge_checkpoint(run.store.resolve(trained["checkpoint"]), run.backbone, layer=layer)
        hybrid = HybridLM(run.backbone, bridge, layer, sink_passthrough=spec.sink_passthrough,
                          steps=spec.sample_steps)
        ids = hybrid.generate(sampling["samples"], sampling["seq_len"], temperature=sampling["temperature"],
                              top_p=sampling["top_p"], seed=seed, batch_size=sampling["batch_size"],
                              progress=run.progress)
        return write_samples(run, folder, ids)

    sample_job = {"train": train_job, **{k: sampling[k] for k in ("samples", "seq_len", "temperature", "top_p")},
                  "seed": seed}
    samples = run.store.run("samples", sample_job, sample_work)
    return {"kind": "dihal", "layer": layer, "in_budget": True, "train": trained,
            "parameters": {"bridge": trained["parameters"]}, "samples": samples,
            "samples_job": _hash("samples", sample_job)}


def baseline_method(run: Run, name: str, budget: Budget, seed: int) -> dict:
    config = run.config
    sampling = config["sampling"]
    options = baseline_options(run, name)
    train_job = {**run.identity(), "baseline": name, "budget": budget.to_dict(), "options": options}

    def build():
        return get_registry().get("baseline", name).obj(run.backbone, budget, seed, **options)

    def train_work(folder: Path) -> dict:
        baseline = build()
        result = baseline.fit(run.train_sequences(budget), checkpoint_dir=folder / "checkpoint", progress=run.progress)
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
        ids = baseline.sample(sampling["samples"], sampling["seq_len"], seed, batch_size=sampling["batch_size"],
                              progress=run.progress)
        return write_samples(run, folder, ids)

    sample_job = {"train": train_job, **{k: sampling[k] for k in ("samples", "seq_len")}, "seed": seed}
    samples = run.store.run("samples", sample_job, sample_work)
    return {"kind": "baseline", "in_budget": trained["in_budget"], "train": trained,
            "parameters": trained["parameters"], "samples": samples, "samples_job": _hash("samples", sample_job)}


def write_samples(run: Run, folder: Path, ids: torch.Tensor) -> dict:
    texts = run.backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)
    path = folder / "samples.jsonl"
    path.write_text("".join(json.dumps({"text": t, "token_ids": i}) + "\n" for t, i in zip(texts, ids.tolist())))
    return {"path": run.store.relative(path), "count": len(texts)}


def read_samples(path: Path) -> tuple[list[str], list[list[int]]]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    return [r["text"] for r in rows], [r["token_ids"] for r in rows]


def compute_metrics(run: Run, name: str, method: dict, references: list[str], seed: int) -> dict:
    texts, ids = read_samples(run.store.resolve(method["samples"]["path"]))
    samples = SampleSet(method=name, texts=texts, token_ids=ids)
    context = MetricContext(evaluator=run.evaluator, references=references, seed=seed,
                            max_length=run.config["metrics"]["max_length"])
    values = {}
    registry = get_registry()
    for metric in metric_names(run.config):
        # a metric's own value keeps its name; its side values (counts, warnings) are prefixed
        # with it, so that e.g. entropy's and MAUVE's sample counts cannot overwrite each other
        for key, value in registry.get("metric", metric).obj(samples, context).items():
            values[key if key == metric or key.startswith(f"{metric}_") else f"{metric}_{key}"] = value
    return values


def measure_latency(run: Run, methods: dict, roles: dict, spec: BridgeSpec, budget: Budget, seed: int) -> dict:
    """Wall-clock per sequence and per token at batch 1 and at the suite's batch size, median
    over repeats after one warm-up, and the ratio to the backbone's own decode in this run."""
    sampling = run.config["sampling"]
    repeats = run.config["metrics"]["latency_repeats"]
    length, batch = sampling["seq_len"], sampling["batch_size"]
    generators = {}
    for name, method in methods.items():
        if method["kind"] == "dihal":
            bridge, _ = load_bridge_checkpoint(run.store.resolve(method["train"]["checkpoint"]), run.backbone)
            hybrid = HybridLM(run.backbone, bridge, method["layer"], sink_passthrough=spec.sink_passthrough,
                              steps=spec.sample_steps)
            generators[name] = lambda n, h=hybrid: h.generate(n, length, seed=seed, batch_size=n)
        else:
            baseline = get_registry().get("baseline", name).obj(run.backbone, budget, seed,
                                                                **baseline_options(run, name))
            baseline.load(run.store.resolve(method["train"]["model_dir"]))
            generators[name] = lambda n, b=baseline: b.sample(n, length, seed, batch_size=n)
    results = {}
    for name, generate in tqdm(generators.items(), desc="latency", disable=not run.progress, leave=False):
        results[name] = {}
        for size in (1, batch):
            generate(size)  # warm-up
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                generate(size)
                times.append(time.perf_counter() - started)
            seconds = statistics.median(times)
            results[name][f"batch{size}_seconds_per_sequence"] = seconds / size
            results[name][f"batch{size}_ms_per_token"] = 1000 * seconds / (size * length)
    reference = results.get("ar-backbone")
    for name, values in results.items():
        if reference:
            for size in (1, batch):
                values[f"batch{size}_ratio_to_backbone"] = (values[f"batch{size}_seconds_per_sequence"]
                                                            / reference[f"batch{size}_seconds_per_sequence"])
    return {"batch_size": batch, "seq_len": length, "repeats": repeats, **results}


def baseline_options(run: Run, name: str) -> dict:
    """The suite's sampling steps, for the baselines that have diffusion sampling steps."""
    option = get_registry().get("baseline", name).obj.steps_option
    return {option: run.config["sampling"]["diffusion_steps"]} if option else {}


def _hash(kind: str, spec: dict) -> str:
    from dihal_bench.jobs import spec_hash

    return spec_hash(kind, spec)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
