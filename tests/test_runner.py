"""The suite runner: suites as data, overrides, resumable jobs, run records; a tiny suite end to
end on a random-weight model, a resume after kill -9, and the real `smoke` suite (integration)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from dihal_builtin.bridge import DihalBridge

from dihal_bench.config.suite import apply_overrides, load_suite_file, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.study import job_clock
from dihal_bench.study.job_clock import timed
from dihal_bench.study.jobs import JobStore, spec_hash
from dihal_bench.study.records import DAMAGED, VERIFIED, load_record, record_integrity

# --- suites and overrides ---------------------------------------------------------------------


def test_builtin_suites_resolve_with_every_key_known():
    for name in ("smoke", "diagnostic", "paper", "geometry-gemma"):
        resolved_name, config = resolve_suite(name)
        assert resolved_name == name and config.description
    assert resolve_suite("paper")[1].dtype == "bfloat16"


def test_a_geometry_only_suite_plans_locate_and_the_sweep_on_the_sweeps_targets_alone():
    from dihal_bench.study.plan import seed_units, target_budgets
    from dihal_bench.training.budget import Budget

    _, config = resolve_suite("geometry-gemma")
    units = seed_units(config, num_layers=18)
    assert [unit.stage for unit in units] == ["locate", "targets", *["sweep"] * 12]  # no methods, no latency
    # the matched budget trains nothing here, so its (larger) training subset is not extracted
    assert target_budgets(config) == [Budget.from_dict(config.sweep.budget)]
    _, diagnostic = resolve_suite("diagnostic")
    assert len(target_budgets(diagnostic)) == 2


def test_overrides_are_typed_and_unknown_keys_are_refused():
    _, config = resolve_suite("smoke")
    changed = apply_overrides(config, {"budget.steps": "12", "sampling.temperature": "0.5",
                                       "sweep.layers": "[2, 4]", "evaluator": "gemma3-270m"})
    assert changed.budget["steps"] == 12 and changed.sampling.temperature == 0.5
    assert changed.sweep.layers == (2, 4) and changed.evaluator == "gemma3-270m"
    assert config.budget["steps"] != 12  # the resolved suite itself is untouched
    with pytest.raises(DihalError, match="unknown suite key 'sampling.temprature'"):
        apply_overrides(config, {"sampling.temprature": "0.5"})
    with pytest.raises(DihalError, match="unknown suite 'nope'"):
        resolve_suite("nope")


def test_a_suite_file_with_a_typo_names_the_key(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('description = "x"\n[locate]\ntokenz = 5\n')
    with pytest.raises(DihalError, match=r"mine.toml: unknown suite key 'locate.tokenz'"):
        load_suite_file(path)


# --- jobs -------------------------------------------------------------------------------------


def test_job_store_runs_once_and_reuses_the_result(tmp_path):
    store = JobStore(tmp_path)
    calls = []

    def work(folder):
        calls.append(folder)
        return {"value": 42}

    assert store.run("kind", {"a": 1}, work) == {"value": 42}
    assert store.run("kind", {"a": 1}, work) == {"value": 42}
    assert len(calls) == 1
    store.run("kind", {"a": 2}, work)
    assert len(calls) == 2
    assert spec_hash("kind", {"a": 1, "b": 2}) == spec_hash("kind", {"b": 2, "a": 1})


def test_a_reused_job_counts_the_seconds_it_took_when_it_was_done_once_per_process(tmp_path, monkeypatch):
    store = JobStore(tmp_path)

    def slow(folder):
        time.sleep(0.2)
        return {"value": 1}

    _, done, _ = timed(store.run, "kind", {"a": 1}, slow)
    stored = json.loads((store.folder("kind", {"a": 1}) / "result.json").read_text())["seconds"]
    assert done >= stored >= 0.2
    # taken again in the process that did it (the frontier loading a row's weights): already counted
    assert timed(store.run, "kind", {"a": 1}, slow)[1] < 0.2
    monkeypatch.setattr(job_clock, "_counted", set())  # a process that resumes the run
    _, reused, wall = timed(store.run, "kind", {"a": 1}, slow)
    assert reused >= stored  # a resumed run's stage times include the work it found done
    assert wall < 0.2  # ... and its wall time only what it spent now
    assert timed(store.run, "kind", {"a": 1}, slow)[1] < 0.2  # ... once


def test_job_store_redoes_a_job_whose_result_is_unreadable(tmp_path):
    store = JobStore(tmp_path)
    store.run("kind", {"a": 1}, lambda folder: {"value": 1})
    (store.folder("kind", {"a": 1}) / "result.json").write_text("{truncated")
    assert store.run("kind", {"a": 1}, lambda folder: {"value": 2}) == {"value": 2}


def test_a_failed_job_leaves_no_result(tmp_path):
    store = JobStore(tmp_path)

    def broken(folder):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        store.run("kind", {"a": 1}, broken)
    assert not (store.folder("kind", {"a": 1}) / "result.json").exists()


# --- a whole suite on a tiny random-weight model ----------------------------------------------


@pytest.fixture(scope="module")
def tiny_suite(tiny_suite_file) -> Path:
    return tiny_suite_file


def run_cli(*args: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    command = [sys.executable, "-m", "dihal_bench.cli", *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if popen:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def comparable(record: dict) -> list[dict]:
    """The per-seed results without wall-clock measurements, which differ run to run."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()
                    if k not in ("latency", "timings", "train_seconds", "wall_seconds")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(record["per_seed"])


