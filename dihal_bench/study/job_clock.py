"""What a process's jobs cost, and which code did them.

A stage's compute is its wall time plus the stored seconds of every finished job it took from a store
(so that a resumed run reports what its stages cost, not only what was left of them) plus the training
of every checkpoint it resumed from, less the remakes of pruned artifacts (counted when their jobs were
first done). Each job counts once per process: a later stage that takes a job again (the frontier loads
a row's trained weights through the training job) adds nothing, since that job's time is already the
stage's that did it or first took it. The log of jobs with the revision of the code that did each is
what `dihal_bench.study.metering` reads."""

from __future__ import annotations

import time
from collections.abc import Callable

from dihal_bench.study.pruned import remade_seconds
from dihal_bench.training.resumed import resumed_seconds

#: the seconds of work this process has taken from stores instead of doing it again: what each
#: reused job took when it was done (a job stored before its time was kept counts 0)
_reused_seconds = 0.0
#: the job folders this process has done or counted as reused: none counts twice
_counted: set[str] = set()
#: (job folder, revision of the code that did it) of every job this process did or took from a
#: store, in order (None: a job stored before result.json named its revision)
_job_log: list[tuple[str, str | None]] = []


def job_done(folder: str, revision: str | None) -> None:
    """A job this process did: logged, and its time (in its stage's wall time) not counted again."""
    _counted.add(folder)
    _job_log.append((folder, revision))


def job_reused(folder: str, seconds: object, revision: object) -> None:
    """A finished job taken from a store: logged, its stored seconds counted the first time."""
    global _reused_seconds
    if folder not in _counted:
        _counted.add(folder)
        _reused_seconds += seconds if isinstance(seconds, (int, float)) else 0.0
    _job_log.append((folder, revision if isinstance(revision, str) else None))


def job_mark() -> int:
    """A mark in this process's job log, for :func:`jobs_since`."""
    return len(_job_log)


def jobs_since(mark: int) -> dict[str, str | None]:
    """The revision of each job (by folder) this process did or reused since ``mark``."""
    return dict(_job_log[mark:])


def carried() -> float:
    """What this process's clock misses of its work so far: the training of every checkpoint it
    resumed from, less the remakes of pruned artifacts (counted when their jobs were done)."""
    return resumed_seconds() - remade_seconds()


def timed(fn: Callable, *args) -> tuple[object, float, float]:
    """``fn(*args)``, the compute it stands for (the module's docstring) and its wall time (what
    this process spent: what a run's ETA extrapolates)."""
    reused, carried_before, started = _reused_seconds, carried(), time.perf_counter()
    result = fn(*args)
    wall = time.perf_counter() - started
    return result, wall + _reused_seconds - reused + carried() - carried_before, wall
