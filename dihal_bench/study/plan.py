"""The units of work of a run, decided from the suite alone (nothing loaded).

:func:`seed_units` is the one list of a seed's units: the runner counts its progress by it and
checks that it does exactly these, and the dry run (``dihal_bench.study.estimate``) prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.training.budget import Budget


@dataclass(frozen=True)
class Unit:
    """One unit of a seed's work: what the progress bar counts and the dry-run lists."""

    stage: str  # locate, targets, sweep, dihal, controls, references, baselines, steps, metrics, latency
    label: str
    seq_len: int | None = None  # a targets unit's training sequence length (its cost depends on it)


def auto_sweep_layers(num_layers: int, required: set[int], count: int) -> list[int]:
    """Exactly ``count`` candidate layers of 1..L-1 (all of them when there are fewer): every
    layer in ``required`` (ℓ*, the worst-scored layer), then, of the ``free`` picks left, the
    ⌈free/2⌉ shallowest remaining layers and the rest spread evenly over the deeper ones.

    Dense over the shallow layers because that is where bridgeability changes fastest and
    where a bridge is cheap (it replaces few layers), so ranks among them decide the
    correlations; the even tail keeps the whole depth in view. A plan knows the sweep's size
    before ℓ* is known."""
    candidates = list(range(1, num_layers))
    if len(candidates) <= count:
        return candidates
    chosen = set(required)
    rest = [layer for layer in candidates if layer not in chosen]
    free = count - len(chosen)
    if free > 0:
        shallow = (free + 1) // 2
        chosen |= set(rest[:shallow])
        deep, spread = rest[shallow:], free - shallow
        if spread:
            # the deepest layer is always among them; the others evenly below it
            chosen |= {deep[round((i + 1) * (len(deep) - 1) / spread)] for i in range(spread)}
    return sorted(chosen)


def sweep_size(config: SuiteConfig, num_layers: int | None) -> int:
    layers = config.sweep.layers
    if layers != "auto":
        return len(layers)
    count = config.sweep.count
    return count if num_layers is None else min(count, num_layers - 1)


def trains_matched_bridges(config: SuiteConfig) -> bool:
    """Whether a bridge trains under the matched budget (DiHAL or the regressor control): else
    only the sweep needs bridge targets (a geometry-only suite, say)."""
    return bool(config.methods.dihal) or "regressor" in config.methods.controls


def budget_sections(config: SuiteConfig, num_layers: int | None = None, *, bridge_targets: bool = False) -> list[str]:
    """The budget sections ("sweep.budget", then "budget") whose training sequences a run draws:
    the sweep's when it has a layer, the matched budget's when a bridge (DiHAL, the regressor
    control) or a baseline trains under it. ``bridge_targets``: only those whose sequences need
    bridge targets, which baselines do not (they read tokens), and none with streamed targets
    (``bridge.targets``: each training step computes its own). The one place that decides it, for
    the plan, the target extraction and the check that the training split can feed every budget."""
    if bridge_targets and config.bridge.streams_targets:
        return []
    sections = ["sweep.budget"] if sweep_size(config, num_layers) else []
    if trains_matched_bridges(config) or (config.methods.baselines and not bridge_targets):
        sections.append("budget")
    return sections


def target_budgets(config: SuiteConfig) -> list[Budget]:
    """The budgets whose training sequences need bridge targets: the sweep's, the matched one's."""
    return [Budget.from_dict(config.budget_table(section)) for section in budget_sections(config, bridge_targets=True)]


def target_lengths(config: SuiteConfig) -> list[int]:
    """Sequence lengths whose training split needs bridge targets (one extraction job each)."""
    return sorted({budget.seq_len for budget in target_budgets(config)})


def method_names(config: SuiteConfig) -> list[str]:
    """Every row of the methods table, in the order the runner makes them."""
    methods = config.methods
    return ([f"dihal-{role}" for role in methods.dihal] + [f"control-{name}" for name in methods.controls]
            + [f"reference-{name}" for name in methods.references] + list(methods.baselines))


def method_stage(name: str) -> str:
    for prefix, stage in (("dihal-", "dihal"), ("control-", "controls"), ("reference-", "references")):
        if name.startswith(prefix):
            return stage
    return "baselines"


def steps_label(steps: int, sampler: str | None = None) -> str:
    """A steps-axis point's label; ``sampler`` None is the suite's own bridge sampler."""
    return f"DiHAL at K={steps} steps" + (f", {sampler} sampler" if sampler is not None else "")


def steps_axis_samplers(config: SuiteConfig) -> tuple[str | None, ...]:
    """The bridge samplers the steps axis measures each K with (docs/method.md#bridge): the
    suite's ``bridge.steps_axis_samplers``, or (None,), the suite's own sampler alone."""
    return tuple(config.bridge.steps_axis_samplers) or (None,)


def steps_axis_points(config: SuiteConfig) -> list[tuple[str | None, int]]:
    """(sampler, K) of every steps-axis point, sampler by sampler, in the order the runner does them."""
    return [(sampler, k) for sampler in steps_axis_samplers(config) for k in config.bridge.steps_axis]


def seed_units(config: SuiteConfig, num_layers: int | None = None) -> list[Unit]:
    """Every unit of work of one seed, in the order the runner does them. ``num_layers`` (the
    backbone's depth, when known) caps an automatic sweep at the layers there are."""
    n_sweep = sweep_size(config, num_layers)
    return [
        Unit("locate", "locate"),
        *(Unit("targets", f"bridge targets T={length}", seq_len=length) for length in target_lengths(config)),
        *(Unit("sweep", f"sweep layer {i + 1}/{n_sweep}") for i in range(n_sweep)),
        *(Unit(method_stage(name), name) for name in method_names(config)),
        *(Unit("steps", steps_label(k, sampler)) for sampler, k in steps_axis_points(config)),
        *(Unit("metrics", f"metrics {name}") for name in method_names(config)),
        *([Unit("latency", "latency")] if method_names(config) else []),  # a geometry-only suite has no methods
    ]


