"""Each baseline of a suite timed through its own ``fit`` and ``sample`` on the loaded backbone, for
the estimate's rates (:func:`dihal_bench.study.calibration.calibrate`)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from dihal_bench.base.timing import WARM_UP_TOKENS, seconds
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.estimate import BaselineTiming
from dihal_bench.training.budget import Budget

#: the longer timed fit of a baseline adds steps until they take about TIMED_SECONDS (judged by the
#: shorter fit's loop), within these bounds: a step of a small model is a tenth of a second, and a
#: few of them drown in the machine's noise; a LoRA rival's is seconds
TIMED_SECONDS = 3.0
EXTRA_STEPS = (3, 30)
#: training windows a baseline's timed steps draw from (at least two batches of every built-in suite)
CALIBRATION_WINDOWS = 64


def baseline_timings(config: SuiteConfig, backbone, seed: int, sequences) -> dict[str, BaselineTiming]:
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
        batch, single = (seconds(lambda n=n, m=method: m.sample(n, sampling.seq_len, seed, batch_size=n), backbone.device)
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
