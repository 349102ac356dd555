"""The units of work of a run, decided from the suite alone (nothing loaded).

:func:`seed_units` is the one list of a seed's units: the runner counts its progress by it and
checks that it does exactly these, and the dry run (``dihal_bench.study.estimate``) prints it.
"""

from __future__ import annotations

from dataclasses import dataclass

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.registry.plugins import get_registry
from dihal_bench.training.budget import Budget

#: what joins a row's label and its budget scale (``diffusion-lm@4x``)
SCALE_MARK = "@"


@dataclass(frozen=True)
class Unit:
    """One unit of a seed's work: what the progress bar counts and the dry-run lists."""

    stage: str  # locate, targets, sweep, dihal, controls, references, baselines, steps, metrics, frontier, latency
    label: str
    seq_len: int | None = None  # a targets unit's training sequence length (its cost depends on it)
    scale: int = 1  # a method unit's budget scale (docs/method.md#budget-scales)
    point: FrontierPoint | None = None  # a frontier unit's row and setting


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


def method_labels(config: SuiteConfig) -> list[tuple[str, str, str, int]]:
    """(row label, kind, name, budget scale) of every method row, in the order the runner makes them:
    each row at each of its scales (docs/method.md#budget-scales), a scale other than 1 in its label."""
    return [(scaled_label(label, scale), kind, name, scale)
            for label, kind, name in method_rows(config) for scale in row_scales(config, label, kind, name)]


def method_rows(config: SuiteConfig) -> list[tuple[str, str, str]]:
    """(row label, kind, name) of every row of the suite, before budget scales."""
    methods = config.methods
    return ([(f"dihal-{role}", "dihal", role) for role in methods.dihal]
            + [(f"control-{name}", "control", name) for name in methods.controls]
            + [(f"reference-{name}", "reference", name) for name in methods.references]
            + [(name, "baseline", name) for name in methods.baselines])


def method_names(config: SuiteConfig) -> list[str]:
    """Every row of the methods table, in the order the runner makes them."""
    return [label for label, *_ in method_labels(config)]


def trains(kind: str, name: str) -> bool:
    """Whether a row trains anything under the budget: the references, the skip control and an
    out-of-budget baseline (the intact backbone) do not."""
    if kind == "dihal":
        return True
    if kind == "control":
        return name == "regressor"
    if kind == "baseline":
        return get_registry().get("baseline", name).obj.in_budget
    return False


def row_scales(config: SuiteConfig, label: str, kind: str, name: str) -> tuple[int, ...]:
    """The budget scales a row is trained at: the suite's, or the row's own list; 1 for a row that trains nothing."""
    return config.scales.of(label) if trains(kind, name) else (1,)


def scaled_label(label: str, scale: int) -> str:
    """A row's label at a budget scale: unchanged at 1 (so a scale-1 row keeps its name and jobs), else ``<label>@<s>x``."""
    return label if scale == 1 else f"{label}{SCALE_MARK}{scale}x"


def split_scale(label: str) -> tuple[str, int]:
    """(row label, budget scale) of a methods-table label, the inverse of :func:`scaled_label`."""
    base, mark, scale = label.rpartition(SCALE_MARK)
    if mark and scale.endswith("x") and scale[:-1].isdigit() and int(scale[:-1]) >= 1:
        return base, int(scale[:-1])
    return label, 1


def scaled_budget(budget: Budget, scale: int) -> Budget:
    """The matched budget at ``scale`` (docs/method.md#budget-scales): S·s steps over epochs·s passes of
    the same windows, every other field the same, so warm-up and cosine are set for the longer run."""
    return budget if scale == 1 else budget.replace(steps=budget.steps * scale, epochs=budget.epochs * scale)


#: the stages `method_stage` names: the runner hands their jobs out as one executor stage, "methods"
METHOD_STAGES = ("dihal", "controls", "references", "baselines")


def method_stage(name: str) -> str:
    name = split_scale(name)[0]
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


@dataclass(frozen=True)
class FrontierPoint:
    """A scale-1 row resampled at one other sampling setting (docs/method.md#frontiers): ``setting``
    holds the one ``[sampling]`` key it changes, ``temperature`` or ``diffusion_steps``."""

    label: str
    kind: str
    name: str
    setting: tuple[str, float | int]

    @property
    def unit_label(self) -> str:
        key, value = self.setting
        return f"{self.label} at " + (f"T={value:g}" if key == "temperature" else f"{value} steps")


def frontier_points(config: SuiteConfig) -> list[FrontierPoint]:
    """Every point of the suite's frontiers, row by row in the methods table's order: each row that
    draws tokens from a next-token distribution (DiHAL, the controls, a baseline with a temperature
    option) at each of ``frontier.temperatures``, each baseline with diffusion steps at each of
    ``frontier.diffusion_steps``; a setting equal to the suite's own is the row itself, not a point."""
    sampling, frontier, points = config.sampling, config.frontier, []
    for label, kind, name in method_rows(config):
        cls = get_registry().get("baseline", name).obj if kind == "baseline" else None
        tempered = kind in ("dihal", "control") or (cls is not None and "temperature" in cls.token_sampling_options)
        if tempered:
            points += [FrontierPoint(label, kind, name, ("temperature", t))
                       for t in frontier.temperatures if t != sampling.temperature]
        if cls is not None and cls.steps_option:
            points += [FrontierPoint(label, kind, name, ("diffusion_steps", k))
                       for k in frontier.diffusion_steps if k != sampling.diffusion_steps]
    return points


def seed_units(config: SuiteConfig, num_layers: int | None = None) -> list[Unit]:
    """Every unit of work of one seed, in the order the runner does them. ``num_layers`` (the
    backbone's depth, when known) caps an automatic sweep at the layers there are."""
    n_sweep = sweep_size(config, num_layers)
    return [
        Unit("locate", "locate"),
        *(Unit("targets", f"bridge targets T={length}", seq_len=length) for length in target_lengths(config)),
        *(Unit("sweep", f"sweep layer {i + 1}/{n_sweep}") for i in range(n_sweep)),
        *(Unit(method_stage(name), name, scale=split_scale(name)[1]) for name in method_names(config)),
        *(Unit("steps", steps_label(k, sampler)) for sampler, k in steps_axis_points(config)),
        *(Unit("metrics", f"metrics {name}") for name in method_names(config)),
        *(Unit("frontier", point.unit_label, point=point) for point in frontier_points(config)),
        *([Unit("latency", "latency")] if method_names(config) else []),  # a geometry-only suite has no methods
    ]


