"""The local executor: every item in order, in this process, as ``dihal-bench run`` always did."""

from __future__ import annotations

from dihal_bench.study.executors.base import Executor, Item
from dihal_bench.study.job_clock import timed


class LocalExecutor(Executor):
    """Items one after the other: all are checked against the plan first, then each one's time
    (its wall time and the stored time of the jobs it reused) goes to its seed's stage and the
    run's bar advances."""

    def map(self, stage: str, fn, items: list[Item]) -> list:
        if self.progress is not None:
            self.progress.claim(items)
        results = []
        for item in items:
            if self.progress is not None:
                self.progress.start(item)
            result, seconds, wall = timed(fn, self.run, *item.args)
            results.append(result)
            if self.progress is not None:
                self.progress.finish(item, seconds, wall)
        return results
