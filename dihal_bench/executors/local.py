"""The local executor: every item in order, in this process, as ``dihal-bench run`` always did."""

from __future__ import annotations

from dihal_bench.executors.base import Executor, Item


class LocalExecutor(Executor):
    """Items one after the other through ``run.timed``: each is checked against the plan, its wall
    time is added to its unit's stage in ``run.timings``, and the seed's bar advances."""

    def map(self, stage: str, fn, items: list[Item]) -> list:
        return [self.run.timed(item.label, fn, self.run, *item.args) for item in items]
