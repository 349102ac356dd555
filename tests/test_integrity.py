"""Damage is never trusted and writes never collide: a finished job whose result or artifacts
changed is redone (same numbers); damaged bridge and baseline weights and run records are
clear errors; a job store is held by one run at a time, and a killed holder frees it; files
are written with the user's umask."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from dihal_builtin.baselines.codar import CoDAR
from dihal_builtin.baselines.common import CompactVocabulary
from dihal_builtin.bridge import DihalBridge
from safetensors.torch import load_file, save_file
from torch import nn

from dihal_bench.base.files import (
    atomic_path,
    current_umask,
    write_json_atomic,
    write_text_atomic,
)
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, save_bridge_checkpoint
from dihal_bench.lm_eval import attach_to_record, model_args_from_record
from dihal_bench.study.jobs import RESULT, JobStore
from dihal_bench.study.records import RECORD_FORMAT_V1, load_record
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- damage ---------------------------------------------------------------------------------


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def change_a_digit_of_the_result(path: Path) -> None:
    text = path.read_text()
    changed = re.sub(r'("final_loss": )(\d)', lambda m: m[1] + str((int(m[2]) + 1) % 10), text, count=1)
    assert changed != text
    path.write_text(changed)


# -- a job store with a training job ---------------------------------------------------------

BUDGET = Budget(steps=8, batch_size=8, seq_len=1, lr=1e-2, epochs=2, checkpoint_every=4)


def training_job(calls: list):
    """A job's work as the runner's are: seeded training with a checkpoint in the job folder,
    final weights and samples as artifacts, numbers in the result."""

    def work(folder: Path) -> dict:
        calls.append(folder)
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
        x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))

        def loss(m, batch, generator):
            return nn.functional.mse_loss(m(batch["x"]), batch["x"].flip(-1))

        result = train(model, loss, {"x": x}, BUDGET, checkpoint_dir=folder / "checkpoint", progress=False)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "weights.safetensors"))
        (folder / "samples.jsonl").write_text("".join(json.dumps({"loss": v}) + "\n" for v in result.losses))
        return {"final_loss": result.losses[-1], "losses": result.losses,
                "resumed_from_step": result.resumed_from_step}

    return work


@pytest.fixture
def finished_job(tmp_path):
    """(store, folder, first result, calls): one training job, run to the end once."""
    store, calls = JobStore(tmp_path / "jobs"), []
    first = store.run("train", {"a": 1}, training_job(calls))
    assert len(calls) == 1 and first["resumed_from_step"] is None
    return store, store.folder("train", {"a": 1}), first, calls


def test_result_json_records_the_sha256_of_the_result_and_every_artifact(finished_job):
    _, folder, first, _ = finished_job
    stored = json.loads((folder / RESULT).read_text())
    assert stored["result"] == first
    assert set(stored["sha256"]["files"]) == {"spec.json", "weights.safetensors", "samples.jsonl",
                                              "checkpoint/model.safetensors", "checkpoint/optimizer.safetensors",
                                              "checkpoint/trainer.json"}


def test_an_intact_finished_job_is_reused(finished_job, capsys):
    store, _, first, calls = finished_job
    assert store.run("train", {"a": 1}, training_job(calls)) == first
    assert len(calls) == 1 and capsys.readouterr().err == ""


@pytest.mark.parametrize("file, damage", [
    ("weights.safetensors", flip_last_byte),
    ("samples.jsonl", truncate),
    ("spec.json", lambda path: path.unlink()),
    (RESULT, change_a_digit_of_the_result),
    (RESULT, truncate),
])
def test_a_damaged_artifact_or_result_makes_the_job_run_again(finished_job, capsys, file, damage):
    store, folder, first, calls = finished_job
    damage(folder / file)
    capsys.readouterr()
    again = store.run("train", {"a": 1}, training_job(calls))
    warning = capsys.readouterr().err
    assert len(calls) == 2 and warning.count("\n") == 1
    assert str(folder / file) in warning and f"redoing job {folder}" in warning
    # the checkpoint is intact: training resumes at its last step and gives the same numbers
    assert again == {**first, "resumed_from_step": BUDGET.steps}
    assert store.run("train", {"a": 1}, training_job(calls)) == again and len(calls) == 2


def test_a_damaged_training_checkpoint_in_a_finished_job_retrains_from_step_0(finished_job, capsys):
    store, folder, first, calls = finished_job
    reference = load_file(folder / "weights.safetensors")
    flip_last_byte(folder / "checkpoint" / "optimizer.safetensors")
    capsys.readouterr()
    again = store.run("train", {"a": 1}, training_job(calls))
    job_warning, training_warning = capsys.readouterr().err.splitlines()
    assert "checkpoint/optimizer.safetensors does not match the sha256 recorded in" in job_warning
    assert "training restarts from step 0" in training_warning
    assert again == first  # restarted from scratch: resumed_from_step None, same losses
    retrained = load_file(folder / "weights.safetensors")
    assert all(torch.equal(retrained[key], value) for key, value in reference.items())


def test_a_result_written_without_integrity_record_is_redone(finished_job, capsys):
    store, folder, first, calls = finished_job
    stored = json.loads((folder / RESULT).read_text())
    del stored["sha256"]
    (folder / RESULT).write_text(json.dumps(stored))
    assert store.run("train", {"a": 1}, training_job(calls)) == {**first, "resumed_from_step": BUDGET.steps}
    assert "has no integrity record" in capsys.readouterr().err


# -- the store lock ---------------------------------------------------------------------------

HOLDER = """
import sys, time
from pathlib import Path
from dihal_bench.study.jobs import JobStore
with JobStore(Path(sys.argv[1])).lock():
    print("holding", flush=True)
    time.sleep(120)
