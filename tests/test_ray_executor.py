"""The Ray executor (docs/executors.md): the tiny suite of test_runner.py run on Ray actors gives
the record the local executor gives, and a worker killed with SIGKILL mid-training is restarted,
its job resumes from its checkpoint, nothing finished is redone and the numbers do not change."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_runner import run_cli, tiny_suite  # noqa: F401  (tiny_suite: the fixture of a tiny suite)

from dihal_bench.config.suite import apply_overrides, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.study.executors import Item, LocalExecutor, make_executor
from dihal_bench.study.plan import Unit
from dihal_bench.study.progress import Progress
from dihal_bench.study.run import Run
from dihal_bench.study.runner import run_suite
from dihal_bench.study.stages.methods import method_row

ray = pytest.importorskip("ray")
from dihal_bench.study.executors.ray import RayExecutor  # noqa: E402  (needs ray)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the local run on one thread, as each actor

#: what differs between two runs of the same suite that compute the same numbers: when and where
#: the record was made, and wall-clock measurements
# measurements of the invocation, not results; and under Ray the stages' jobs are not the driver's to count
RECORD_EXCLUDED = ("created", "environment", "timings", "contention", "provenance", "jobs", "integrity")
PER_SEED_EXCLUDED = ("latency",  # every method's decode timings (and the latency job's result)
                     "timings",  # locate's extraction and proxy seconds
                     "train_seconds", "wall_seconds")  # training wall time of bridges and baselines

#: a sweep long enough (and checkpointed often enough) to be killed in the middle of its training;
#: two seeds, whose items of a stage the runner hands to the executor together
SWEEP_STEPS = 60
OVERRIDES = {"sweep.budget": f"{{ steps = {SWEEP_STEPS}, batch_size = 4, seq_len = 16, checkpoint_every = 5 }}",
             "seeds": "[0, 1]"}


def comparable(record: dict) -> dict:
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in PER_SEED_EXCLUDED}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    # the stages' FLOPs are counted from shapes (equal); their seconds and FLOP/s are wall clock
    compute = {stage: entry["flops"] for stage, entry in record["compute"].items()}
    estimate = {k: v for k, v in record["estimate"].items() if k != "created"}  # when each run first priced itself
    return {**{k: v for k, v in record.items() if k not in (*RECORD_EXCLUDED, "per_seed", "compute", "estimate")},
            "compute": compute, "estimate": estimate, "per_seed": strip(record["per_seed"])}


@pytest.fixture(scope="module")
def suite(tiny_suite):  # noqa: F811
    name, config = resolve_suite(str(tiny_suite))
    return name, apply_overrides(config, OVERRIDES)


@pytest.fixture(scope="module")
def local_ray():
    """A Ray instance of this test process: 2 CPUs on 127.0.0.1, shut down after the module."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             logging_level=logging.WARNING)
    try:
        yield
    finally:
        ray.shutdown()


def record_of(suite, root: Path, executor) -> dict:
    """The suite run in this process under ``executor``, into ``root``: its record."""
    name, config = suite
    path = run_suite(name, config, out_root=root / "runs", results_dir=root / "results", progress=False,
                     executor=executor)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def local_record(suite, tmp_path_factory) -> dict:
    return record_of(suite, tmp_path_factory.mktemp("local"), LocalExecutor())


def finished(jobs: Path) -> dict[str, int]:
    """The finished jobs of a store: folder name -> result.json's mtime."""
    return {path.parent.name: path.stat().st_mtime_ns for path in jobs.glob("*/result.json")}


def training_step(jobs: Path) -> int | None:
    """The step of a sweep layer's checkpoint in the middle of its training, if there is one."""
    for trainer in jobs.glob("sweep-layer-*/checkpoint/trainer.json"):
        try:
            step = json.loads(trainer.read_text())["step"]
        except (OSError, ValueError):  # being replaced just now
            continue
        if 0 < step < SWEEP_STEPS:
            return step
    return None


