"""A pruned job store: large artifacts out, results reused as they are, and a pruned artifact that a
later job asks for made again bit for bit (or the run stops with one line, unless it accepts inexact
remakes: then each one that differs is listed in its job's remade.json, with the result's numbers that
came out otherwise)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dihal_bench.base.files import file_sha256
from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.study.jobs import JobStore
from dihal_bench.study.pruned import PRUNED, REMADE, differing_numbers, pruned_files, remade_seconds
from dihal_bench.study.pruning import prune

#: between the job's small files (spec, notes: < 200 bytes) and its weights (64 x 64 float32: 16 kB)
MIN_BYTES = 4096
#: a job folder with no result, as a killed run leaves one
UNFINISHED = "train-0123456789abcdef"
#: how long a remade job's work takes at least in the test of remake accounting
PAUSE = 1.0


def seeded_job(calls: list, seed: int = 0):
    """A job's work as a training job's: seeded weights (large), a note and samples (small)."""

    def work(folder: Path) -> dict:
        calls.append(folder)
        weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))
        (folder / "model").mkdir(parents=True, exist_ok=True)
        save_file({"w": weights}, str(folder / "model" / "weights.safetensors"))
        # a small file that describes the large one, as bridge.json holds its weights' sha256
        (folder / "model" / "about.json").write_text(json.dumps({"w_sum": float(weights.sum())}))
        (folder / "samples.jsonl").write_text(json.dumps({"text": "a b c"}) + "\n")
        return {"mean": float(weights.mean()), "model_dir": "model"}

    return work


@pytest.fixture
def pruned_store(tmp_path):
    """(store root, job folder, first result, calls): one finished job, then its store pruned."""
    root, calls = tmp_path / "jobs", []
    first = JobStore(root).run("train", {"a": 1}, seeded_job(calls))
    folder = JobStore(root).folder("train", {"a": 1})
    (root / UNFINISHED).mkdir()
    (root / UNFINISHED / "partial.bin").write_bytes(bytes(MIN_BYTES))
    done = prune(root, MIN_BYTES)
    assert (done.jobs, done.files, done.unfinished, done.damaged) == (1, 1, 1, 0)
    return root, folder, first, calls


def test_prune_takes_out_large_artifacts_keeps_the_small_and_the_job_is_reused(pruned_store, capsys):
    root, folder, first, calls = pruned_store
    assert not (folder / "model" / "weights.safetensors").exists()
    assert (folder / "samples.jsonl").exists() and not (root / UNFINISHED).exists()
    assert set(json.loads((folder / PRUNED).read_text())["files"]) == {"model/weights.safetensors"}
    assert JobStore(root).run("train", {"a": 1}, seeded_job(calls)) == first
    assert len(calls) == 1 and capsys.readouterr().err == ""


def test_a_pruned_artifact_asked_for_is_made_again_bit_for_bit_aside(pruned_store):
    root, folder, first, calls = pruned_store
    store = JobStore(root)
    trained = store.run("train", {"a": 1}, seeded_job(calls))
    samples = (folder / "samples.jsonl").stat().st_mtime_ns
    killed = root / f".remake-{folder.name}-x1y2z3"  # the scratch folder of a remake killed outright
    (killed / "model").mkdir(parents=True)
    path = store.resolve(f"{folder.name}/{trained['model_dir']}")
    assert (path / "weights.safetensors").is_file() and len(calls) == 2
    assert calls[1] != folder and not calls[1].exists()  # made in a scratch folder, since removed
    assert not killed.exists()
    assert (folder / "samples.jsonl").stat().st_mtime_ns == samples  # what the job kept is not touched
    assert not (folder / PRUNED).exists()
    assert JobStore(root).run("train", {"a": 1}, seeded_job(calls)) == first  # intact as first made
    assert len(calls) == 2


def test_the_time_of_a_remake_is_not_counted_again_in_the_job_that_asked_for_it(pruned_store):
    root, folder, _, calls = pruned_store
    store = JobStore(root)
    seeded = seeded_job(calls)

    def slow_work(scratch: Path) -> dict:  # the pruned job's work, made again, takes at least PAUSE
        time.sleep(PAUSE)
        return seeded(scratch)

    trained = store.run("train", {"a": 1}, slow_work)  # reused: kept to make its weights again

    def sampling(out: Path) -> dict:  # a later job reading the pruned weights (a frontier point)
        weights = store.resolve(f"{folder.name}/{trained['model_dir']}") / "weights.safetensors"
        return {"bytes": weights.stat().st_size}

    before = remade_seconds()
    store.run("sample", {"b": 2}, sampling)
    assert remade_seconds() - before >= PAUSE
    # the remade job's own time was counted when it was first done: counted here too, this job would
    # record at least PAUSE; its own work (a stat) takes milliseconds
    assert json.loads((store.folder("sample", {"b": 2}) / "result.json").read_text())["seconds"] < PAUSE


def test_an_artifact_that_comes_out_different_stops_the_run(pruned_store):
    root, folder, _, calls = pruned_store
    store = JobStore(root)
    store.run("train", {"a": 1}, seeded_job(calls, seed=1))  # reused: the work is not run here
    with pytest.raises(DihalError, match=r"made again for a pruned job, does not match the sha256 .* not "
                                         r"reproducible here"):
        store.resolve(f"{folder.name}/model")
    assert not (folder / "model" / "weights.safetensors").exists() and (folder / PRUNED).exists()
    assert [p for p in root.iterdir() if p.name.startswith(".remake")] == []


def test_an_artifact_that_comes_out_different_is_put_back_and_listed_when_inexact_remakes_are_accepted(pruned_store):
    root, folder, first, calls = pruned_store
    recorded = pruned_files(folder)["model/weights.safetensors"]
    store = JobStore(root, inexact_remakes=True)
    store.run("train", {"a": 1}, seeded_job(calls, seed=1))  # another machine's rounding, as far as the bits go
    made = store.resolve(f"{folder.name}/model")
    listed = json.loads((folder / REMADE).read_text())["files"]
    assert sorted(listed) == ["model/about.json", "model/weights.safetensors"]
    # the job keeps one make's files: the small description replaced with the weights it describes
    remade_weights = load_file(str(made / "weights.safetensors"))["w"]
    assert json.loads((made / "about.json").read_text())["w_sum"] == float(remade_weights.sum())
    assert listed["model/weights.safetensors"]["recorded"] == recorded
    assert listed["model/weights.safetensors"]["remade"] == file_sha256(made / "weights.safetensors") != recorded
    # how far the remade weights are from the first: each number of the result the remake gave otherwise
    numbers = json.loads((folder / REMADE).read_text())["result"]
    assert numbers == {"mean": {"recorded": first["mean"], "remade": float(remade_weights.mean())}}
    assert numbers["mean"]["recorded"] != numbers["mean"]["remade"]
    assert not (folder / PRUNED).exists()
    assert [p for p in root.iterdir() if p.name.startswith(".remake")] == []
    # a later run reuses the job as it now is (intact as remade), not redone as damaged, and the list is
    # the store's note, not the job's artifact: a later remake may add to it
    (folder / REMADE).write_text(json.dumps({"files": {**listed, "later.safetensors": {}}}))
    remakes = len(calls)
    assert JobStore(root).run("train", {"a": 1}, seeded_job(calls, seed=2)) == first
    assert len(calls) == remakes
    assert file_sha256(made / "weights.safetensors") == listed["model/weights.safetensors"]["remade"]


def test_an_exact_remake_lists_nothing_even_when_inexact_remakes_are_accepted(pruned_store):
    root, folder, _, calls = pruned_store
    store = JobStore(root, inexact_remakes=True)
    store.run("train", {"a": 1}, seeded_job(calls))
    store.resolve(f"{folder.name}/model/weights.safetensors")
    assert not (folder / REMADE).exists() and not (folder / PRUNED).exists()


def test_a_pruned_job_this_process_did_not_reuse_cannot_be_remade(pruned_store):
    root, folder, _, _ = pruned_store
    with pytest.raises(DihalError, match=r"was pruned of its large artifacts .* has not reused it"):
        JobStore(root).resolve(f"{folder.name}/model/weights.safetensors")
    assert JobStore(root).resolve(f"{folder.name}/samples.jsonl").is_file()  # not pruned: as it is


def test_the_store_prune_command_says_what_it_took_out(tmp_path):
    root = tmp_path / "jobs"
    JobStore(root).run("train", {"a": 1}, seeded_job([]))
    result = CliRunner().invoke(cli, ["store", "prune", str(root), "--min-bytes", str(MIN_BYTES)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("pruned 1 file(s), 0.0 MiB, from 1 job(s); removed 0 unfinished job(s)")
    again = CliRunner().invoke(cli, ["store", "prune", str(root)])
    assert again.output.startswith("pruned 0 file(s)")


def test_a_job_named_to_keep_stays_whole_and_a_name_not_in_the_store_is_refused(tmp_path):
    root = tmp_path / "jobs"
    JobStore(root).run("train", {"a": 1}, seeded_job([]))
    JobStore(root).run("train", {"a": 2}, seeded_job([], seed=2))
    kept = JobStore(root).folder("train", {"a": 2})
    done = prune(root, MIN_BYTES, frozenset({kept.name}))
    assert (done.jobs, done.files) == (1, 1)
    assert (kept / "model" / "weights.safetensors").is_file() and not (kept / PRUNED).exists()
    with pytest.raises(DihalError, match=r"^no finished job train-nothere in .* to keep$"):
        prune(root, MIN_BYTES, frozenset({"train-nothere"}))


def test_a_path_named_to_keep_stays_the_rest_of_its_job_is_pruned_and_reading_it_makes_nothing_again(tmp_path):
    root, calls = tmp_path / "jobs", []

    def trained(folder: Path) -> dict:  # weights and an optimizer state, as a baseline's training job
        result = seeded_job(calls)(folder)
        (folder / "checkpoint").mkdir()
        save_file({"m": torch.zeros(64, 64)}, str(folder / "checkpoint" / "optimizer.safetensors"))
        return result

    first = JobStore(root).run("train", {"a": 1}, trained)
    folder = JobStore(root).folder("train", {"a": 1})
    done = prune(root, MIN_BYTES, frozenset({f"{folder.name}/model"}))
    assert (done.jobs, done.files) == (1, 1)
    assert (folder / "model" / "weights.safetensors").is_file()
    assert not (folder / "checkpoint" / "optimizer.safetensors").exists()
    store = JobStore(root)
    assert store.run("train", {"a": 1}, trained) == first
    assert store.resolve(f"{folder.name}/model").is_dir() and len(calls) == 1
    with pytest.raises(DihalError, match=rf"^no weights in job {folder.name} of .* to keep$"):
        prune(root, MIN_BYTES, frozenset({f"{folder.name}/weights"}))


def test_a_folder_that_is_no_job_store_is_refused_and_left_as_it_is(tmp_path):
    root = tmp_path / "runs"
    JobStore(root / "ladder" / "jobs").run("train", {"a": 1}, seeded_job([]))
    with pytest.raises(DihalError, match=r"is not a job store \(--out/<suite>/jobs\): ladder is not a job folder$"):
        prune(root, MIN_BYTES)
    assert (root / "ladder" / "jobs" / JobStore(root).folder("train", {"a": 1}).name / "result.json").exists()


def test_a_remake_compares_the_numbers_of_a_result_but_not_its_wall_times_flags_or_text():
    recorded = {"final_loss": 0.5, "steps": 600, "train_seconds": 75.0, "in_budget": True, "checkpoint": "a/b",
                "parameters": {"denoiser": 10}}
    remade = {"final_loss": 0.25, "steps": 600, "train_seconds": 80.0, "in_budget": False, "checkpoint": "c/d",
              "parameters": {"denoiser": 11}}
    assert differing_numbers(recorded, remade) == {"final_loss": {"recorded": 0.5, "remade": 0.25}}
    assert differing_numbers(recorded, {}) == {}
