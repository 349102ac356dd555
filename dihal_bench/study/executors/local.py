"""The local executor: every item in order, in this process, as ``dihal-bench run`` always did."""

from __future__ import annotations

import time

from dihal_bench.study.executors.base import Executor, Item


class LocalExecutor(Executor):
    """Items one after the other: all are checked against the plan first, then each one's wall
    time goes to its seed's stage and the run's bar advances."""

    def map(self, stage: str, fn, items: list[Item]) -> list:
        if self.progress is not None:
            self.progress.claim(items)
        results = []
        for item in items:
            if self.progress is not None:
                self.progress.start(item)
            started = time.perf_counter()
            results.append(fn(self.run, *item.args))
            if self.progress is not None:
                self.progress.finish(item, time.perf_counter() - started)
        return results
