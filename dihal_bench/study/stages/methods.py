"""Stage 4: every row of the methods table (DiHAL roles, controls, references, baselines), each
train → sample (→ its held-out likelihood, where the suite asks for one), under the matched budget."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dihal_bench.api.baseline import Baseline
from dihal_bench.api.references import unigram_samples
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, special_ids
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, save_bridge_checkpoint
from dihal_bench.hybrid.evaluation import hybrid_test_nll
from dihal_bench.hybrid.model import HybridLM, skip_control
from dihal_bench.hybrid.training import BridgeSpec, evaluate_layer, packed_split
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.compute import backbone_flops, method_compute
from dihal_bench.study.identities import (
    eval_identity,
    sampling_identity,
    targets_identity,
)
from dihal_bench.study.jobs import spec_hash
from dihal_bench.study.protocol import baseline_options
from dihal_bench.study.run import Run
from dihal_bench.study.samples import draw_samples, write_samples
from dihal_bench.study.stages.likelihood import test_nll_job
from dihal_bench.training.budget import Budget

#: the bridge plugin the one-step regressor control trains (docs/method.md#controls)
REGRESSOR_BRIDGE = "regressor"

def method_row(run: Run, kind: str, name: str, roles: dict, spec: BridgeSpec, budget: Budget, seed: int,
               data_layers: list[int], targets: dict) -> dict:
    """One row of the methods table: a DiHAL role, a control at ℓ*, a reference or a baseline,
    with its compute counted from its shapes."""
    if kind == "dihal":
        row = dihal_method(run, spec, budget, roles[name], seed, data_layers, targets)
    elif kind == "control":
        row = control_method(run, name, spec, budget, roles["chosen"], seed, data_layers, targets)
    elif kind == "reference":
        row = reference_method(run, name, budget, seed)
    else:
        row = baseline_method(run, name, budget, seed)
    options = baseline_options(run.config, name) if kind == "baseline" else {}
    # the declared shape, not the loaded backbone: a reference row loads none, and a record read
    # back is counted from the same
    return {**row, "draw_precision": draw_precision(kind, name),
            "compute": method_compute(backbone_flops(run.config.backbone), run.config.to_dict(),
                                      budget.to_dict(), name, row, options)}


def draw_precision(kind: str, name: str) -> str | None:
    """The precision of the row's categorical draws (docs/method.md#sampling): a hybrid's decode loop
    draws through sample_next_token, a baseline says its own; a reference draws from no model."""
    if kind in ("dihal", "control"):
        return NEXT_TOKEN_PRECISION
    return get_registry().get("baseline", name).obj.draw_precision if kind == "baseline" else None

def dihal_method(run: Run, spec: BridgeSpec, budget: Budget, layer: int, seed: int, data_layers: list[int],
                 targets: dict, kind: str = "dihal") -> dict:
    """DiHAL at ``layer`` under the matched budget: train, evaluate, sample. ``spec`` names the
    bridge; the one-step regressor control comes through here too (``kind`` "control")."""
    config = run.config
    train_job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer, **eval_identity(config),
                 **targets_identity(config)}

    def train_work(folder: Path) -> dict:
        budget.check_allowance({"bridge": spec.parameter_count(run.backbone.width)}, name=f"DiHAL bridge (layer {layer})")
        bridge, stats = run.train_bridge(spec, layer, folder / "checkpoint", targets)
        save_bridge_checkpoint(bridge, spec.name, layer, run.backbone.name, folder / "bridge")
        valid = run.valid_states(spec.budget.seq_len, layer, data_layers)
        return {**stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid,
                                          lm_windows=config.sweep.eval_sequences),
                "checkpoint": run.store.relative(folder / "bridge")}

    trained = run.store.run("dihal-train", train_job, train_work)

    def hybrid() -> HybridLM:
        bridge, _ = load_bridge_checkpoint(run.store.resolve(trained["checkpoint"]), run.backbone, layer=layer)
        return HybridLM(run.backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=spec.sample_steps)

    sample_job = {"train": train_job, **sampling_identity(config), "seed": seed}
    samples = run.store.run("samples", sample_job,
                            lambda folder: write_samples(run, folder, draw_samples(run, hybrid(), seed)))
    likelihood = test_nll_job(run, {"train": train_job, "sample_steps": spec.sample_steps}, budget, seed,
                              lambda windows: hybrid_test_nll(hybrid(), windows, config.sampling.batch_size))
    return {"kind": kind, "layer": layer, "in_budget": True, "train": trained, "bridge": spec.name,
            "sample_steps": spec.sample_steps, "parameters": {"bridge": trained["parameters"]}, "samples": samples,
            "test_nll": likelihood,
            "train_job": spec_hash("dihal-train", train_job), "samples_job": spec_hash("samples", sample_job)}

def control_method(run: Run, name: str, spec: BridgeSpec, budget: Budget, layer: int, seed: int,
                   data_layers: list[int], targets: dict) -> dict:
    """A control at ℓ* (docs/method.md#controls). ``skip``: the upper stack fed h_0, no bridge
    and nothing trained. ``regressor``: the suite's bridge network trained under the matched
    budget to map h_0 to h_ℓ in one step, without diffusion."""
    if name == "regressor":
        regressor = dataclasses.replace(spec, name=REGRESSOR_BRIDGE, options=dict(spec.options), sample_steps=None)
        return dihal_method(run, regressor, budget, layer, seed, data_layers, targets, kind="control")

    def skip():
        return skip_control(run.backbone, layer, sink_passthrough=spec.sink_passthrough)

    sample_job = {**run.identity(), "control": name, "layer": layer, "sink_passthrough": spec.sink_passthrough,
                  **sampling_identity(run.config), "seed": seed}
    samples = run.store.run("samples", sample_job,
                            lambda folder: write_samples(run, folder, draw_samples(run, skip(), seed)))
    likelihood = test_nll_job(run, {"control": name, "layer": layer, "sink_passthrough": spec.sink_passthrough},
                              budget, seed,
                              lambda windows: hybrid_test_nll(skip(), windows, run.config.sampling.batch_size))
    return {"kind": "control", "layer": layer, "in_budget": False, "parameters": {}, "samples": samples,
            "test_nll": likelihood, "samples_job": spec_hash("samples", sample_job)}

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
    return {"kind": "reference", "in_budget": False, "parameters": {}, "samples": samples, "test_nll": None,
            "samples_job": spec_hash("samples", sample_job)}

def baseline_method(run: Run, name: str, budget: Budget, seed: int) -> dict:
    sampling = run.config.sampling
    cls = get_registry().get("baseline", name).obj
    options = baseline_options(run.config, name)
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
                "tokens_seen": result.tokens_seen, "train_seconds": result.seconds,
                "final_loss": (sum(result.losses[-10:]) / len(result.losses[-10:])) if result.losses else None,
                "sampling_options": baseline.sampling_options(), "in_budget": baseline.in_budget,
                "model_dir": run.store.relative(folder / "model")}

    trained = run.store.run("baseline-train", train_job, train_work)

    def trained_model() -> Baseline:
        baseline = build()
        baseline.load(run.store.resolve(trained["model_dir"]))
        return baseline

    def sample_work(folder: Path) -> dict:
        ids = trained_model().sample(sampling.samples, sampling.seq_len, seed, batch_size=sampling.batch_size,
                                     progress=run.progress)
        return write_samples(run, folder, ids)

    sample_job = {"train": train_job, "samples": sampling.samples, "seq_len": sampling.seq_len, "seed": seed,
                  "options": {k: v for k, v in options.items() if k in sampling_only}}
    samples = run.store.run("samples", sample_job, sample_work)
    # a method that does not override Baseline.test_nll has no likelihood: no job to run
    read = {k: v for k, v in options.items() if k in cls.likelihood_options}
    likelihood = None if cls.test_nll is Baseline.test_nll else test_nll_job(
        run, {"train": train_job, **({"options": read} if read else {})}, budget, seed,
        lambda windows: trained_model().test_nll(windows, seed, batch_size=sampling.batch_size))
    return {"kind": "baseline", "in_budget": trained["in_budget"], "train": trained,
            "parameters": trained["parameters"], "samples": samples, "test_nll": likelihood,
            "samples_job": spec_hash("samples", sample_job)}

