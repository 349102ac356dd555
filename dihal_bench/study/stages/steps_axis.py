"""Stage 5: DiHAL at ℓ* resampled with other numbers of steps K and other update rules."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dihal_bench.api.metrics import SampleSet
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint
from dihal_bench.hybrid.model import HybridLM
from dihal_bench.hybrid.training import BridgeSpec, evaluate_layer
from dihal_bench.study.identities import eval_identity, sampling_identity
from dihal_bench.study.run import Run
from dihal_bench.study.samples import draw_samples
from dihal_bench.study.stages.metrics import compute_named_metrics

#: what a point of the sampling-steps axis keeps of the bridge's validation measures
STEPS_AXIS_KEYS = ("bridge_mse", "bridge_mse_trace", "bridge_r2", "hybrid_ppl", "kl_to_backbone")

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
