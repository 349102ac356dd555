"""One seed's state as the runner's stages fill it in, and what locate's result decides for it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.hybrid.training import BridgeSpec
from dihal_bench.study.plan import auto_sweep_layers, budget_sections, scaled_budget
from dihal_bench.study.protocol import bridge_spec, matched_budget
from dihal_bench.study.run import Run
from dihal_bench.training.budget import Budget


@dataclass
class SeedStudy:
    """One seed's state as the stages fill it in: what a later stage of the same seed reads."""

    seed: int
    located: dict = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)  # the swept layers
    data_layers: list[int] = field(default_factory=list)  # every layer a bridge of this seed is trained at
    sweep_spec: BridgeSpec | None = None
    spec: BridgeSpec | None = None  # the matched budget's bridge
    budget: Budget | None = None  # the matched budget
    targets: dict[int, dict] = field(default_factory=dict)  # bridge-targets results by sequence length
    sweep_rows: list[dict] = field(default_factory=list)
    roles: dict[str, int] = field(default_factory=dict)
    methods: dict[str, dict] = field(default_factory=dict)
    steps_axis: list[dict] = field(default_factory=list)
    frontier: list[dict] = field(default_factory=list)  # docs/method.md#frontiers

    def stage_budgets(self, config: SuiteConfig, num_layers: int) -> list[Budget]:
        """The budgets whose training data the bridge targets must hold."""
        by_section = {"sweep.budget": self.sweep_spec.budget, "budget": self.spec.budget}
        return [by_section[section] for section in budget_sections(config, num_layers, bridge_targets=True)]

    def scaled_spec(self, scale: int) -> BridgeSpec:
        """The matched budget's bridge at a budget scale (docs/method.md#budget-scales)."""
        return dataclasses.replace(self.spec, budget=scaled_budget(self.spec.budget, scale))


def plan_bridges(run: Run, study: SeedStudy, located: dict) -> None:
    """From locate's scores: ℓ*, the worst-scored layer, the swept layers and the bridge specs."""
    config, num_layers = run.config, run.backbone.num_layers
    score = dict(zip(located["layers"], located["score"], strict=True))
    chosen = located["chosen_layer"]
    worst = min(located["layers"], key=lambda layer: (score[layer], layer))
    explicit = config.sweep.layers
    # every DiHAL role's layer has a sweep row: ℓ* and the worst-scored layer join an automatic sweep
    study.layers = list(explicit) if explicit != "auto" else auto_sweep_layers(num_layers, {chosen, worst},
                                                                               config.sweep.count)
    study.located, study.roles = located, {"chosen": chosen, "worst": worst}
    study.data_layers = sorted({*study.layers, chosen, worst})
    study.sweep_spec = bridge_spec(config, "sweep.budget", study.seed)
    study.spec = bridge_spec(config, "budget", study.seed)
    study.budget = matched_budget(config, study.seed, run.backbone.width)
