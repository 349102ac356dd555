"""What each stage of a run ran on and how contended the machine was while it ran.

:class:`MeteredExecutor` stands between the runner and its executor and measures every
``map(stage, ...)`` call; :meth:`MeteredExecutor.sections` gives the record's two sections.

``contention``, per stage: ``wall_s`` (the stage's wall time in this invocation), ``cpu_s`` (the
CPU time, user and system, of this process and of its children that finished), ``threads`` (torch's
intra-op threads), ``cpu_share`` = cpu_s / (wall_s × threads), and ``load_start`` / ``load_end``,
the machine's 1-minute load average when the stage started and ended (None where the system has
none), and ``remade_s``, the seconds spent making pruned artifacts of earlier jobs again
(`dihal_bench.study.pruned`: part of wall_s, not of the stage's time in ``timings``). A share near
1.0 means our threads were busy the whole stage; a share well below 1 while the load is above the
machine's core count (``environment.cpu_count``) means other processes had the cores, and the
stage's times say less about the method than about the machine. A share below 1 with a low load is
the work's own: waiting on disk, on a GPU (a CUDA stage's host threads mostly wait), or
single-threaded steps. Stages whose jobs were all found in the store take milliseconds, so their
share is noise. With an executor whose work runs in other processes (Ray), ``cpu_s`` is only the
driver's own time and ``cpu_share`` is None: the workers' CPU time is not measured (``where`` says
which); the load averages are still this machine's.

``provenance``: per stage the revision of this invocation (``process``) and the revisions the
stage's jobs were done with (``jobs``: each revision with how many jobs; a job found in the store
was done with the revision its result.json names, perhaps by an earlier invocation, and None
names jobs stored before result.json named one), then ``revisions``, each distinct revision with
the stages whose jobs it did. Per stage also ``machines``: each machine its jobs were done on
(``host_sha256``, ``cpu``, ``boot``; None for jobs stored before result.json named them) with how many
jobs and the ``seconds`` they add to the stage's time in ``timings`` (a job counts once per process,
`dihal_bench.study.job_clock`): so a stage's time says how much of it another machine's speed made.
Under Ray the jobs run in the workers, so a stage's ``jobs`` and ``machines`` are None (each job's
result.json still names its revision and machine).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import torch

from dihal_bench.study.executors.base import Executor, Item
from dihal_bench.study.job_clock import LoggedJob, job_mark, jobs_since
from dihal_bench.study.pruned import remade_seconds

try:
    import resource
except ImportError:  # not on Windows: process_time covers this process alone
    resource = None

#: ``contention[stage]["where"]``: the stage's work ran in this process, or in others (a driver's view)
HERE, ELSEWHERE = "this process", "other processes"


def cpu_seconds() -> float:
    """User and system CPU time of this process and of its waited-for children."""
    if resource is None:
        return time.process_time()
    return sum(usage.ru_utime + usage.ru_stime for usage in (resource.getrusage(resource.RUSAGE_SELF),
                                                             resource.getrusage(resource.RUSAGE_CHILDREN)))


def load_average() -> float | None:
    """The machine's 1-minute load average, None where the system keeps none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


class MeteredExecutor(Executor):
    """``executor``'s map, each call measured (the module's docstring says what); ``revision`` is
    this invocation's (the record's ``environment.git_revision``). A stage mapped more than once
    (latency: once per seed) sums its times; its load is the first call's at the start and the
    last call's at the end. Wraps an executor already started: it neither starts nor closes it."""

    def __init__(self, executor: Executor, revision: str | None):
        self.executor, self.revision = executor, revision
        self.here = self.computes_here = executor.computes_here
        self.driver_device = executor.driver_device
        self.contention: dict[str, dict] = {}
        self.jobs: dict[str, list[LoggedJob] | None] = {}

    def map(self, stage: str, fn, items: list[Item]) -> list:
        load, mark, remade = load_average(), job_mark(), remade_seconds()
        cpu, started = cpu_seconds(), time.perf_counter()
        results = self.executor.map(stage, fn, items)
        wall, cpu = time.perf_counter() - started, cpu_seconds() - cpu
        threads = torch.get_num_threads()
        entry = self.contention.setdefault(stage, {"wall_s": 0.0, "cpu_s": 0.0, "remade_s": 0.0, "load_start": load,
                                                   "calls": 0})
        entry.update(wall_s=entry["wall_s"] + wall, cpu_s=entry["cpu_s"] + cpu, threads=threads,
                     remade_s=entry["remade_s"] + remade_seconds() - remade,
                     load_end=load_average(), calls=entry["calls"] + 1, where=HERE if self.here else ELSEWHERE)
        share = entry["cpu_s"] / (entry["wall_s"] * threads) if self.here and entry["wall_s"] > 0 else None
        entry["cpu_share"] = share
        if self.here:
            self.jobs[stage] = [*(self.jobs.get(stage) or []), *jobs_since(mark)]
        else:
            self.jobs[stage] = None
        return results

    def sections(self) -> dict:
        """The record's ``contention`` and ``provenance`` sections."""
        stages, by_revision = {}, {}
        for stage, jobs in self.jobs.items():
            counts = None if jobs is None else Counter(revisions_by_job(jobs).values())
            stages[stage] = {"process": self.revision, "jobs": None if counts is None else [
                {"revision": revision, "jobs": n} for revision, n in counts.items()],
                "machines": None if jobs is None else machine_lines(jobs)}
            for revision in counts or ():
                by_revision.setdefault(revision, []).append(stage)
        # in the order the stages first met them
        revisions = [{"revision": revision, "stages": found} for revision, found in by_revision.items()]
        return {"contention": self.contention, "provenance": {"stages": stages, "revisions": revisions}}


def revisions_by_job(jobs: list[LoggedJob]) -> dict[str, str | None]:
    """Each job folder's revision, in the order the folders first appear."""
    revisions: dict[str, str | None] = {}
    for job in jobs:
        revisions.setdefault(job.folder, job.revision)
    return revisions


def machine_lines(jobs: list[LoggedJob]) -> list[dict]:
    """Per machine (in the order the jobs first met it): its jobs (each folder once) and the
    seconds they were counted."""
    lines: dict[tuple, dict] = {}
    for job in jobs:
        line = lines.setdefault((job.host, job.cpu, job.boot), {"host_sha256": job.host, "cpu": job.cpu,
                                                                 "boot": job.boot, "jobs": set(), "seconds": 0.0})
        line["jobs"].add(job.folder)
        line["seconds"] += job.seconds
    return [{**line, "jobs": len(line["jobs"])} for line in lines.values()]
