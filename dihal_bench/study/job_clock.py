"""What a process's jobs cost, and which code did them.

A stage's compute is its wall time plus the stored seconds of every finished job it took from a store
(so that a resumed run reports what its stages cost, not only what was left of them) plus the training
of every checkpoint it resumed from, less the remakes of pruned artifacts (counted when their jobs were
first done). Each job counts once per process: a later stage that takes a job again (the frontier loads
a row's trained weights through the training job) adds nothing, since that job's time is already the
stage's that did it or first took it. The log of jobs, each with the revision of the code and the
machine that did it and the seconds it added to the count, is what `dihal_bench.study.metering` reads."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dihal_bench.study.pruned import remade_seconds
from dihal_bench.training.resumed import resumed_seconds

#: the seconds of work this process has taken from stores instead of doing it again: what each
#: reused job took when it was done (a job stored before its time was kept counts 0)
_reused_seconds = 0.0
#: the job folders this process has done or counted as reused: none counts twice
_counted: set[str] = set()


@dataclass(frozen=True)
class LoggedJob:
    """One job this process did or took from a store. ``revision``, ``host`` (a host-name digest,
    `dihal_bench.base.provenance.host_id`), ``cpu`` and ``boot`` (`dihal_bench.base.provenance.boot_id`):
    the code and the machine that did it, None where its result.json was written before it named them.
    ``seconds``: what it added to the process's count of compute, 0 for a job already counted."""

    folder: str
    revision: str | None
    host: str | None
    cpu: str | None
    boot: str | None
    seconds: float


#: every job this process did or took from a store, in order
_job_log: list[LoggedJob] = []


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _machine(machine: object) -> tuple[str | None, str | None, str | None]:
    """(host digest, CPU model, boot) of a result.json's ``machine``, Nones where it has none."""
    machine = machine if isinstance(machine, dict) else {}
    return _text(machine.get("host_sha256")), _text(machine.get("cpu")), _text(machine.get("boot"))


def job_done(folder: str, revision: str | None, seconds: float, machine: dict) -> None:
    """A job this process did on ``machine`` in ``seconds`` (in its stage's wall time): logged, and
    not counted again."""
    _counted.add(folder)
    _job_log.append(LoggedJob(folder, revision, *_machine(machine), seconds))


def job_reused(folder: str, seconds: object, revision: object, machine: object = None) -> None:
    """A finished job taken from a store: logged, its stored seconds counted the first time."""
    global _reused_seconds
    counted = 0.0
    if folder not in _counted:
        _counted.add(folder)
        counted = float(seconds) if isinstance(seconds, (int, float)) else 0.0
        _reused_seconds += counted
    _job_log.append(LoggedJob(folder, _text(revision), *_machine(machine), counted))


def job_mark() -> int:
    """A mark in this process's job log, for :func:`jobs_since`."""
    return len(_job_log)


def jobs_since(mark: int) -> list[LoggedJob]:
    """The jobs this process did or reused since ``mark``, in order (a job taken twice twice)."""
    return _job_log[mark:]


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
