"""A run's progress over all its seeds: each seed's plan (``plan.seed_units``), the units claimed
so far, the compute time of each seed's stages, and one bar over every unit of every seed.

Executors claim a stage's items before running them (:meth:`Progress.claim`), which checks them
against the plan, and report each one done with its time (:meth:`Progress.finish`), in whatever
order they finish.

The bar advances by each unit's estimated seconds, not by one per unit: a run's units differ in
cost by a factor of a hundred (a drawn reference against a latency job), so a per-unit average
says little about the time left, while the estimated seconds done per second of wall time,
applied to the estimated seconds left, weights every remaining unit by its own cost."""

from __future__ import annotations

from tqdm.auto import tqdm

from dihal_bench.study.executors.base import Item
from dihal_bench.study.plan import Unit

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]"


class Progress:
    def __init__(self, plans: dict[int, list[Unit]], desc: str, enabled: bool = True,
                 costs: dict[int, list[float]] | None = None):
        """``costs``: each planned unit's estimated seconds, in the plan's order (by default one each)."""
        self.plans = plans
        self.costs = costs or {seed: [1.0] * len(plan) for seed, plan in plans.items()}
        if any(len(self.costs[seed]) != len(plan) for seed, plan in plans.items()):
            raise AssertionError("a cost for every planned unit")
        self.claimed: dict[int, list[str]] = {seed: [] for seed in plans}
        self.seconds: dict[int, dict[str, float]] = {seed: {} for seed in plans}
        self.stage_of: dict[tuple[int, str], str] = {}
        self.cost_of: dict[tuple[int, str], float] = {}
        self.total_units = sum(map(len, plans.values()))
        self.done_units, self.done_cost = 0, 0.0
        self.bar = tqdm(total=sum(map(sum, self.costs.values())), desc=desc, bar_format=BAR_FORMAT,
                        disable=not enabled)
        self._label = ""
        self._show()

    def claim(self, items: list[Item]) -> None:
        """Each item is its seed's next planned unit, in order: the runner never leaves its plan."""
        for item in items:
            plan, done = self.plans[item.seed], self.claimed[item.seed]
            expected = plan[len(done)].label if len(done) < len(plan) else None
            if item.label != expected:
                raise AssertionError(f"the runner left its plan: seed {item.seed} doing {item.label!r}, "
                                     f"planned {expected!r}")
            self.stage_of[item.seed, item.label] = plan[len(done)].stage
            self.cost_of[item.seed, item.label] = self.costs[item.seed][len(done)]
            done.append(item.label)

    def start(self, item: Item) -> None:
        self._label = f"seed {item.seed}: {item.label}"
        self._show()

    def finish(self, item: Item, seconds: float, wall: float | None = None) -> None:
        """``item`` is done after ``seconds`` of its own compute; its seed's stage gets them.

        ``wall``: the part of them this run spent (the rest was found done in the store, or in
        a checkpoint); that share of the unit's cost is taken off the bar's total instead of
        advancing it, so the ETA extrapolates from work done now. A resumed run whose store held
        40% of the plan would otherwise finish 40% in its first second and promise the rest at
        that pace."""
        stage = self.stage_of[item.seed, item.label]
        self.seconds[item.seed][stage] = self.seconds[item.seed].get(stage, 0.0) + seconds
        self.done_units += 1
        cost = self.cost_of[item.seed, item.label]
        self.done_cost += cost
        found = 0.0 if wall is None or seconds <= 0 else min(max(1.0 - wall / seconds, 0.0), 1.0)
        self.bar.total -= cost * found
        self.bar.update(cost * (1.0 - found))
        self._show()

    def _show(self) -> None:
        self.bar.set_postfix_str(f"{self.done_units}/{self.total_units} units"
                                 + (f", {self._label}" if self._label else ""))

    def check_complete(self) -> None:
        for seed, plan in self.plans.items():
            if self.claimed[seed] != [unit.label for unit in plan]:
                raise AssertionError(f"seed {seed}: the runner did {self.claimed[seed]}, planned "
                                     f"{[unit.label for unit in plan]}")

    def close(self) -> None:
        self.bar.close()
