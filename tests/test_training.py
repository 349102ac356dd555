"""Budget parsing and checks; the shared training loop, its schedule and its checkpoints."""

import json
import math
import os
import stat
import time
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from dihal_bench.base.values import parse_value
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.training import (
    bridge_windows,
    packed_split,
    training_subset,
    validation_subset,
)
from dihal_bench.registry.resolve import load_corpus
from dihal_bench.training import loop as training
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import (
    batch_indices,
    count_trainable,
    learning_rate,
    train,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- Budget ---------------------------------------------------------------------------


def test_budget_defaults_and_derived_sizes():
    budget = Budget()
    assert (budget.steps, budget.batch_size, budget.seq_len, budget.lr) == (300, 16, 64, 3e-4)
    assert budget.tokens_per_step == 16 * 64
    assert budget.sequences_needed == 300 * 16


def test_budget_dict_round_trip():
    budget = Budget(steps=7, param_allowance=1000, seed=3)
    assert Budget.from_dict(json.loads(json.dumps(budget.to_dict()))) == budget
    with pytest.raises(DihalError, match="steps_per_epoch"):
        Budget.from_dict({"steps_per_epoch": 3})


def overridden(budget: Budget, typed: dict[str, str]) -> Budget:
    """``budget`` with values as a user types them after ``--set budget.KEY=`` (TOML syntax)."""
    return Budget.from_dict({**budget.to_dict(), **{key: parse_value(value) for key, value in typed.items()}})


def test_typed_overrides_parse_to_field_types():
    budget = overridden(Budget(param_allowance=5),
        {"steps": "1e3", "lr": "0.001", "batch_size": "8", "param_allowance": "none", "epochs": "3"}
    )
    assert budget.steps == 1000 and isinstance(budget.steps, int)
    assert budget.lr == 0.001 and budget.batch_size == 8 and budget.epochs == 3
    assert budget.param_allowance is None
    assert overridden(Budget(), {"param_allowance": "2_000_000"}).param_allowance == 2_000_000


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"stepz": "10"}, r"unknown budget key\(s\) stepz"),
        ({"steps": "2.5"}, "budget.steps must be an integer"),
        ({"lr": "fast"}, "budget.lr must be a finite number"),
        ({"steps": "0"}, "budget.steps must be at least 1"),
        ({"warmup_frac": "1.5"}, "warmup_frac"),
    ],
)
def test_typed_overrides_reject_bad_input(overrides, message):
    with pytest.raises(DihalError, match=message):
        overridden(Budget(), overrides)


def test_replace_returns_new_budget():
    budget = Budget()
    assert budget.replace(steps=5).steps == 5 and budget.steps == 300


def test_check_fits_counts_epochs():
    budget = Budget(steps=10, batch_size=4, seq_len=8)
    budget.check_fits(40)  # exactly one pass
    budget.replace(epochs=2).check_fits(20)
    with pytest.raises(DihalError) as error:
        budget.check_fits(39)
    message = str(error.value)
    assert "40 training sequences" in message and "320 tokens" in message
    assert "39 sequences" in message and "312 tokens" in message and "epochs" in message


def test_check_allowance():
    budget = Budget(param_allowance=1000)
    assert Budget().check_allowance({"bridge": 5}) is None
    assert budget.check_allowance({"bridge": 900, "decoder": 150}) == pytest.approx(0.05)
    assert budget.check_allowance({"bridge": 900}) == pytest.approx(-0.10)
    with pytest.raises(DihalError, match=r"has 1,200 trainable parameters .*20\.0% over the allowance 1,000"):
        budget.check_allowance({"a": 1100, "b": 100}, name="LD4LG")
    with pytest.raises(DihalError, match="50.0% under"):
        budget.check_allowance({"a": 500})


# -- schedule and batches ---------------------------------------------------------------


