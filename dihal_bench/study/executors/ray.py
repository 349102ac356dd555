"""The Ray executor: the items of a stage run in parallel on Ray actors (docs/executors.md).

Why actors and not tasks: a unit of work needs the backbone and the evaluator, which take seconds
to minutes to load. An actor holds one :class:`~dihal_bench.study.runner.Run`, whose models load lazily
on its first job and stay loaded for every later one; `ray.util.ActorPool` hands each actor the
next item as soon as it is free.

What makes it safe: every item does its work through the run's job store, which must be on a
path every worker sees (one machine, or a shared filesystem). A worker killed mid-job is restarted
by Ray and its item sent again (``max_restarts`` / ``max_task_retries``); the job finds its folder
as it was and resumes from its own checkpoint, so the numbers are those of an uninterrupted run,
and jobs that had finished are read back, not redone. The driver keeps the plan and the record.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter
from pathlib import Path

import ray
from ray.util import ActorPool
from tqdm.auto import tqdm

from dihal_bench.errors import DihalError
from dihal_bench.study.estimate import worker_memory
from dihal_bench.study.executors.base import Executor, Item
from dihal_bench.study.job_clock import timed
from dihal_bench.study.jobs import LOCK
from dihal_bench.study.plan import METHOD_STAGES, seed_units

#: how often Ray restarts a worker that died, and sends again the item it was doing
RESTARTS = 3
#: the logger of Ray's notice that a new local instance uses token authentication
AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"


class RunWorker:
    """A Ray actor's state: one Run on the shared job store, with ``threads`` torch threads on CPU."""

    def __init__(self, run_class: type, suite: str, config: dict, out_root: str, device: str, threads: int | None):
        import torch
        from transformers.utils import logging as transformers_logging

        from dihal_bench.config.settings import SuiteConfig

        if threads:
            torch.set_num_threads(threads)
        transformers_logging.disable_progress_bar()  # the driver shows the progress; workers stay quiet
        self.run = run_class(suite, SuiteConfig.from_checked(config), Path(out_root), progress=False, device=device)

    def hello(self, holder: str) -> dict:
        """Who this worker is, and whether it sees the driver's job store: the store's lock file
        names the driver's pid (``holder``), which a same-named folder elsewhere would not."""
        lock = self.run.store.root / LOCK
        sees = lock.exists() and lock.read_text().strip() == holder
        return {"pid": os.getpid(), "host": socket.gethostname(), "sees_store": sees}

    def work(self, index: int, fn, args: tuple) -> tuple[int, object, float, float]:
        """``fn(run, *args)``, with its time on this worker (the stored time of the jobs it reused
        included) and its wall time (:func:`timed`)."""
        return (index, *timed(fn, self.run, *args))