class WatchedRayExecutor(RayExecutor):
    """A RayExecutor that notes, per stage, the seeds of the items each map call held."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, list[int]]] = []

    def map(self, stage, fn, items):
        self.calls.append((stage, sorted({item.seed for item in items})))
        return super().map(stage, fn, items)


@pytest.fixture(scope="module")
def ray_run(suite, local_ray, tmp_path_factory) -> tuple[Path, dict, WatchedRayExecutor]:
    """(the run's root folder, its record, its executor): the suite on two Ray actors."""
    root = tmp_path_factory.mktemp("ray")
    executor = WatchedRayExecutor()
    return root, record_of(suite, root, executor), executor


def test_the_ray_executor_gives_the_local_executors_record(ray_run, local_record):
    _, record, executor = ray_run
    assert record["seeds"] == [0, 1]
    assert comparable(record) == comparable(local_record)
    assert [s["units"] for s in record["per_seed"]] == [s["units"] for s in local_record["per_seed"]]
    # every stage but latency is one call holding both seeds' items, so the two workers take both
    # seeds' jobs at once; latency times decodes, one seed at a time
    assert [(stage, seeds) for stage, seeds in executor.calls if stage != "latency"] == \
        [(stage, [0, 1]) for stage in ("locate", "targets", "sweep", "methods", "steps", "metrics")]
    assert [seeds for stage, seeds in executor.calls if stage == "latency"] == [[0], [1]]
    assert len(executor.pids) == 2
    # each unit's time on its worker, under its own stage
    assert {"locate", "sweep", "dihal", "metrics", "latency", "total_seconds"} <= set(record["timings"])
    # the work ran in the workers: the driver says so instead of passing off its own CPU time or jobs
    assert all(e["where"] == "other processes" and e["cpu_share"] is None for e in record["contention"].values())
    assert all(stage["jobs"] is None for stage in record["provenance"]["stages"].values())


def test_the_cli_joins_a_cluster_by_address_redoes_nothing_and_keeps_stderr_clean(
        ray_run, local_record, tiny_suite):  # noqa: F811
    root, record, _ = ray_run
    jobs = root / "runs" / record["suite"] / "jobs"
    before = finished(jobs)
    address = ray.get_runtime_context().gcs_address
    result = run_cli("run", "--suite", str(tiny_suite), *(f"--set={k}={v}" for k, v in OVERRIDES.items()),
                     "--executor", "ray", "--address", address, "--workers", "2", "--quiet",
                     "--out", str(root / "runs"), "--results", str(root / "again"))
    assert result.returncode == 0 and result.stderr == "", result.stderr[-3000:]
    assert finished(jobs) == before  # every job was found done
    [path] = (root / "again").glob("*.json")
    assert comparable(json.loads(path.read_text())) == comparable(local_record)


def test_a_worker_killed_mid_training_is_restarted_and_the_run_gives_the_same_numbers(
        suite, local_ray, local_record, tmp_path):
    executor = RayExecutor()
    jobs = tmp_path / "runs" / suite[0] / "jobs"
    outcome: dict = {}

    def drive():
        try:
            outcome["record"] = record_of(suite, tmp_path, executor)
        except BaseException as exc:  # handed to the test's thread
            outcome["error"] = exc

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        # waits, not speed checks: generous for a slow, loaded 2-core machine
        deadline = time.monotonic() + 600
        while training_step(jobs) is None:  # a sweep layer's training has checkpointed and goes on
            assert driver.is_alive() and time.monotonic() < deadline, outcome or "no training checkpoint appeared"
            time.sleep(0.02)
        assert len(executor.pids) == 2
        for pid in executor.pids:  # every worker, the one training among them
            os.kill(pid, signal.SIGKILL)
        before = finished(jobs)
        driver.join(timeout=600)
    finally:
        # a failed wait must not leave this run's actors holding the cluster's two CPUs: the next
        # test's worker would wait for them forever (CI's lowest job hung so after this test failed)
        if driver.is_alive():
            executor.close()
    assert not driver.is_alive() and "error" not in outcome, outcome.get("error")  # the killed items were retried
    assert finished(jobs).items() >= before.items()  # nothing finished before the kill was redone
    assert comparable(outcome["record"]) == comparable(local_record)


def test_a_units_error_on_a_worker_is_raised_as_itself(suite, local_ray, tmp_path):
    run = Run(suite[0], suite[1], tmp_path, progress=False)
    progress = Progress({0: [Unit("baselines", "nope")]}, "test", enabled=False)
    with run.store.lock(), RayExecutor(workers=1).start(run, progress) as executor:
        with pytest.raises(DihalError) as caught:
            executor.map("methods", method_row, [Item("nope", ("baseline", "nope", {}, None, None, 0, [], {}), 0)])
    # the plugin registry's own one-line error, not Ray's wrapper with the worker's traceback
    assert type(caught.value) is DihalError and str(caught.value).startswith("unknown baseline 'nope'")


def test_more_workers_than_the_cluster_holds_is_an_error_not_a_wait(suite, local_ray):
    with pytest.raises(DihalError, match=r"room for 2 worker\(s\) of 1 CPU each \(CPU 2\), not --workers 3"):
        RayExecutor(workers=3)._count(SimpleNamespace(config=suite[1]), gpu=False)


def test_ray_options_without_the_ray_executor_and_a_missing_ray_are_one_line_errors(monkeypatch):
    with pytest.raises(DihalError, match="--address and --workers are options of --executor ray"):
        make_executor("local", address="127.0.0.1:6379")
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(DihalError, match=r"pip install 'dihal-bench\[ray\]'"):
        make_executor("ray")