def test_learning_rate_warmup_then_cosine():
    budget = Budget(steps=20, warmup_frac=0.2, lr=1.0)  # 4 warm-up steps, 16 decay steps
    assert learning_rate(budget, 0) == pytest.approx(0.25)
    assert learning_rate(budget, 3) == pytest.approx(1.0)
    assert learning_rate(budget, 4) == pytest.approx(1.0)
    assert learning_rate(budget, 12) == pytest.approx(0.5)
    assert learning_rate(budget, 19) == pytest.approx(0.5 * (1 + math.cos(math.pi * 15 / 16)))
    assert learning_rate(budget.replace(warmup_frac=0.0), 0) == pytest.approx(1.0)


def test_batches_cover_each_epoch_once_and_reshuffle():
    budget = Budget(steps=10, batch_size=4, epochs=2)
    first = torch.cat([batch_indices(budget, 20, step) for step in range(5)])
    second = torch.cat([batch_indices(budget, 20, step) for step in range(5, 10)])
    assert sorted(first.tolist()) == list(range(20)) and sorted(second.tolist()) == list(range(20))
    assert not torch.equal(first, second)
    assert torch.equal(batch_indices(budget, 20, 3), batch_indices(budget, 20, 3))
    assert not torch.equal(first, torch.cat([batch_indices(budget.replace(seed=1), 20, s) for s in range(5)]))


# -- the loop ---------------------------------------------------------------------------


def toy_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 4))


def toy_data() -> dict[str, torch.Tensor]:
    x = torch.randn(40, 4, generator=torch.Generator().manual_seed(0))
    return {"x": x, "y": x @ torch.tensor([[1.0, 2, 0, 0], [0, 1, 0, 3], [1, 0, 1, 0], [0, 0, 0, 1]])}


def noisy_mse(model, batch, generator):
    """Uses both the loss generator and (through dropout) the global RNG."""
    noise = 0.1 * torch.randn(batch["x"].shape, generator=generator)
    return nn.functional.mse_loss(model(batch["x"] + noise), batch["y"])


BUDGET = Budget(steps=10, batch_size=8, seq_len=1, lr=1e-2, epochs=2, checkpoint_every=3)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


def test_train_reduces_loss_and_reports_counts():
    model = toy_model(0)
    result = train(model, noisy_mse, toy_data(), BUDGET.replace(steps=40, epochs=8, lr=3e-2), progress=False)
    assert len(result.losses) == result.steps_done == 40
    assert (result.sequences_seen, result.tokens_seen) == (320, 320)
    assert result.resumed_from_step is None and result.wall_seconds > 0
    assert sum(result.losses[-5:]) < 0.3 * sum(result.losses[:5])
    assert not model.training


def test_train_refuses_budget_that_does_not_fit():
    with pytest.raises(DihalError, match="raise budget.epochs"):
        train(toy_model(0), noisy_mse, toy_data(), BUDGET.replace(epochs=1), progress=False)


class Killed(Exception):
    pass


def dies_at_step_7(loss=noisy_mse):
    """``loss`` that raises Killed at step 7 (its eighth call): the last checkpoint under BUDGET is step 6."""
    calls = []

    def dying(model, batch, generator):
        calls.append(1)
        if len(calls) == 8:
            raise Killed
        return loss(model, batch, generator)

    return dying


def train_until_killed_at_step_7(checkpoint_dir):
    """Train toy_model(0) under BUDGET until an exception at step 7: the last checkpoint is step 6."""
    with pytest.raises(Killed):
        train(toy_model(0), dies_at_step_7(), toy_data(), BUDGET, checkpoint_dir=checkpoint_dir, progress=False)
    assert json.loads((checkpoint_dir / "trainer.json").read_text())["step"] == 6


