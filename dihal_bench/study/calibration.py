"""The estimate's rates measured on this machine (``run --calibrate``, ``run --dry-run --calibrate``):
a few timed forwards, decodes and training steps of the suite's own models, each baseline's step and
decode, a bridge's evaluation, a store of hidden states and locate's proxies on one layer, in seconds
(minutes on a suite with LoRA rows, whose decode runs the whole backbone). Without it the estimate
uses the assumed rates of ``dihal_bench.study.estimate``."""

from __future__ import annotations

import math
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.estimate import (
    BaselineTiming,
    Throughput,
    assumed_throughput,
    backbone_parameters,
)
from dihal_bench.training.budget import Budget

#: tokens of the warm-up decodes, and steps of the timed bridge training: a few, so that the
#: calibration takes seconds; the shapes are the suite's own, since a rate depends on them
WARM_UP_TOKENS = 4
CALIBRATION_STEPS = 3
#: the longer timed fit of a baseline adds steps until they take about TIMED_SECONDS (judged by the
#: shorter fit's loop), within these bounds: a step of a small model is a tenth of a second, and a
#: few of them drown in the machine's noise; a LoRA rival's is seconds
TIMED_SECONDS = 3.0
EXTRA_STEPS = (3, 30)
#: training windows a baseline's timed steps draw from (at least two batches of every built-in suite)
CALIBRATION_WINDOWS = 64
#: windows of the timed bridge evaluation and of the timed extraction and store of bridge targets:
#: enough that a pass runs at the batch sizes the jobs use
CALIBRATION_EVAL_WINDOWS = 16
#: the targets job and locate's proxies are timed this many times and the fastest taken: each is a
#: second or two, and one timing of it moved by a factor of 2.6 (targets) and 1.7 (proxies) between two
#: diagnostic runs on the same machine (benchmarks/results/eta_record.json), where their stages did not
REPEATS = 3
#: windows of the timed targets job: its fixed costs (one file per kept layer) are a larger share of
#: a small pass than of the job's thousands of windows
EXTRACTION_WINDOWS = 64


def calibrate(config: SuiteConfig, backbone, evaluator, seed: int = 0, sequences=None) -> Throughput:
    """Each kind of :class:`Work`'s rate measured on the loaded models in seconds: a forward pass
    of the backbone and of the evaluator, a decode of one sampling batch and of one sequence by the
    suite's bridge at the middle layer with the suite's sample steps (what DiHAL's rows sample
    with), a few training steps of that bridge through the one training loop, that bridge's
    validation measures (:func:`evaluate_layer`),
    the extraction and store of bridge targets, and locate's proxies on one layer. Forwards run one
    batch of the suite's training budget (the shape of the targets and evaluation passes). Each is
    timed after a warm-up call, which pays for lazy setup. Each baseline of the suite is timed by
    the step through its own ``fit`` and by its decode of one sampling batch and of one sequence
    (:func:`_baseline_timings`), trained on ``sequences`` (the run's training windows) or random ids."""
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
    rows, length = config.sampling.batch_size, config.sampling.seq_len
    # the whole sequence: a hybrid's decode step costs more the longer its prefix
    decode = _timed_rate(lambda: hybrid.generate(rows, length, seed=seed, batch_size=rows), rows * length,
                         backbone.device,
                         warm_up=lambda: hybrid.generate(rows, WARM_UP_TOKENS, seed=seed, batch_size=rows))
    single = _seconds(lambda: hybrid.generate(1, length, seed=seed, batch_size=1), backbone.device)
    windows = torch.randint(backbone.vocab_size, (EXTRACTION_WINDOWS, shape.seq_len), generator=generator)
    return Throughput(forward=forward_rate(backbone), decode=decode,
                      evaluator=_scoring_rate(config, backbone, evaluator, ids if sequences is None else sequences),
                      trained=_training_rate(spec, backbone.width, backbone.device, seed),
                      source=f"measured on this machine ({backbone.device}, {config.dtype})",
                      baselines=_baseline_timings(config, backbone, seed, sequences),
                      evaluated=_evaluation_rate(backbone, bridge, layer, spec, windows[:CALIBRATION_EVAL_WINDOWS]),
                      extracted=_extraction_rate(config, backbone, windows),
                      proxy_seconds=_proxy_seconds(config, backbone, seed), single_decode=single)


