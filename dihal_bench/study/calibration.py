"""The estimate's rates measured on this machine (``run --calibrate``, ``run --dry-run --calibrate``):
a few timed forwards, decodes and training steps of the suite's own models, in seconds. Without it
the estimate uses the assumed rates of ``dihal_bench.study.estimate``."""

from __future__ import annotations

import time
from dataclasses import replace

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.estimate import (
    Throughput,
    assumed_throughput,
    backbone_parameters,
)
from dihal_bench.training.budget import Budget

#: tokens per sequence of the timed decode, and steps of the timed training: a few, so that the
#: calibration takes seconds; the batch shapes are the suite's own, since a rate depends on them
CALIBRATION_DECODE_TOKENS = 8
CALIBRATION_STEPS = 3
#: training windows a baseline's timed steps draw from (at least two batches of every built-in suite)
CALIBRATION_WINDOWS = 64


def calibrate(config: SuiteConfig, backbone, evaluator, seed: int = 0, sequences=None) -> Throughput:
    """Each kind of :class:`Work`'s rate measured on the loaded models in seconds: a forward pass
    of the backbone and of the evaluator, a decode by the suite's bridge at the middle layer with
    the suite's sample steps (what DiHAL's rows sample with), and a few training steps of that bridge
    through the one training loop. Forwards run one batch of the suite's training budget (the shape
    of the targets and evaluation passes). Each is timed after a warm-up call, which pays for lazy
    setup. Each trained baseline of the suite is timed by the step through its own ``fit``
    (:func:`_baseline_steps`), on ``sequences`` (the run's training windows) or random ids."""
    import torch

    from dihal_bench.hybrid.model import HybridLM
    from dihal_bench.study.protocol import bridge_spec

    generator = torch.Generator().manual_seed(seed)
    shape = Budget.from_dict(config.budget)
    ids = torch.randint(backbone.vocab_size, (shape.batch_size, shape.seq_len), generator=generator)

    def forward_rate(model) -> float:
        ids_of = ids.remainder(model.vocab_size).to(model.device)
        with torch.no_grad():
            return _timed_rate(lambda: model.logits(ids_of), ids_of.numel(), model.device)

    spec = bridge_spec(config, "budget", seed)
    layer = max(1, backbone.num_layers // 2)
    torch.manual_seed(seed)
    bridge = spec.build(backbone.width).to(backbone.device)
    hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=spec.sample_steps)
    rows = config.sampling.batch_size
    decode = _timed_rate(lambda: hybrid.generate(rows, CALIBRATION_DECODE_TOKENS, seed=seed, batch_size=rows),
                         rows * CALIBRATION_DECODE_TOKENS, backbone.device)
    return Throughput(forward=forward_rate(backbone), decode=decode, evaluator=forward_rate(evaluator),
                      trained=_training_rate(spec, backbone.width, backbone.device, seed),
                      source=f"measured on this machine ({backbone.device}, {config.dtype})",
                      baseline_step=_baseline_steps(config, backbone, seed, sequences))


def _baseline_steps(config: SuiteConfig, backbone, seed: int, sequences) -> dict[str, float]:
    """Seconds per training step of each trained baseline of the suite: its ``fit`` for two steps
    minus its ``fit`` for one, so that building it and what its ``fit`` does before the first step
    (a vocabulary, LD4LG's feature extraction on these few windows) cancel out. A LoRA rival's step
    runs the whole backbone forward and backward, seconds on a CPU; the others', a fraction of one."""
    import torch

    from dihal_bench.registry.plugins import get_registry
    from dihal_bench.study.protocol import baseline_options, matched_budget

    registry = get_registry()
    budget = matched_budget(config, seed, backbone.width)
    # a few windows: enough for two steps and a vocabulary of a few thousand tokens (a compact-vocabulary
    # baseline's readout grows with it), few enough that what fit does per window stays seconds
    data = (sequences if sequences is not None else torch.randint(
        backbone.vocab_size, (CALIBRATION_WINDOWS, budget.seq_len), generator=torch.Generator().manual_seed(seed)))
    data = data[:CALIBRATION_WINDOWS]
    steps = {}
    for name in config.methods.baselines:
        cls = registry.get("baseline", name).obj
        if not cls.in_budget:
            continue
        options = baseline_options(config, name)
        one = _fit_seconds(cls, backbone, budget.replace(steps=1, checkpoint_every=1, epochs=1), seed, options, data)
        two = _fit_seconds(cls, backbone, budget.replace(steps=2, checkpoint_every=2, epochs=1), seed, options, data)
        steps[name] = max(two - one, 1e-6)
    return steps