def test_a_second_run_on_a_store_in_use_is_refused_with_the_holders_pid(tiny_suite, tmp_path):
    # the job store of suite "tiny" under --out is <out>/tiny/jobs; a process holds its lock
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\nfrom pathlib import Path\nfrom dihal_bench.study.jobs import JobStore\n"
        "with JobStore(Path(sys.argv[1])).lock():\n    print('holding', flush=True)\n    time.sleep(120)\n"),
        str(tmp_path / "runs" / "tiny" / "jobs")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        result = run_cli("run", "--suite", str(tiny_suite), "--out", str(tmp_path / "runs"),
                         "--results", str(tmp_path / "results"), "--quiet")
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("Error: job store ") and f"in use by another dihal-bench run (pid {holder.pid})" in line
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").iterdir())


def test_tiny_suite_end_to_end_writes_a_complete_record(tiny_suite, tmp_path):
    result = run_cli("run", "--suite", str(tiny_suite), "--out", str(tmp_path / "runs"), "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = (tmp_path / "runs" / "results").glob("tiny-*.json")  # without --results: beside the store
    record = json.loads(path.read_text())
    assert record["format"] == "dihal-bench/run-record/v2" and record["seeds"] == [0]
    seed = record["per_seed"][0]
    assert set(seed["methods"]) == {"dihal-chosen", "dihal-worst", "dihal-oracle", "control-skip",
                                    "control-regressor", "reference-unigram", "reference-human", "ar-backbone"}
    assert [point["steps"] for point in seed["steps_axis"]] == [1, 2]
    assert all(point["sampler"] == "mean" for point in seed["steps_axis"])  # the bridge's default, recorded
    assert all(point["layer"] == seed["roles"]["chosen"] and point["bridge_mse"] > 0 for point in seed["steps_axis"])
    assert {seed["methods"][name]["kind"] for name in ("control-skip", "control-regressor")} == {"control"}
    assert seed["methods"]["control-regressor"]["in_budget"] is True
    assert "depth" in seed["sweep"]["correlations"] and "depth" in seed["sweep"]["correlations_trace"]
    assert len(seed["locate"]["top_channel_share"]) == len(seed["locate"]["layers"])
    assert seed["roles"]["chosen"] == seed["locate"]["chosen_layer"]
    swept = [row["layer"] for row in seed["sweep"]["layers"]]
    assert seed["roles"]["worst"] in swept and seed["roles"]["oracle"] in swept
    for name, method in seed["methods"].items():
        metrics = method["metrics"]
        assert metrics["entropy"] > 0, name
        # the random-weight model writes texts without spaces, one "word" each: invalid samples,
        # flagged rather than averaged; held-out text is valid
        if metrics["gen_ppl_n_valid"] >= 1:
            assert metrics["gen_ppl"] > 1, name
        else:
            assert metrics["gen_ppl"] is None and metrics["gen_ppl_warning"].startswith("flagged"), name
        if method["kind"] == "reference":
            assert method["latency"] is None, name
        else:
            assert method["latency"]["batch1_ms_per_token"] > 0, name
    assert seed["methods"]["ar-backbone"]["in_budget"] is False
    # every row but the references has an exact likelihood here (the bridge's default sampler draws no
    # noise), on the same held-out windows
    likelihoods = {name: method["test_nll"] for name, method in seed["methods"].items()}
    assert likelihoods["reference-unigram"] is None and likelihoods["reference-human"] is None
    scored = {name: value for name, value in likelihoods.items() if value is not None}
    assert {value["kind"] for value in scored.values()} == {"exact"} and len(scored) == 6
    assert {(value["windows"], value["tokens"]) for value in scored.values()} == {(4, 64)}
    assert all(0 < value["nats_per_token"] < 20 for value in scored.values())
    # each row says in which precision it draws its tokens; a reference draws from no model
    assert {name: method["draw_precision"] for name, method in seed["methods"].items()} == \
        {name: None if name.startswith("reference-") else "float32" for name in seed["methods"]}
    assert seed["methods"]["reference-human"]["metrics"]["gen_ppl"] > 1
    assert seed["methods"]["ar-backbone"]["latency"]["batch1_ratio_to_backbone"] == pytest.approx(1.0)
    # each round's ratio to the reference's decode of the same round: exactly 1 for the reference itself
    repeats = record["config"]["metrics"]["latency_repeats"]
    assert seed["methods"]["ar-backbone"]["latency"]["batch1_ratio_per_round"] == [1.0] * repeats
    chosen = seed["methods"]["dihal-chosen"]["latency"]
    assert len(chosen["batch1_ratio_per_round"]) == repeats
    assert min(chosen["batch1_ratio_per_round"]) <= chosen["batch1_ratio_to_backbone"] <= max(chosen["batch1_ratio_per_round"])
    assert record["environment"]["torch"] and record["config"]["budget"]["steps"] == 6
    # one seed: its own stage times are the record's
    assert {k: v for k, v in seed["timings"].items() if k != "total_seconds"} == \
        {k: v for k, v in record["timings"].items() if k != "total_seconds"}
    assert 0 < seed["timings"]["total_seconds"] <= record["timings"]["total_seconds"]
    assert load_record(path) == record  # a v2 record, valid under its schema
    assert record["metrics"]["gen_ppl"]["higher_is_better"] is False
    assert list(record["metrics"]) == ["gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity"]
    for method in seed["methods"].values():
        assert 1 <= len(method["samples"]["examples"]) <= 5
        assert all(isinstance(text, str) for text in method["samples"]["examples"])


@pytest.fixture(scope="module")
def uninterrupted_record(tiny_suite, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    whole = run_cli("run", "--suite", str(tiny_suite), "--quiet", "--out", str(root / "runs"),
                    "--results", str(root / "results"))
    assert whole.returncode == 0, whole.stderr[-3000:]
    [path] = (root / "results").glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["kill", "term", "int"])
def test_an_interrupted_run_resumes_without_redoing_jobs_and_gives_the_same_numbers(
        tiny_suite, uninterrupted_record, tmp_path, stop):
    common = ["run", "--suite", str(tiny_suite), "--quiet", "--out", str(tmp_path / "b"),
              "--results", str(tmp_path / "rb")]
    jobs = tmp_path / "b" / "tiny" / "jobs"
    process = run_cli(*common, popen=True)
    deadline = time.monotonic() + 300
    while not list(jobs.glob("dihal-train-*/result.json")) and process.poll() is None:
        assert time.monotonic() < deadline, "the run never finished a DiHAL training job"
        time.sleep(0.2)
    process.send_signal(stop)
    process.wait()
    finished = {p.parent.name for p in jobs.glob("*/result.json")}
    assert finished and not list((tmp_path / "rb").glob("*.json"))  # stopped before its record

    before = {name: (jobs / name / "result.json").stat().st_mtime_ns for name in finished}
    resumed = run_cli(*common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert all((jobs / name / "result.json").stat().st_mtime_ns == before[name] for name in finished)
    [b] = (tmp_path / "rb").glob("*.json")
    assert comparable(uninterrupted_record) == comparable(json.loads(b.read_text()))
    [kept] = jobs.glob("estimate-*/result.json")  # made by the interrupted sitting, before its first job
    assert json.loads(b.read_text())["estimate"] == json.loads(kept.read_text())["result"]


def test_the_record_keeps_the_estimate_the_run_made_before_it_started(uninterrupted_record):
    estimate, timings = uninterrupted_record["estimate"], uninterrupted_record["timings"]
    assert set(estimate["stages"]) == set(timings) - {"total_seconds"}  # the same stages, to compare one by one
    assert estimate["total_seconds"] == pytest.approx(sum(estimate["stages"].values()))
    assert "assumed" in estimate["source"]  # no --calibrate
    assert estimate["stages"]["sweep"] > 0 and estimate["stages"]["references"] == 0  # drawing texts costs nothing
    rates = estimate["rates"]  # what each stage was priced at, to trace an estimate that missed
    assert rates["trained"] > 0 and rates["forward"] > 0 and rates["baselines"] == {}  # assumed: nothing timed whole


def test_the_record_says_which_revision_did_each_stage_and_how_busy_the_machine_was(uninterrupted_record):
    record = uninterrupted_record
    revision = record["environment"]["git_revision"]
    contention, stages = record["contention"], record["provenance"]["stages"]
    # the executor's stages (the methods are one), every one measured in this process
    assert set(contention) == set(stages) and {"locate", "sweep", "methods", "metrics", "latency"} <= set(contention)
    assert sum(entry["wall_s"] for entry in contention.values()) <= record["timings"]["total_seconds"]
    for stage, entry in contention.items():
        assert entry["where"] == "this process" and entry["threads"] >= 1, stage
        assert entry["cpu_share"] == pytest.approx(entry["cpu_s"] / (entry["wall_s"] * entry["threads"])), stage
    # one invocation on a fresh store: every job was done by the revision the environment names
    assert all(stage["process"] == revision for stage in stages.values())
    assert all([job["revision"] for job in stage["jobs"]] == [revision] for stage in stages.values())
    assert record["provenance"]["revisions"] == [{"revision": revision, "stages": list(stages)}]


def test_the_dry_run_plan_is_the_list_of_units_the_runner_did(tiny_suite, uninterrupted_record):
    from dihal_bench.study.plan import seed_units

    _, config = resolve_suite(str(tiny_suite))
    planned = [unit.label for unit in seed_units(config)]
    assert uninterrupted_record["per_seed"][0]["units"] == planned
    assert "bridge targets T=16" in planned and "sweep layer 3/3" in planned and planned[-1] == "latency"
    dry = run_cli("run", "--suite", str(tiny_suite), "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert all(label in dry.stdout for label in planned)


def test_streamed_targets_run_the_suite_without_a_targets_job_and_give_the_stored_numbers(
        tiny_suite, uninterrupted_record, tmp_path):
    from dihal_bench.study.plan import seed_units

    sets = {"bridge.targets": "streamed", "methods.dihal": '["chosen"]', "methods.controls": '["regressor"]',
            "methods.references": "[]", "methods.baselines": "[]", "bridge.steps_axis": "[]"}
    result = run_cli("run", "--suite", str(tiny_suite), "--quiet", "--out", str(tmp_path / "runs"),
                     "--results", str(tmp_path / "results"), *(f"--set={k}={v}" for k, v in sets.items()))
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = (tmp_path / "results").glob("*.json")
    seed = json.loads(path.read_text())["per_seed"][0]
    _, config = resolve_suite(str(tiny_suite))
    assert seed["units"] == [unit.label for unit in seed_units(apply_overrides(config, sets))]
    assert not any(label.startswith("bridge targets") for label in seed["units"])
    assert not list((tmp_path / "runs" / "tiny" / "jobs").glob("bridge-targets-*"))
    # The streamed states equal the stored ones up to float32 rounding of other batch shapes,
    # which a few training steps carry into the weights at ~1e-5 relative (test_streamed_targets);
    # the measures are smooth in the weights, so 1e-3 relative holds while a different layer,
    # seed or training set would be off by far more.
    stored = uninterrupted_record["per_seed"][0]
    assert [row["layer"] for row in seed["sweep"]["layers"]] == [row["layer"] for row in stored["sweep"]["layers"]]
    for mine, theirs in zip(seed["sweep"]["layers"], stored["sweep"]["layers"], strict=True):
        for key in ("final_loss", "bridge_mse", "bridge_r2", "hybrid_ppl", "kl_to_backbone"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-3), (mine["layer"], key)
    for name in ("dihal-chosen", "control-regressor"):
        for key in ("final_loss", "bridge_mse", "hybrid_ppl"):
            assert seed["methods"][name]["train"][key] == pytest.approx(
                stored["methods"][name]["train"][key], rel=1e-3), (name, key)


def test_bridgeability_windows_are_a_seeded_subset_and_streamed_runs_hold_one_layer(tiny_suite, tmp_path):
    from dihal_bench.config.suite import resolved_config
    from dihal_bench.study.run import Run

    config = resolved_config(resolve_suite(str(tiny_suite))[1])  # a Run loads on a named device
    every = Run("tiny", config, tmp_path, progress=False).valid_states(16, 2, [1, 2])
    cap = len(every.sequences) - 2
    capped = Run("tiny", apply_overrides(config, {"sweep.bridgeability_windows": str(cap)}), tmp_path,
                 progress=False).valid_states(16, 2, [1, 2])
    assert len(capped.sequences) == cap and set(capped.states) == {0, 1, 2}
    rows = [next(i for i, window in enumerate(every.sequences) if torch.equal(window, mine))
            for mine in capped.sequences]
    assert len(set(rows)) == cap and rows != list(range(cap))  # distinct windows, not the first ones
    # the same windows' states, up to float32 rounding of another batch composition
    torch.testing.assert_close(capped.states[2], every.states[2][rows], rtol=1e-4, atol=1e-5)

    streamed = Run("tiny", apply_overrides(config, {"bridge.targets": "streamed"}), tmp_path, progress=False)
    assert set(streamed.valid_states(16, 2, [1, 2]).states) == {0, 2}
    with pytest.raises(DihalError, match=r"sweep.eval_sequences \(4\) must not exceed sweep.bridgeability_windows \(3\)"):
        apply_overrides(config, {"sweep.bridgeability_windows": "3"})


def test_the_runner_seals_its_record_over_the_job_results_it_cites(uninterrupted_record):
    integrity = record_integrity(uninterrupted_record, Path.cwd() / uninterrupted_record["jobs"])
    assert integrity.status == VERIFIED and not integrity.changed
    assert uninterrupted_record["integrity"]["artifacts"]  # the cited checkpoints' and samples' jobs
    edited = {**uninterrupted_record, "seeds": [1]}
    assert record_integrity(edited).status == DAMAGED


def test_the_record_names_its_job_store_relative_to_where_the_run_was_started(uninterrupted_record):
    # the run was given an absolute --out; lm_eval.record resolves "jobs" against the working directory
    jobs = Path(uninterrupted_record["jobs"])
    assert not jobs.is_absolute() and jobs.parts[-2:] == ("tiny", "jobs")
    checkpoint = uninterrupted_record["per_seed"][0]["methods"]["dihal-chosen"]["train"]["checkpoint"]
    assert (Path.cwd() / jobs / checkpoint).is_dir()


def test_run_bad_input_is_one_line(tiny_suite, tmp_path):
    unknown = run_cli("run", "--suite", "nope")
    assert unknown.returncode == 2 and unknown.stderr.strip().startswith("Error: unknown suite 'nope'")
    bad_key = run_cli("run", "--suite", str(tiny_suite), "--set", "budget.stepz=3", "--out", str(tmp_path),
                      "--results", str(tmp_path / "results"))
    assert bad_key.returncode == 2 and "budget" in bad_key.stderr and "stepz" in bad_key.stderr
    assert "Traceback" not in bad_key.stderr and not (tmp_path / "results").exists()


def test_paper_suite_dry_run_prints_the_plan_without_loading_anything():
    result = run_cli("run", "--suite", "paper", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "meta-llama/Llama-3.1-8B-Instruct" in result.stdout and "sweep layer 12/12" in result.stdout
    assert "GiB" in result.stdout and "est. time" in result.stdout


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory) -> tuple[Path, dict]:
    """(--out, record) of one run of the smoke suite on the embedded backbone."""
    root = tmp_path_factory.mktemp("smoke")
    result = run_cli("run", "--suite", "smoke", "--out", str(root / "runs"), "--results", str(root / "results"),
                     "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = (root / "results").glob("smoke-smollm2-135m-*.json")
    return root / "runs", json.loads(path.read_text())


@pytest.mark.integration
def test_smoke_suite_runs_end_to_end_on_the_embedded_backbone(smoke_run):
    seed = smoke_run[1]["per_seed"][0]
    assert set(seed["methods"]) == {"dihal-chosen", "dihal-worst", "dihal-oracle", "control-skip", "control-regressor",
                                    "reference-unigram", "reference-human", "diffusion-lm", "sed", "ld4lg", "codar",
                                    "mdlm", "ar-scratch", "ar-backbone"}
    allowance = seed["budget"]["param_allowance"]
    for name, method in seed["methods"].items():
        if method["in_budget"]:
            assert abs(sum(method["parameters"].values()) - allowance) <= 0.1 * allowance, name
        metrics = method["metrics"]
        # six training steps may leave a method writing one repeated token: flagged, not averaged
        assert metrics["gen_ppl"] > 1 if metrics["gen_ppl_n_valid"] else metrics["gen_ppl_warning"], name
    for name in ("reference-human", "reference-unigram", "ar-backbone"):
        assert seed["methods"][name]["metrics"]["gen_ppl_n_valid"] == 4, name
    human, unigram, backbone = (seed["methods"][name]["metrics"]["gen_ppl"]
                                for name in ("reference-human", "reference-unigram", "ar-backbone"))
    assert human < unigram and backbone < unigram  # the floor is below real text and the intact model


@pytest.mark.integration
def test_a_pruned_smoke_store_carries_the_run_and_its_weights_come_back_bit_for_bit(smoke_run, tmp_path):
    """docs/method.md#pruned-job-stores on every trained kind of the smoke suite: the store pruned, the
    jobs that load trained weights (latency, the steps axis) removed, the run again makes each pruned
    checkpoint they ask for (and the bridge targets those need) with the sha256 it first had."""
    runs, first = smoke_run
    carried = tmp_path / "runs"
    shutil.copytree(runs, carried)
    jobs = carried / "smoke" / "jobs"
    pruned = run_cli("store", "prune", str(jobs), "--min-bytes", "4096")
    assert pruned.returncode == 0 and pruned.stdout.startswith("pruned "), pruned.stderr
    kinds = {folder: json.loads((folder / "result.json").read_text())["kind"] for folder in jobs.iterdir()
             if (folder / "result.json").exists()}
    for folder, kind in kinds.items():
        if kind in ("latency", "steps-point"):
            shutil.rmtree(folder)
    # the trained rows the latency stage times: each must be made again
    timed = {jobs / Path(method["train"].get("checkpoint") or method["train"]["model_dir"]).parts[0]
             for method in first["per_seed"][0]["methods"].values()
             if method.get("latency") and method.get("train", {}).get("steps")}
    assert len(timed) >= 5 and all((folder / "pruned.json").exists() for folder in timed)
    again = run_cli("run", "--suite", "smoke", "--out", str(carried), "--results", str(tmp_path / "results"),
                    "--quiet")
    assert again.returncode == 0, again.stderr[-3000:]
    [path] = (tmp_path / "results").glob("smoke-smollm2-135m-*.json")
    assert comparable(json.loads(path.read_text())) == comparable(first)
    assert not any((folder / "pruned.json").exists() for folder in timed)  # each made again, and intact


def test_bridge_job_identity_changes_with_the_architecture():
    from dihal_builtin.bridge import DihalBridge

    from dihal_bench.hybrid.training import BridgeSpec
    from dihal_bench.training.loop import count_trainable

    small, wide = BridgeSpec(options={"d_model": 32, "heads": 2}), BridgeSpec(options={"d_model": 64, "heads": 2})
    assert small.identity(16)["bridge_parameters"] == count_trainable(DihalBridge(16, d_model=32, heads=2))
    assert spec_hash("dihal-train", small.identity(16)) != spec_hash("dihal-train", wide.identity(16))


def test_auto_sweep_layers_has_exactly_count_layers_dense_over_the_shallow_ones():
    from dihal_bench.study.plan import auto_sweep_layers

    assert auto_sweep_layers(30, {3, 25}, 14) == [1, 2, 3, 4, 5, 6, 7, 11, 15, 18, 21, 25, 26, 29]
    for layers in (5, 12, 30):
        for count in range(1, layers + 2):
            for required in ({1}, {layers - 1}, {2, layers // 2}):
                picked = auto_sweep_layers(layers, required, count)
                assert len(picked) == min(count, layers - 1) or len(required) > count
                assert required <= set(picked) and set(picked) <= set(range(1, layers))


# --- the steps axis under several bridge samplers ---------------------------------------------


def with_axis_samplers(config, samplers: tuple[str, ...]):
    return dataclasses.replace(config, bridge=dataclasses.replace(config.bridge, steps_axis_samplers=samplers))


class KeyStore:
    """A job store that runs nothing: it keeps each job's kind and spec and returns a stand-in result."""

    def __init__(self):
        self.jobs: list[tuple[str, dict]] = []

    def run(self, kind: str, spec: dict, work) -> dict:
        self.jobs.append((kind, spec))
        return {"steps": spec["steps"], "layer": 3, "bridge_mse": 0.5}


def test_the_steps_axis_puts_each_sampler_on_it_and_the_suites_own_keeps_its_key():
    from dihal_bench.study.plan import seed_units
    from dihal_bench.study.protocol import bridge_spec
    from dihal_bench.study.run import Run
    from dihal_bench.study.stages.steps_axis import steps_point

    _, config = resolve_suite("smoke")
    both = with_axis_samplers(config, ("mean", "ancestral"))
    assert apply_overrides(config, {"bridge.steps_axis_samplers": '["mean", "ancestral"]'}) == both
    with pytest.raises(DihalError, match="steps_axis_samplers"):
        apply_overrides(config, {"bridge.steps_axis_samplers": '["euler"]'})
    steps_units = [unit.label for unit in seed_units(both, num_layers=30) if unit.stage == "steps"]
    assert steps_units == ["DiHAL at K=1 steps, mean sampler", "DiHAL at K=8 steps, mean sampler",
                           "DiHAL at K=1 steps, ancestral sampler", "DiHAL at K=8 steps, ancestral sampler"]
    assert [unit.label for unit in seed_units(config, num_layers=30) if unit.stage == "steps"] == \
        ["DiHAL at K=1 steps", "DiHAL at K=8 steps"]  # no samplers listed: the suite's own alone

    run = Run("smoke", config, Path("never-written"), progress=False)
    run.__dict__["backbone"] = SimpleNamespace(width=16)
    run.store = KeyStore()
    spec = bridge_spec(config, "budget", 0)
    method = {"layer": 3, "train_job": "trained", "train": {"checkpoint": "bridge"}}
    points = [steps_point(run, method, spec, 8, 0, [3], sampler) for sampler in (None, "mean", "ancestral")]
    (_, own), (_, named_own), (_, other) = run.store.jobs
    assert own == named_own and "sampler" not in own  # the suite's sampler (mean): the key it always had
    assert other == {**own, "sampler": "ancestral"}
    assert [point["sampler"] for point in points] == ["mean", "mean", "ancestral"]
    with pytest.raises(DihalError, match="unknown bridge sampler 'euler'"):
        DihalBridge(16, d_model=8, heads=2).sampler = "euler"


# --- the user's side of a run: resolved device, calibrated estimate, progress, Ctrl-C -------------


def test_the_record_names_the_device_and_dtype_that_ran(uninterrupted_record):
    from dihal_bench.config.suite import resolve_device, resolve_dtype

    # the tiny suite names neither: "auto" resolves once, at the start of the run, to this machine's
    device = resolve_device("auto")
    assert device != "auto"
    assert (uninterrupted_record["config"]["device"], uninterrupted_record["config"]["dtype"]) == \
        (device, resolve_dtype("auto", device))


def test_a_stopped_run_says_what_is_done_and_the_command_that_resumes(tiny_suite, tmp_path):
    common = ["run", "--suite", str(tiny_suite), "--quiet", "--out", str(tmp_path / "runs"),
              "--results", str(tmp_path / "results")]
    jobs = tmp_path / "runs" / "tiny" / "jobs"
    process = run_cli(*common, popen=True)
    deadline = time.monotonic() + 300
    while not list(jobs.glob("locate-*/result.json")) and process.poll() is None:
        assert time.monotonic() < deadline, "the run never finished its locate job"
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    done, total = map(int, re.search(r"Interrupted\. (\d+) of (\d+) units done; ", last).groups())
    assert 1 <= done < total
    assert last.endswith("run the same command again to resume: dihal-bench " + " ".join(common))
    # --quiet: no estimate line, no bars; only the outcome
    assert "running on" not in stderr


def test_an_interrupt_a_library_turned_into_another_error_still_stops_the_run_as_interrupted(tiny_suite, tmp_path,
                                                                                            monkeypatch):
    """In CI a SIGTERM landed inside a vmap and torch's functorch, leaving it, raised an internal assert in
    the interrupt's place: the run must still stop as interrupted (exit 130, how to resume), not as a crash."""
    from dihal_bench.study import runner

    def stage(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        finally:
            raise RuntimeError("layerId == dynamic_layer.layerId() INTERNAL ASSERT FAILED")

    monkeypatch.setattr(runner, "study_seeds", stage)
    config = load_suite_file(tiny_suite)
    with pytest.raises(runner.RunInterrupted):
        runner.run_suite("tiny", config, out_root=tmp_path / "runs", results_dir=tmp_path / "results", progress=False)
    monkeypatch.setattr(runner, "study_seeds", lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # an error with no interrupt behind it stays an error
        runner.run_suite("tiny", config, out_root=tmp_path / "runs", results_dir=tmp_path / "results", progress=False)


def test_a_run_reports_where_it_runs_and_its_estimate_before_any_work():
    from dihal_bench.study.estimate import Throughput, estimate_line

    _, config = resolve_suite("smoke")
    rates = Throughput(forward=1e3, decode=1e2, evaluator=1e3, trained=1e3, source="assumed")
    line = estimate_line(dataclasses.replace(config, device="cpu", dtype="float32"), {0: [60.0, 120.0], 1: [60.0]}, rates)
    assert line.startswith("running on cpu (float32); estimated 4 min for 2 seeds (assumed)")


def test_the_bar_advances_by_each_units_estimated_seconds():
    from dihal_bench.study.executors.base import Item
    from dihal_bench.study.plan import Unit
    from dihal_bench.study.progress import Progress

    plans = {0: [Unit("locate", "locate"), Unit("latency", "latency")], 1: [Unit("locate", "locate")]}
    progress = Progress(plans, "test", costs={0: [1.0, 98.0], 1: [1.0]})
    items = [Item("locate", (), 0), Item("locate", (), 1)]
    progress.claim(items)
    for item in items:
        progress.finish(item, 0.5)
    # two of three units, but 2 of 100 estimated seconds: the ETA weighs the latency job left
    assert (progress.done_units, progress.total_units) == (2, 3)
    assert (progress.done_cost, progress.bar.n, progress.bar.total) == (2.0, 2.0, 100.0)
    progress.close()
    with pytest.raises(AssertionError, match="a cost for every planned unit"):
        Progress(plans, "test", enabled=False, costs={0: [1.0], 1: [1.0]})


def test_work_found_in_the_store_shrinks_the_bar_instead_of_advancing_it():
    from dihal_bench.study.executors.base import Item
    from dihal_bench.study.plan import Unit
    from dihal_bench.study.progress import Progress

    plan = {1: [Unit("baselines", "ar-lora"), Unit("baselines", "ar2diff-lora"), Unit("metrics", "metrics")]}
    progress = Progress(plan, "test", costs={1: [40.0, 40.0, 20.0]})
    items = [Item(unit.label, (), 1) for unit in plan[1]]
    progress.claim(items)
    progress.finish(items[0], 4000.0, 0.01)  # reused from the store: its stored seconds, no wall time
    progress.finish(items[1], 400.0, 100.0)  # resumed at three quarters of its training
    # the bar counts only what this run did (10 of the 40 estimated), so its rate is this run's pace
    assert progress.bar.total == pytest.approx(100.0 - 40.0 * (1 - 0.01 / 4000) - 30.0)
    assert progress.bar.n == pytest.approx(10.0 + 40.0 * 0.01 / 4000)
    assert progress.seconds[1] == {"baselines": 4400.0}  # the stage times keep the whole cost
    progress.close()


def test_calibration_measures_positive_rates_on_the_loaded_models(tiny_suite, tmp_path):
    from dihal_bench.config.suite import apply_overrides, resolved_config
    from dihal_bench.study.calibration import calibrate_run
    from dihal_bench.study.run import Run

    _, config = resolve_suite(str(tiny_suite))
    # an allowance ar-scratch fits on the tiny model (d_model 48)
    # a batch of 16: the timed fits' five steps need more than one pass over the 64 calibration windows
    config = apply_overrides(config, {"methods.baselines": '["ar-scratch", "ar-backbone"]',
                                      "budget.param_allowance": "114816", "budget.batch_size": "16",
                                      "budget.epochs": "40"})
    out = tmp_path / "never-written"
    run = Run("tiny", resolved_config(config), out, progress=False)
    rates = calibrate_run(run)
    # the store's write was timed beside the store that does not exist yet, and left nothing there
    assert not out.exists() and not any(tmp_path.iterdir())
    assert all(0 < getattr(rates, kind) < float("inf") for kind in ("forward", "decode", "evaluator", "trained"))
    assert rates.source.startswith("measured on this machine (cpu")
    # the trained baseline timed by its own step; the intact backbone trains nothing; both timed decoding
    timed = rates.baselines
    assert set(timed) == {"ar-scratch", "ar-backbone"} and timed["ar-backbone"].step is None
    assert 0 < timed["ar-scratch"].step < float("inf") and timed["ar-scratch"].per_window >= 0
    assert all(0 < seconds < float("inf") for timing in timed.values()
               for seconds in (timing.batch_decode, timing.single_decode))
    # the bridge's evaluation, the targets job and locate's proxies over the candidate layers, timed
    assert 0 < rates.evaluated < float("inf") and 0 < rates.extracted < float("inf") and rates.proxy_seconds > 0
    assert 0 < rates.single_decode < float("inf")


def test_a_noisy_timing_is_taken_at_its_fastest():
    # the targets job and the proxies are timed a few times: one slow call (another process took the
    # cores) must not set the rate; the fastest of the calls is the work's own cost
    from dihal_bench.base.timing import fastest

    delays = iter([0.5, 0.0, 0.0])
    assert fastest(lambda: time.sleep(next(delays)), repeats=3) < 0.25


def test_run_takes_device_and_dtype(tiny_suite):
    from click.testing import CliRunner

    from dihal_bench.cli import cli

    runner = CliRunner()
    planned = runner.invoke(cli, ["run", "--suite", "smoke", "--dry-run", "--device", "cpu", "--dtype", "bfloat16"])
    assert planned.exit_code == 0, planned.output
    assert "device: cpu, dtype: bfloat16" in planned.output