def test_a_resumed_job_counts_the_training_its_checkpoint_carries(tmp_path):
    from dihal_bench.study.jobs import RESULT, JobStore
    from dihal_bench.training.resumed import resumed_seconds

    def slow(loss):  # every step takes at least 20 ms, so the seconds before a checkpoint are known to exceed 6 x 20 ms
        def timed_loss(model, batch, generator):
            time.sleep(0.02)
            return loss(model, batch, generator)
        return timed_loss

    store, checkpoint = JobStore(tmp_path / "jobs"), tmp_path / "checkpoint"
    with pytest.raises(Killed):  # the first attempt: its checkpoint is step 6
        store.run("train", {"a": 1}, lambda folder: train(toy_model(0), dies_at_step_7(slow(noisy_mse)), toy_data(), BUDGET,
                                                         checkpoint_dir=checkpoint, progress=False) and {})
    earlier = json.loads((checkpoint / "trainer.json").read_text())["seconds"]
    assert earlier >= 6 * 0.02

    credited, started, results = resumed_seconds(), time.perf_counter(), []
    store.run("train", {"a": 1}, lambda folder: results.append(train(
        toy_model(0), slow(noisy_mse), toy_data(), BUDGET, checkpoint_dir=checkpoint, progress=False)) or {})
    attempt = time.perf_counter() - started
    assert resumed_seconds() - credited == earlier  # exactly what the checkpoint recorded
    # the training's own result, which records report, counts every attempt too
    assert results[0].earlier_seconds == earlier and results[0].seconds == earlier + results[0].wall_seconds
    seconds = json.loads(next((tmp_path / "jobs").glob(f"*/{RESULT}")).read_text())["seconds"]
    # steps 7-10 in this attempt, steps 1-6 before it: the job's seconds count both
    assert earlier + 4 * 0.02 <= seconds <= earlier + attempt
    assert json.loads((checkpoint / "trainer.json").read_text())["seconds"] >= earlier + 4 * 0.02