def _fit_seconds(cls, backbone, budget, seed: int, options: dict, data) -> float:
    """Seconds to build baseline ``cls`` and ``fit`` it under ``budget`` on ``data``."""
    import torch

    started = time.perf_counter()
    torch.manual_seed(seed)
    cls(backbone, budget, seed, **options).fit(data, progress=False)
    return time.perf_counter() - started


def _training_rate(spec, width: int, device, seed: int) -> float:
    """Tokens per second of ``spec``'s bridge trained by the one training loop on random states
    (a step's cost does not depend on the values)."""
    import torch

    from dihal_bench.api.bridge import training_loss
    from dihal_bench.training.loop import train

    budget = replace(spec.budget, steps=CALIBRATION_STEPS, epochs=1, checkpoint_every=CALIBRATION_STEPS)
    generator = torch.Generator().manual_seed(seed)
    shape = (budget.batch_size * CALIBRATION_STEPS, budget.seq_len, width)
    cond, target = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    mask = torch.ones(shape[:2], dtype=torch.bool)
    torch.manual_seed(seed)
    bridge = spec.build(width).to(device)
    bridge.fit_standardizer(cond, target, mask)
    data = {"cond": cond, "target": target, "mask": mask}

    def run(steps: int) -> None:
        train(bridge, training_loss, data, replace(budget, steps=steps), progress=False)

    return _timed_rate(lambda: run(CALIBRATION_STEPS), CALIBRATION_STEPS * budget.tokens_per_step, device,
                       warm_up=lambda: run(1))


def _timed_rate(work, tokens: int, device, warm_up=None) -> float:
    """``tokens`` over the seconds one call of ``work`` takes, after one (warm-up) call."""
    import torch

    def synchronize():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)

    (warm_up or work)()
    synchronize()
    started = time.perf_counter()
    work()
    synchronize()
    return tokens / max(time.perf_counter() - started, 1e-9)


def calibrate_run(run) -> Throughput:
    """:func:`calibrate` on a loaded run: its models, and its first seed's training windows for the
    baselines' steps."""
    from dihal_bench.study.protocol import matched_budget

    seed = run.config.seeds[0]
    windows = run.train_sequences(matched_budget(run.config, seed, run.backbone.width), seed)
    return calibrate(run.config, run.backbone, run.evaluator, seed=seed, sequences=windows)


def run_throughput(run, calibrated: bool) -> Throughput:
    """The rates a run's estimate and progress bar use: measured on the run's own models when asked
    (``calibrated``), else the assumed ones."""
    if calibrated:
        return calibrate_run(run)
    params = backbone_parameters(run.config.backbone) or float(run.backbone.num_parameters())
    return assumed_throughput(run.config, params)


def estimate_line(config: SuiteConfig, costs: dict[int, list[float]], throughput: Throughput) -> str:
    """What a run says before it starts: where it runs and roughly how long it takes."""
    total = sum(map(sum, costs.values()))
    seeds = len(costs)
    return (f"running on {config.device} ({config.dtype}); estimated {total / 60:.0f} min for {seeds} "
            f"seed{'s' if seeds > 1 else ''} ({throughput.source}), less for jobs the store already holds, "
            "more for locate's proxies and the sweep's evaluation, which it does not price")


def stage_estimate(plans: dict[int, list], costs: dict[int, list[float]], throughput: Throughput) -> dict:
    """What a run estimated before it started, as its record keeps it beside its ``timings``:
    each stage's estimated seconds over all seeds, their total, and where the rates came from."""
    stages: dict[str, float] = {}
    for seed, plan in plans.items():
        for unit, seconds in zip(plan, costs[seed], strict=True):
            stages[unit.stage] = stages.get(unit.stage, 0.0) + seconds
    return {"source": throughput.source, "stages": stages, "total_seconds": sum(stages.values())}
