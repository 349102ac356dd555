"""A record says its own provenance: the machine (environment), the revision each job was done
with (result.json, the record's ``provenance``) and how contended each stage was (``contention``)."""

from __future__ import annotations

import hashlib
import json
import socket
import time

import pytest
import torch

from dihal_bench.base import provenance
from dihal_bench.study.executors.base import Executor, Item
from dihal_bench.study.jobs import JobStore
from dihal_bench.study.metering import ELSEWHERE, HERE, MeteredExecutor, cpu_seconds


def test_the_environment_names_the_hardware_and_only_a_digest_of_the_host():
    env = provenance.environment()
    name = socket.gethostname()
    assert env["host_sha256"] == hashlib.sha256(name.encode()).hexdigest()[:provenance.HOST_DIGITS]
    assert name not in json.dumps(env)
    assert env["cpu_count"] >= 1 and env["torch_threads"] == torch.get_num_threads()
    assert env["memory_bytes"] is None or env["memory_bytes"] > 2**20
    assert env["cuda_devices"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)
    assert env["git_revision"] == provenance.process_revision()


def test_the_cpu_model_falls_back_to_platform_then_to_none(monkeypatch, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\nflags\t: fpu\n\nprocessor\t: 1\n")
    assert provenance.cpu_model(cpuinfo) == "Some CPU @ 2.0GHz"
    cpuinfo.write_text("processor\t: 0\nCPU part\t: 0xd0c\n")  # ARM Linux: no model name
    monkeypatch.setattr(provenance.platform, "processor", lambda: "aarch64")
    assert provenance.cpu_model(cpuinfo) == "aarch64"
    monkeypatch.setattr(provenance.platform, "processor", lambda: "")
    assert provenance.cpu_model(tmp_path / "missing") is None


def test_a_job_result_names_its_revision_and_a_stage_counts_the_revisions_of_its_jobs(tmp_path, monkeypatch):
    store = JobStore(tmp_path)
    monkeypatch.setattr("dihal_bench.study.jobs.process_revision", lambda: "old")
    store.run("kind", {"a": 1}, lambda folder: {"v": 1})
    store.run("kind", {"a": 2}, lambda folder: {"v": 2})
    stored_first = json.loads((store.folder("kind", {"a": 1}) / "result.json").read_text())
    assert stored_first["revision"] == "old"
    # and the machine, so that a store carried between machines can tell their speeds apart
    assert stored_first["machine"] == {"cpu": provenance.cpu_model(), "host_sha256": provenance.host_id(),
                                       "boot": provenance.boot_id()}
    # a job stored before results named their revision: the revision is outside the result's sha256
    unnamed = store.folder("kind", {"a": 2}) / "result.json"
    stored = json.loads(unnamed.read_text())
    del stored["revision"]
    unnamed.write_text(json.dumps(stored))

    monkeypatch.setattr("dihal_bench.study.jobs.process_revision", lambda: "new")
    metered = MeteredExecutor(InProcess(), "new")
    metered.map("sweep", lambda run, spec: store.run("kind", spec, lambda folder: {"v": 0}),
                [Item("x", ({"a": a},)) for a in (1, 2, 3, 1)])  # the same job twice counts once
    metered.map("metrics", lambda run, spec: store.run("kind", spec, lambda folder: {"v": 0}),
                [Item("y", ({"a": 3},))])
    section = metered.sections()["provenance"]
    assert section["stages"]["sweep"]["process"] == "new"
    assert section["stages"]["sweep"]["jobs"] == [{"revision": "old", "jobs": 1}, {"revision": None, "jobs": 1},
                                                  {"revision": "new", "jobs": 1}]
    assert section["revisions"] == [{"revision": "old", "stages": ["sweep"]},
                                    {"revision": None, "stages": ["sweep"]},
                                    {"revision": "new", "stages": ["sweep", "metrics"]}]


def test_a_stage_says_which_machines_did_its_jobs_and_the_seconds_each_added(tmp_path, monkeypatch):
    store = JobStore(tmp_path)
    for a in (1, 2):
        store.run("kind", {"a": a}, lambda folder: {"v": a})
    # as a store carried from another machine holds them: one made elsewhere, one from before jobs named it
    for a, seconds, machine in ((1, 7.0, {"cpu": "Other CPU", "host_sha256": "abc"}), (2, 3.0, None)):
        path = store.folder("kind", {"a": a}) / "result.json"
        stored = json.loads(path.read_text()) | {"seconds": seconds}  # outside the result's sha256, as machine is
        stored.pop("machine")
        path.write_text(json.dumps(stored | ({"machine": machine} if machine else {})))
    monkeypatch.setattr("dihal_bench.study.job_clock._counted", set())  # a process that resumes the run

    metered = MeteredExecutor(InProcess(), "rev")
    metered.map("sweep", lambda run, spec: store.run("kind", spec, lambda folder: {"v": 0}),
                [Item("x", ({"a": a},)) for a in (1, 2, 3, 1)])
    metered.map("frontier", lambda run, spec: store.run("kind", spec, lambda folder: {"v": 0}),
                [Item("y", ({"a": 1},))])
    stages = metered.sections()["provenance"]["stages"]
    other, unnamed, here = stages["sweep"]["machines"]
    assert other == {"host_sha256": "abc", "cpu": "Other CPU", "boot": None, "jobs": 1, "seconds": 7.0}  # once counted
    assert unnamed == {"host_sha256": None, "cpu": None, "boot": None, "jobs": 1, "seconds": 3.0}
    assert (here["host_sha256"], here["cpu"], here["boot"], here["jobs"]) == (provenance.host_id(), provenance.cpu_model(),
                                                                               provenance.boot_id(), 1)
    assert here["seconds"] >= 0
    # a later stage that takes the job again adds none of its seconds: the sweep counted them
    assert stages["frontier"]["machines"] == [{"host_sha256": "abc", "cpu": "Other CPU", "boot": None, "jobs": 1,
                                               "seconds": 0.0}]


class InProcess(Executor):
    run = None

    def map(self, stage, fn, items):
        return [fn(self.run, *item.args) for item in items]


class Elsewhere(InProcess):
    computes_here = False


def test_a_stage_that_sleeps_has_a_small_cpu_share_and_one_that_computes_uses_cpu():
    metered = MeteredExecutor(InProcess(), "rev")
    metered.map("idle", lambda run: time.sleep(0.3), [Item("z")])

    def busy(run):
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            pass

    before = cpu_seconds()
    metered.map("busy", busy, [Item("b")])
    metered.map("busy", busy, [Item("b")])
    spent = cpu_seconds() - before
    contention = metered.sections()["contention"]
    idle, work = contention["idle"], contention["busy"]
    assert idle["wall_s"] >= 0.3 and idle["where"] == HERE and idle["calls"] == 1
    # a sleeping thread uses no CPU: what it shows is the clock's tick and the call's own overhead
    assert idle["cpu_share"] < 0.25
    assert work["calls"] == 2 and work["wall_s"] >= 0.4
    assert 0 < work["cpu_s"] <= spent  # the two calls' CPU time, summed, within what the process spent
    assert work["cpu_share"] == pytest.approx(work["cpu_s"] / (work["wall_s"] * work["threads"]))
    assert work["threads"] == torch.get_num_threads()
    for entry in (idle, work):
        assert entry["load_start"] is None or entry["load_start"] >= 0


def test_work_in_other_processes_is_marked_not_measured():
    metered = MeteredExecutor(Elsewhere(), "rev")
    metered.map("sweep", lambda run: None, [Item("s")])
    sections = metered.sections()
    assert sections["contention"]["sweep"]["where"] == ELSEWHERE
    assert sections["contention"]["sweep"]["cpu_share"] is None
    assert sections["provenance"]["stages"]["sweep"] == {"process": "rev", "jobs": None, "machines": None}
    assert sections["provenance"]["revisions"] == []


def test_a_resumed_run_keeps_its_first_sittings_estimate_and_a_changed_config_makes_its_own(tmp_path, monkeypatch):
    from dataclasses import replace

    from dihal_bench.config.suite import resolve_suite
    from dihal_bench.study.first_estimate import first_estimate, kept_line

    _, config = resolve_suite("smoke")
    store = JobStore(tmp_path / "jobs")
    first = {"source": "measured on this machine (cpu, float32)", "stages": {"sweep": 10.0}, "total_seconds": 10.0}
    kept, made = first_estimate(store, "smoke", config, first)
    assert made and {k: kept[k] for k in first} == first
    assert kept["machine"]["host_sha256"] == provenance.host_id() and kept["created"].endswith("+00:00")

    # the next sitting, on another lease of a machine with the same host name, priced the plan at other
    # rates: the first sitting's figure stays
    next_lease = {**provenance.machine(), "boot": "another"}
    monkeypatch.setattr("dihal_bench.study.first_estimate.machine", lambda: next_lease)
    later = {**first, "stages": {"sweep": 30.0}, "total_seconds": 30.0}
    again, made = first_estimate(store, "smoke", config, later)
    assert not made and again == kept
    assert "first sitting: 0 min" in kept_line(again) and "on another machine" in kept_line(again)

    other, made = first_estimate(store, "smoke", replace(config, seeds=(7,)), later)  # other seeds: another run
    assert made and other["stages"] == {"sweep": 30.0} and other["machine"] == next_lease


def test_two_leases_of_one_host_name_are_two_machines_and_an_unnamed_boot_is_not_a_difference(tmp_path):
    boot = tmp_path / "boot_id"
    boot.write_text("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    assert provenance.boot_id(boot) == "0f1e2d3c4b5a"
    assert provenance.boot_id(tmp_path / "absent") is None
    assert provenance.same_machine({"host_sha256": "a", "boot": "1"}, {"host_sha256": "a", "boot": "1"})
    assert not provenance.same_machine({"host_sha256": "a", "boot": "1"}, {"host_sha256": "a", "boot": "2"})
    assert provenance.same_machine({"host_sha256": "a"}, {"host_sha256": "a", "boot": "2"})  # kept before boots
    assert not provenance.same_machine({"host_sha256": "a", "boot": "1"}, {"host_sha256": "b", "boot": "1"})