def test_resume_after_interrupt_is_bitwise_identical(tmp_path):
    reference = toy_model(0)
    uninterrupted = train(reference, noisy_mse, toy_data(), BUDGET, progress=False)
    train_until_killed_at_step_7(tmp_path)

    resumed = toy_model(99)  # a different init: everything must come from the checkpoint
    result = train(resumed, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    assert result.resumed_from_step == 6 and result.steps_done == 10
    assert result.losses == uninterrupted.losses
    assert_bitwise_equal(weights(resumed), weights(reference))

    finished = toy_model(5)
    again = train(finished, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    assert again.resumed_from_step == 10 and again.losses == uninterrupted.losses
    assert_bitwise_equal(weights(finished), weights(reference))


def test_checkpoint_files(tmp_path):
    model = toy_model(0)
    train(model, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "optimizer.safetensors", "trainer.json"]
    record = json.loads((tmp_path / "trainer.json").read_text())
    assert record["step"] == 10 and len(record["losses"]) == 10
    assert Budget.from_dict(record["budget"]) == BUDGET
    assert_bitwise_equal(load_file(tmp_path / "model.safetensors"), weights(model))
    optimizer_state = load_file(tmp_path / "optimizer.safetensors")
    assert {"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step", "state.3.exp_avg"} <= optimizer_state.keys()
    assert optimizer_state["state.0.step"].item() == 10


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_last_byte(path):
    # a safetensors file ends with tensor data, so this changes a stored value
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def change_a_loss_digit(path):
    record = json.loads(path.read_text())
    record["losses"][2] = round(record["losses"][2] + 0.1, 6)
    path.write_text(json.dumps(record, indent=1))


def drop_the_hashes(path):
    """A checkpoint as written before checkpoints carried sha256 sums."""
    record = json.loads(path.read_text())
    del record["sha256"]
    path.write_text(json.dumps(record, indent=1))


@pytest.mark.parametrize("file, damage, named", [
    ("model.safetensors", truncate, "model.safetensors does not match"),
    ("optimizer.safetensors", flip_last_byte, "optimizer.safetensors does not match"),
    ("optimizer.safetensors", lambda path: path.unlink(), "optimizer.safetensors cannot be read"),
    ("trainer.json", change_a_loss_digit, "trainer.json does not match its recorded sha256"),
    ("trainer.json", truncate, "trainer.json is not readable JSON"),
    ("trainer.json", drop_the_hashes, "trainer.json has no integrity record"),
])
def test_damaged_checkpoint_is_discarded_and_training_restarts(tmp_path, capsys, file, damage, named):
    reference = toy_model(0)
    uninterrupted = train(reference, noisy_mse, toy_data(), BUDGET, progress=False)
    train_until_killed_at_step_7(tmp_path)
    damage(tmp_path / file)
    capsys.readouterr()

    restarted = toy_model(0)  # the caller's seeded construction: a restart from step 0 repeats the run
    result = train(restarted, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and named in warning and "training restarts from step 0" in warning
    assert result.resumed_from_step is None and result.losses == uninterrupted.losses
    assert_bitwise_equal(weights(restarted), weights(reference))

    # the checkpoint written by the restarted run is whole again: the next call resumes from it
    again = train(toy_model(3), noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    assert again.resumed_from_step == 10 and capsys.readouterr().err == ""


def test_checkpoint_files_are_written_under_the_umask_with_no_temporaries_left(tmp_path):
    previous = os.umask(0o027)
    try:
        train(toy_model(0), noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    finally:
        os.umask(previous)
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.iterdir()}
    assert modes == {name: 0o640 for name in ("model.safetensors", "optimizer.safetensors", "trainer.json")}


def test_kill_while_writing_checkpoint_leaves_no_false_claim(tmp_path, monkeypatch):
    real_save = training.save_file
    writes = []

    def save_then_die_on_second_optimizer(tensors, path, metadata=None):
        writes.append(path)
        if sum("optimizer" in str(p) for p in writes) == 2:
            raise KeyboardInterrupt
        real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(training, "save_file", save_then_die_on_second_optimizer)
    with pytest.raises(KeyboardInterrupt):
        train(toy_model(0), noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    # model.safetensors already holds step 6, optimizer.safetensors step 3: nothing may claim either.
    assert not (tmp_path / "trainer.json").exists()

    monkeypatch.setattr(training, "save_file", real_save)
    reference = toy_model(0)
    train(reference, noisy_mse, toy_data(), BUDGET, progress=False)
    restarted = toy_model(0)
    result = train(restarted, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    assert result.resumed_from_step is None
    assert_bitwise_equal(weights(restarted), weights(reference))


def test_mismatched_checkpoint_is_an_error(tmp_path):
    train(toy_model(0), noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)
    with pytest.raises(DihalError, match=r"different budget \(lr 0.01 -> 0.02\)"):
        train(toy_model(0), noisy_mse, toy_data(), BUDGET.replace(lr=0.02), checkpoint_dir=tmp_path, progress=False)

    wider = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    with pytest.raises(DihalError, match=r"different model \(\[shape, trainable\] changed: 0.weight \[\[16, 4\]"):
        train(wider, noisy_mse, toy_data(), BUDGET, checkpoint_dir=tmp_path, progress=False)

    # checkpoint_every does not change the result, so it may differ on resume
    result = train(
        toy_model(0), noisy_mse, toy_data(), BUDGET.replace(checkpoint_every=5), checkpoint_dir=tmp_path, progress=False
    )
    assert result.resumed_from_step == 10


def test_non_finite_loss_is_an_error():
    with pytest.raises(DihalError, match="loss is nan at step 0"):
        train(toy_model(0), lambda model, batch, generator: torch.tensor(float("nan")), toy_data(), BUDGET,
              progress=False)


def test_count_trainable_is_what_the_optimizer_updates():
    torch.manual_seed(0)
    frozen, trained = nn.Linear(4, 4), nn.Linear(4, 3)
    frozen.requires_grad_(False)
    model = nn.Sequential(frozen, nn.Tanh(), trained, nn.Tanh(), nn.Linear(3, 3))
    model.register_buffer("scale", torch.ones(3))
    before = weights(model)

    def loss_fn(model, batch, generator):
        return (model(batch["x"]) * model.scale).pow(2).mean()

    train(model, loss_fn, {"x": torch.randn(8, 4)}, Budget(steps=1, batch_size=4, warmup_frac=0.0), progress=False)
    changed = sum(p.numel() for name, p in model.named_parameters() if not torch.equal(p, before[name]))
    assert count_trainable(model) == changed == 4 * 3 + 3 + 3 * 3 + 3
    assert torch.equal(frozen.weight, before["0.weight"])


def test_tied_parameters_count_once_and_checkpoint(tmp_path):
    torch.manual_seed(0)
    embedding = nn.Embedding(10, 4)
    readout = nn.Linear(4, 10, bias=False)
    readout.weight = embedding.weight  # tied, as in Diffusion-LM's rounding head
    model = nn.ModuleList([embedding, readout])
    assert count_trainable(model) == 40

    def loss_fn(model, batch, generator):
        return nn.functional.cross_entropy(model[1](model[0](batch["tokens"])), batch["tokens"])

    data = {"tokens": torch.arange(10)}
    budget = Budget(steps=4, batch_size=5, epochs=2, checkpoint_every=2)
    train(model, loss_fn, data, budget, checkpoint_dir=tmp_path, progress=False)
    assert list(load_file(tmp_path / "model.safetensors")) == ["0.weight"]
    assert model[1].weight is model[0].weight


# -- the bridge's windows -------------------------------------------------------------------


def test_bridge_windows_start_with_the_start_token_and_keep_the_length(llama_backbone, text_dir):
    """Real packed training windows of the character tokenizer (no BOS: the start is its EOS)."""
    text = training_subset(packed_split(llama_backbone, load_corpus(str(text_dir)), "train", 16), [Budget(
        steps=2, batch_size=4, seq_len=16)], seed=0)
    windows = bridge_windows(llama_backbone, text)
    eos = llama_backbone.tokenizer.eos_token_id
    assert windows.shape == text.shape and windows.dtype == text.dtype
    assert (windows[:, 0] == eos).all() and not (text == eos).any()  # packed text holds no specials
    assert torch.equal(windows[:, 1:], text[:, :-1])  # the same text, less each window's last token


def test_bridge_windows_prefer_bos_and_refuse_windows_too_short():
    backbone = SimpleNamespace(tokenizer=SimpleNamespace(bos_token_id=7, eos_token_id=1))
    text = torch.arange(12).view(3, 4)
    assert torch.equal(bridge_windows(backbone, text), torch.tensor([[7, 0, 1, 2], [7, 4, 5, 6], [7, 8, 9, 10]]))
    for bad in (torch.zeros(3, 1, dtype=torch.long), torch.zeros(4, dtype=torch.long)):
        with pytest.raises(DihalError, match="T ≥ 2"):
            bridge_windows(backbone, bad)


# -- the validation subset and the sweep -----------------------------------------------------


def test_the_validation_subset_is_seeded_and_all_means_every_window():
    windows = torch.arange(40)[:, None] * 100 + torch.arange(4)  # window i starts with 100·i
    assert torch.equal(validation_subset(windows, "all"), windows)
    assert torch.equal(validation_subset(windows, 99), windows)  # more than there are: all of them
    picked = validation_subset(windows, 10)
    assert torch.equal(picked, validation_subset(windows, 10))  # one fixed subset
    assert len(set(picked[:, 0].tolist())) == 10 and int(picked[:, 0].max()) >= 1000  # not the first ten


def test_run_sweep_trains_and_measures_one_bridge_per_layer(llama_backbone, text_dir):
    from dihal_bench.hybrid.sweep import run_sweep
    from dihal_bench.hybrid.training import BridgeSpec

    spec = BridgeSpec(options={"d_model": 16, "layers": 1, "heads": 2}, sample_steps=2,
                      budget=Budget(steps=2, batch_size=2, seq_len=16))
    result = run_sweep(llama_backbone, load_corpus(str(text_dir)), [1, 2], spec, eval_sequences=3, progress=False)
    assert [row["layer"] for row in result["layers"]] == [1, 2] and result["eval_sequences"] == 3
    assert all(row["bridge_mse"] > 0 and row["hybrid_ppl"] > 1 for row in result["layers"])