"""


def test_a_store_held_by_a_live_run_is_refused_and_a_killed_runs_lock_is_free(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        message = (rf"^job store {re.escape(str(tmp_path))} is in use by another dihal-bench run "
                   rf"\(pid {holder.pid}\); wait for it or use another --out$")
        with pytest.raises(DihalError, match=message):
            with JobStore(tmp_path).lock():
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        with JobStore(tmp_path).lock():  # no stale lock to clean up by hand
            assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


def test_the_lock_is_released_when_the_run_ends_or_fails(tmp_path):
    store = JobStore(tmp_path / "new")  # the store folder need not exist yet
    with store.lock():
        with pytest.raises(DihalError, match="is in use by another dihal-bench run"):
            with JobStore(tmp_path / "new").lock():
                pass
    with pytest.raises(KeyError):
        with store.lock():
            raise KeyError("a failing run")
    with store.lock():
        pass


# -- modes and atomic writes --------------------------------------------------------------------


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_are_written_with_the_users_umask(tmp_path, umask, mode):
    rewritten = tmp_path / "tracked.txt"
    rewritten.write_text("before")
    os.chmod(rewritten, 0o600)  # as the atomic writes of earlier versions left files
    previous = os.umask(umask)
    try:
        assert current_umask() == umask
        write_json_atomic(tmp_path / "out" / "a.json", {"x": 1})
        write_text_atomic(rewritten, "after")
        JobStore(tmp_path / "jobs").run("kind", {}, lambda folder: {"y": 2})
    finally:
        os.umask(previous)
    written = [tmp_path / "out" / "a.json", rewritten, *(tmp_path / "jobs").glob("kind-*/*.json")]
    assert len(written) == 4
    assert {path.name: stat.S_IMODE(path.stat().st_mode) for path in written} == {
        path.name: mode for path in written}
    assert rewritten.read_text() == "after"


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("old")
    with pytest.raises(ValueError):
        with atomic_path(target) as temporary:
            assert temporary.parent == tmp_path and temporary != target
            temporary.write_text("half")
            raise ValueError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
    target = tmp_path / "checkpoint.safetensors"
    with atomic_path(target) as first, atomic_path(target) as second:
        assert first != second
        first.write_text("first")
        second.write_text("second")
    assert target.read_text() == "first"  # the outer block ends last: its content wins whole


# -- bridge and baseline weights --------------------------------------------------------------


@pytest.fixture
def bridge_checkpoint(tmp_path, llama_backbone) -> Path:
    with torch.random.fork_rng():
        torch.manual_seed(5)
        bridge = DihalBridge(llama_backbone.width, d_model=16, layers=1, heads=2, steps=2, max_len=48)
    return save_bridge_checkpoint(bridge, "dihal-bridge", 1, llama_backbone.name, tmp_path / "bridge")


@pytest.mark.parametrize("damage, older, message", [
    (truncate, False, "does not match the sha256 recorded in"),
    (flip_last_byte, False, "does not match the sha256 recorded in"),
    # a checkpoint without its sha256, loaded with trust_unverified: safetensors' own checks still apply
    (truncate, True, "is not a readable safetensors file"),
])
def test_damaged_bridge_weights_are_an_error_naming_the_file(bridge_checkpoint, llama_backbone, damage, older,
                                                             message):
    if older:
        meta = json.loads((bridge_checkpoint / "bridge.json").read_text())
        del meta["weights_sha256"]
        (bridge_checkpoint / "bridge.json").write_text(json.dumps(meta))
    load_bridge_checkpoint(bridge_checkpoint, llama_backbone, trust_unverified=older)
    weights = bridge_checkpoint / "model.safetensors"
    damage(weights)
    with pytest.raises(DihalError, match=re.escape(str(weights)) + ".*" + message):
        load_bridge_checkpoint(bridge_checkpoint, llama_backbone, trust_unverified=older)


def test_a_bridge_checkpoint_without_its_sha256_is_refused_unless_trusted(bridge_checkpoint, llama_backbone):
    meta_path = bridge_checkpoint / "bridge.json"
    meta = json.loads(meta_path.read_text())
    del meta["weights_sha256"]
    meta_path.write_text(json.dumps(meta))
    flip_last_byte(bridge_checkpoint / "model.safetensors")  # damage that only the digest could show
    with pytest.raises(DihalError, match=re.escape(str(meta_path)) + " records no weights_sha256.*--trust-unverified"):
        load_bridge_checkpoint(bridge_checkpoint, llama_backbone)
    _, layer = load_bridge_checkpoint(bridge_checkpoint, llama_backbone, trust_unverified=True)
    assert layer == 1


CODAR = dict(embed_dim=8, d_model=32, heads=2, denoiser_layers=1, decoder_layers=1, steps=2)


@pytest.mark.parametrize("file, damage, message", [
    ("weights.safetensors", truncate, "weights.safetensors does not match the sha256 recorded in"),
    ("weights.safetensors", flip_last_byte, "weights.safetensors does not match the sha256 recorded in"),
    ("baseline.json", truncate, "baseline.json is not readable JSON"),
])
def test_damaged_baseline_checkpoint_is_an_error_naming_the_file(tmp_path, llama_backbone, file, damage, message):
    budget = Budget(steps=2, batch_size=2, seq_len=8)
    saved = CoDAR(llama_backbone, budget, seed=0, **CODAR)
    saved.build(CompactVocabulary((3, 4, 5), llama_backbone.vocab_size))  # as fit would, untrained
    saved.save(tmp_path)
    restored = CoDAR(llama_backbone, budget, seed=1, **CODAR)
    restored.load(tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(restored.module().state_dict().values(),
                                                 saved.module().state_dict().values()))
    damage(tmp_path / file)
    with pytest.raises(DihalError, match=message):
        CoDAR(llama_backbone, budget, seed=0, **CODAR).load(tmp_path)


# -- run records ------------------------------------------------------------------------------


def a_record(jobs: Path) -> dict:
    """A complete v1 record (the committed records' format, migrated to v2 when loaded)."""
    common = {"in_budget": False, "parameters": {}, "samples": {"path": "s/samples.jsonl", "count": 1},
              "metrics": {}, "latency": None}
    seed = {"seed": 0, "locate": {"layers": [1, 2], "score": [0.0, 1.0], "chosen_layer": 2, "proxies": {},
                                  "preprocessing": "trace"},
            "sweep": {"layers": [], "budget": {}, "correlations": {}}, "roles": {"chosen": 2}, "budget": {},
            "methods": {"dihal-chosen": {**common, "kind": "dihal", "layer": 2, "in_budget": True,
                                         "train": {"checkpoint": "dihal-train-x/bridge"}},
                        "ar-backbone": {**common, "kind": "baseline"}}}
    return {"format": RECORD_FORMAT_V1, "suite": "tiny", "backbone": "tiny-llama", "corpus": "c", "evaluator": "e",
            "seeds": [0], "created": "2026-12-01T00:00:00+00:00", "environment": {}, "timings": {},
            "jobs": str(jobs), "config": {"bridge": {"sample_steps": 4}}, "per_seed": [seed]}


def test_a_valid_record_loads_and_gives_model_args(tmp_path):
    write_json_atomic(tmp_path / "r.json", a_record(tmp_path / "jobs"))
    record = load_record(tmp_path / "r.json")
    assert model_args_from_record(record, "dihal-chosen") == (
        {"backbone": "tiny-llama", "layer": 2, "bridge": str(tmp_path / "jobs" / "dihal-train-x/bridge"), "steps": 4}, 0)


@pytest.mark.parametrize("text, problem", [
    ('{"format": "dihal-bench/run-record/v1", "per_seed": [', "is not readable JSON"),
    ("[1, 2]", "a JSON list, not an object"),
    ('{"format": "something-else"}', "format 'something-else'"),
    (json.dumps({**a_record(Path("j")), "per_seed": []}), "'per_seed' is empty"),
    (json.dumps({**a_record(Path("j")), "per_seed": [{"seed": 0, "methods": [1]}]}), "has no 'methods' object"),
    (json.dumps({k: v for k, v in a_record(Path("j")).items() if k != "backbone"}), "'backbone' is missing"),
])
def test_a_damaged_record_is_an_error_naming_the_file(tmp_path, text, problem):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(DihalError, match=re.escape(str(path)) + ".*" + re.escape(problem)):
        load_record(path)
    with pytest.raises(DihalError, match=re.escape(str(path))):
        attach_to_record(path, "dihal-chosen", 0, {"results": {}, "config": {}})
    assert path.read_text() == text  # left as it was


def test_a_malformed_method_entry_is_an_error(tmp_path):
    record = a_record(tmp_path)
    del record["per_seed"][0]["methods"]["dihal-chosen"]["train"]
    with pytest.raises(DihalError, match=r"the run record's 'dihal-chosen' \(seed 0\) is malformed: KeyError 'train'"):
        model_args_from_record(record, "dihal-chosen")
    write_json_atomic(tmp_path / "r.json", a_record(tmp_path))
    with pytest.raises(DihalError, match="has no method 'sed' for seed 0"):
        attach_to_record(tmp_path / "r.json", "sed", 0, {"results": {}, "config": {}})
