"""A run's progress over all its seeds: each seed's plan (``plan.seed_units``), the units claimed
so far, the compute time of each seed's stages, and one bar over every unit of every seed.

Executors claim a stage's items before running them (:meth:`Progress.claim`), which checks them
against the plan, and report each one done with its time (:meth:`Progress.finish`), in whatever
order they finish."""

from __future__ import annotations

from tqdm.auto import tqdm

from dihal_bench.study.executors.base import Item
from dihal_bench.study.plan import Unit


class Progress:
    def __init__(self, plans: dict[int, list[Unit]], desc: str, enabled: bool = True):
        self.plans = plans
        self.claimed: dict[int, list[str]] = {seed: [] for seed in plans}
        self.seconds: dict[int, dict[str, float]] = {seed: {} for seed in plans}
        self.stage_of: dict[tuple[int, str], str] = {}
        self.bar = tqdm(total=sum(map(len, plans.values())), desc=desc, unit="unit", disable=not enabled)

    def claim(self, items: list[Item]) -> None:
        """Each item is its seed's next planned unit, in order: the runner never leaves its plan."""
        for item in items:
            plan, done = self.plans[item.seed], self.claimed[item.seed]
            expected = plan[len(done)].label if len(done) < len(plan) else None
            if item.label != expected:
                raise AssertionError(f"the runner left its plan: seed {item.seed} doing {item.label!r}, "
                                     f"planned {expected!r}")
            self.stage_of[item.seed, item.label] = plan[len(done)].stage
            done.append(item.label)

    def start(self, item: Item) -> None:
        self.bar.set_postfix_str(f"seed {item.seed}: {item.label}")

    def finish(self, item: Item, seconds: float) -> None:
        """``item`` is done after ``seconds`` of its own compute; its seed's stage gets them."""
        stage = self.stage_of[item.seed, item.label]
        self.seconds[item.seed][stage] = self.seconds[item.seed].get(stage, 0.0) + seconds
        self.bar.update(1)

    def check_complete(self) -> None:
        for seed, plan in self.plans.items():
            if self.claimed[seed] != [unit.label for unit in plan]:
                raise AssertionError(f"seed {seed}: the runner did {self.claimed[seed]}, planned "
                                     f"{[unit.label for unit in plan]}")

    def close(self) -> None:
        self.bar.close()
