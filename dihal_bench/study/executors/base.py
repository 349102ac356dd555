"""The executor contract: ``map(stage, fn, items)`` runs independent items, results in item order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Item:
    """One unit of work of a stage: ``fn(run, *args)`` for seed ``seed``. ``label`` is the plan's
    name for it (:func:`dihal_bench.study.plan.seed_units`), which the run's progress checks it
    against and its bar shows."""

    label: str
    args: tuple = ()
    seed: int = 0


class Executor:
    """Runs the items of one stage of a run; subclasses say where.

    ``fn`` is a module-level function (so that it can be shipped to another process by reference)
    taking the Run it executes on and the item's arguments. Items of one stage must not depend on
    each other: an executor may run them in any order and at the same time. Each item runs its
    jobs through ``run.store``, so an executor only decides where and when, never what is stored.
    """

    #: the device the driver loads the backbone on, None for the suite's own: a driver that only
    #: plans and assembles the record needs the tokenizer and the layer count, not the accelerator
    driver_device: str | None = None
    #: whether the work happens on this machine (so that the suite's device must exist here)
    computes_here = True

    def start(self, run, progress=None) -> Executor:
        """Bind to ``run`` (a :class:`dihal_bench.study.run.Run`: its config, its job store) and to the
        run's ``progress`` (a :class:`dihal_bench.study.progress.Progress`, which checks each stage's
        items against the plan and times them; None: unchecked), ready to map; returns self.
        Executors sit below the run and its progress, so they take both without importing them."""
        self.run, self.progress = run, progress
        return self

    def map(self, stage: str, fn: Callable[..., Any], items: list[Item]) -> list[Any]:
        """``fn(run, *item.args)`` for every item (of any seeds), results in item order."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what :meth:`start` acquired (processes, a cluster connection)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