class RayExecutor(Executor):
    """Each stage's items on a pool of ``workers`` actors (by default as many as the cluster's
    CPUs, or GPUs for a CUDA suite, allow, and no more than the widest stage has items)."""

    driver_device = "cpu"
    computes_here = False

    def __init__(self, address: str | None = None, workers: int | None = None, cpus_per_worker: int = 1):
        self.address, self.workers, self.cpus_per_worker = address, workers, cpus_per_worker
        self.connected = False  # whether this executor called ray.init (and so calls ray.shutdown)
        self.actors: list = []
        self.pids: list[int] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, run, progress=None) -> RayExecutor:
        super().start(run, progress)
        if not ray.is_initialized():
            self._connect()
        try:
            self._start_workers(run)
        except BaseException:
            self.close()
            raise
        return self

    def _connect(self) -> None:
        """Join the cluster at ``address`` (or $RAY_ADDRESS), or start a local instance with this
        machine's CPUs (or ``workers`` of them). Workers' output comes to this stderr; Ray's own
        logs only from WARNING, and not its notice that the cluster uses token authentication (its
        default, not a problem)."""
        address = self.address or os.environ.get("RAY_ADDRESS")
        auth = logging.getLogger(AUTH_LOGGER)
        level = auth.level
        auth.setLevel(logging.ERROR)
        try:
            if address:
                ray.init(address=address, logging_level=logging.WARNING)
            else:
                cpus = self.workers * self.cpus_per_worker if self.workers else os.cpu_count()
                ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
        finally:
            auth.setLevel(level)
        self.connected = True

    def _start_workers(self, run) -> None:
        gpu = str(run.config.device).startswith("cuda")
        count = self._count(run, gpu)
        # On CPU the models live in host memory, so Ray is told what a worker holds (the plan's
        # estimate) and places no more workers on a node than its memory takes; on a GPU the
        # weights live on the worker's own device.
        memory = None if gpu else worker_memory(run.config)
        remote = ray.remote(RunWorker).options(
            num_cpus=self.cpus_per_worker, num_gpus=1 if gpu else 0, **({"memory": memory} if memory else {}),
            max_restarts=RESTARTS, max_task_retries=RESTARTS)
        # each actor sees exactly its one GPU (Ray sets CUDA_VISIBLE_DEVICES), so "cuda" is it
        self.actors = [remote.remote(type(run), run.suite, run.config.to_dict(), str(run.out_root.resolve()),
                                     "cuda" if gpu else "cpu", None if gpu else self.cpus_per_worker)
                       for _ in range(count)]
        holder = (run.store.root / LOCK).read_text().strip()
        hellos = ray.get([actor.hello.remote(holder) for actor in self.actors])
        blind = sorted({hello["host"] for hello in hellos if not hello["sees_store"]})
        if blind:
            raise DihalError(f"the job store {run.store.root.resolve()} is not visible to the Ray workers on "
                             f"{', '.join(blind)}: put --out on a filesystem every node mounts at the same path")
        self.pids = [hello["pid"] for hello in hellos]

    def _count(self, run, gpu: bool) -> int:
        """``workers``, or as many workers as the cluster holds but no more than the widest stage
        has items (over all seeds: a stage's items of every seed are one map). More than the cluster holds would wait for resources that never come: an error."""
        resources = ray.cluster_resources()
        room = int(resources.get("GPU", 0)) if gpu else int(resources.get("CPU", 0) // self.cpus_per_worker)
        what = "GPU" if gpu else f"{self.cpus_per_worker} CPU"
        if room < 1 or (self.workers or 0) > room:
            raise DihalError(f"the Ray cluster has room for {room} worker(s) of {what} each "
                             f"({', '.join(f'{k} {v:g}' for k, v in sorted(resources.items()) if k in ('CPU', 'GPU'))})"
                             + (f", not --workers {self.workers}" if self.workers else ""))
        if self.workers:
            return self.workers
        stages = Counter("methods" if unit.stage in METHOD_STAGES else unit.stage
                         for unit in seed_units(run.config, run.backbone.num_layers))
        return min(room, max(stages.values()) * len(run.config.seeds))

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        if self.connected:
            ray.shutdown()
            self.connected = False

    # -- work -----------------------------------------------------------------------------------
    def map(self, stage: str, fn, items: list[Item]) -> list:
        """The stage's items (of every seed) on the pool, results in item order; each item's time on
        its worker goes to its seed's stage."""
        run, progress = self.run, self.progress
        if progress is not None:
            progress.claim(items)
        if not items:
            return []
        pool = ActorPool(self.actors)
        for index, item in enumerate(items):
            pool.submit(lambda actor, job: actor.work.remote(*job), (index, fn, item.args))
        results: list = [None] * len(items)
        bar = tqdm(total=len(items), desc=stage, unit="unit", leave=False, disable=not run.progress)

        def status(done: int) -> None:
            running = min(len(self.actors), len(items) - done)
            bar.set_postfix_str(f"{done} done, {running} running, {len(items) - done - running} queued",
                                refresh=False)

        try:
            status(0)
            for done in range(1, len(items) + 1):
                index, results[index], seconds, wall = self._next(pool, stage)
                status(done)
                bar.update(1)
                if progress is not None:
                    progress.finish(items[index], seconds, wall)
        finally:
            bar.close()
        return results

    @staticmethod
    def _next(pool: ActorPool, stage: str) -> tuple[int, object, float, float]:
        """The next finished item; a unit's own error is raised as itself (a DihalError stays one
        line), a worker that died more than RESTARTS times as a DihalError."""
        try:
            return pool.get_next_unordered()
        except ray.exceptions.RayTaskError as exc:
            raise (exc.cause if isinstance(exc.cause, BaseException) else exc) from exc
        except ray.exceptions.RayActorError as exc:
            raise DihalError(f"stage {stage}: a Ray worker died {RESTARTS + 1} times ({str(exc).splitlines()[0]}); "
                             "the jobs finished so far stay in the store: run again to resume") from exc