def _baseline_timings(config: SuiteConfig, backbone, seed: int, sequences) -> dict[str, BaselineTiming]:
    """Each baseline of the suite timed through its own ``fit`` and ``sample``. A trained one's step:
    its training loop's seconds in a longer fit (steps worth about ``TIMED_SECONDS`` more) minus in
    a two-step fit, per step; what its fit does per training window outside the loop (a vocabulary,
    LD4LG's backbone features): that time in its two-step fit on all the windows minus on half of
    them, per window, so that building it cancels out. Then its decode of one sampling batch and of
    one sequence, ``seq_len`` tokens each, after a short warm-up decode. A LoRA rival's step runs the
    whole backbone forward and backward, seconds on a CPU, and its decode a minute or more; the
    others' take a fraction of that."""
    import torch

    from dihal_bench.registry.plugins import get_registry
    from dihal_bench.study.protocol import baseline_options, matched_budget

    registry = get_registry()
    budget = matched_budget(config, seed, backbone.width)
    sampling = config.sampling
    # a few windows: enough for two steps and a vocabulary of a few thousand tokens (a compact-vocabulary
    # baseline's readout grows with it), few enough that what fit does per window stays seconds
    data = (sequences if sequences is not None else torch.randint(
        backbone.vocab_size, (CALIBRATION_WINDOWS, budget.seq_len), generator=torch.Generator().manual_seed(seed)))
    data = data[:CALIBRATION_WINDOWS]
    half = data[: len(data) // 2]

    def steps(n: int, windows) -> Budget:  # as many passes over ``windows`` as n steps need
        return budget.replace(steps=n, checkpoint_every=n, epochs=math.ceil(n * budget.batch_size / len(windows)))

    timings = {}
    for name in config.methods.baselines:
        cls = registry.get("baseline", name).obj
        options = baseline_options(config, name)
        step, per_window = None, 0.0
        if cls.in_budget:
            # two steps, then more: a two-stage baseline (LD4LG) needs a step for each stage. The steps are
            # timed by the training loop (``TrainResult.wall_seconds``), apart from the setup around
            # it, whose noise (LD4LG's features: seconds) would drown three steps of a small model
            on_half, _ = _fit_seconds(cls, backbone, steps(2, half), seed, options, half)
            short, _ = _fit_seconds(cls, backbone, steps(2, data), seed, options, data)
            extra = min(max(math.ceil(TIMED_SECONDS * 2 / max(short.loop, 1e-6)), EXTRA_STEPS[0]), EXTRA_STEPS[1])
            long, method = _fit_seconds(cls, backbone, steps(2 + extra, data), seed, options, data)
            step = max(long.loop - short.loop, 1e-6) / extra
            per_window = max(short.setup - on_half.setup, 0.0) / (len(data) - len(half))
        else:  # trains nothing; its fit may still count something (an n-gram reference's table)
            method = _fit_seconds(cls, backbone, budget, seed, options, data)[1]
        method.sample(1, WARM_UP_TOKENS, seed, batch_size=1)
        batch, single = (_seconds(lambda n=n, m=method: m.sample(n, sampling.seq_len, seed, batch_size=n), backbone.device)
                         for n in (sampling.batch_size, 1))
        timings[name] = BaselineTiming(step, per_window, batch, single)
    return timings


@dataclass(frozen=True)
class FitTime:
    """A timed ``fit``: seconds in its training loop, and around it (building the baseline and
    preparing its data)."""

    loop: float
    setup: float


def _fit_seconds(cls, backbone, budget, seed: int, options: dict, data):
    """Baseline ``cls`` built and ``fit`` under ``budget`` on ``data``: its :class:`FitTime`, and the
    fitted baseline. The loop's seconds are its ``TrainResult``'s (a fit that returns none counts
    all its time as the loop's)."""
    import torch

    started = time.perf_counter()
    torch.manual_seed(seed)
    method = cls(backbone, budget, seed, **options)
    result = method.fit(data, progress=False)
    total = time.perf_counter() - started
    loop = getattr(result, "wall_seconds", total)
    return FitTime(loop, total - loop), method


def _scoring_rate(config: SuiteConfig, backbone, evaluator, windows) -> float:
    """Backbone tokens per second of a metrics job's evaluator pass (``evaluate_texts``: the text
    re-tokenised, scored and featurised at every position, the log-softmax over the evaluator's
    whole vocabulary) on texts of the suite's sample length decoded from ``windows``: a bare
    forward of as many tokens ran 1.7 times faster (Gemma-3-270M, whose head is 262k wide, one
    thread of a 2-core CPU), so a forward's rate overstates what a metrics job scores per second by that much."""
    from dihal_bench.api.metrics import evaluate_texts

    length = config.sampling.seq_len
    texts = [backbone.tokenizer.decode(row[:length].tolist()) for row in windows[:CALIBRATION_EVAL_WINDOWS]]

    def score(batch: list[str]) -> None:
        evaluate_texts(evaluator, batch, max_length=config.metrics.max_length)

    return _timed_rate(lambda: score(texts), len(texts) * length, evaluator.device, warm_up=lambda: score(texts[:2]))


def _evaluation_rate(backbone, bridge, layer: int, spec, windows) -> float:
    """Tokens per second of a bridge's validation measures (bridgeability, the hybrid's and the skip
    control's perplexity, KL to the backbone) on ``windows``, at ``layer`` (the middle one: the
    upper stack costs the swept layers' average)."""
    from dihal_bench.hybrid.training import evaluate_layer, with_states

    valid = with_states(backbone, windows, [layer], progress=False)
    return _timed_rate(lambda: evaluate_layer(backbone, bridge, layer, spec, valid), windows.numel(), backbone.device)


def _extraction_rate(config: SuiteConfig, backbone, windows) -> float:
    """Tokens per second of a bridge-targets job on ``windows``: their states at as many layers as
    the suite's job keeps (every swept layer and the embedding output), the deepest of them, from a
    pass that stops at the last (the worst-scored layer a suite sweeps is usually deep), written as
    safetensors."""
    from dihal_bench.base.files import write_safetensors_atomic
    from dihal_bench.hybrid.training import with_states
    from dihal_bench.study.plan import sweep_size

    kept = max(sweep_size(config, backbone.num_layers), 1)
    layers = list(range(backbone.num_layers - kept, backbone.num_layers))

    def extract_and_store(folder: Path) -> None:
        states = with_states(backbone, windows, layers, progress=False)
        for index, tensor in states.states.items():
            write_safetensors_atomic(folder / f"layer-{index}.safetensors", {"states": tensor.contiguous()})

    with tempfile.TemporaryDirectory() as folder:
        return _timed_rate(lambda: extract_and_store(Path(folder)), windows.numel(), backbone.device, repeats=REPEATS)


def _proxy_seconds(config: SuiteConfig, backbone, seed: int) -> float:
    """Seconds of locate's proxies over every candidate layer: every proxy it measures, in every
    preprocessing, timed on one layer of Gaussian states of its sample's size (a proxy's cost
    depends on the shape, not the values), the fastest of ``REPEATS`` timings, and multiplied by the
    candidate layers."""
    import torch

    from dihal_bench.locate.pipeline import (
        check_variants,
        layer_geometry,
        measured_proxies,
    )
    from dihal_bench.study.stages.locate import locate_config

    located = locate_config(config.locate, seed)
    selected, measured = measured_proxies(located)
    hidden = {1: torch.randn(located.tokens, backbone.width, generator=torch.Generator().manual_seed(seed))}
    variants = check_variants(located.variants)
    seconds = _fastest(lambda: layer_geometry(hidden, located, selected, measured, variants), REPEATS)
    return seconds * (backbone.num_layers - 1)


def _seconds(work, device=None) -> float:
    """Seconds one call of ``work`` takes, with what it queued on a CUDA ``device`` finished."""
    import torch

    def synchronize():
        if str(device).startswith("cuda"):
            torch.cuda.synchronize(device)

    synchronize()
    started = time.perf_counter()
    work()
    synchronize()
    return time.perf_counter() - started


def _fastest(work, repeats: int, device=None) -> float:
    """The fewest seconds of ``repeats`` calls of ``work``: the machine's noise only ever adds time."""
    return min(_seconds(work, device) for _ in range(repeats))


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


def _timed_rate(work, tokens: int, device, warm_up=None, repeats: int = 1) -> float:
    """``tokens`` over the seconds a call of ``work`` takes (the fastest of ``repeats``), after one
    (warm-up) call."""
    (warm_up or work)()
    return tokens / max(_fastest(work, repeats, device), 1e-9)


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
