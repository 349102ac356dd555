"""Budget scales (docs/method.md#budget-scales): a suite's trained rows at several multiples of the
matched budget, each scale its own row with its own jobs; the scale-1 rows keep their names and keys."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from test_suite_config import RecordingStore

from dihal_bench.config.suite import apply_overrides, resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.study import runner
from dihal_bench.study.compute import backbone_flops, row_compute
from dihal_bench.study.executors import LocalExecutor
from dihal_bench.study.jobs import spec_hash
from dihal_bench.study.plan import method_labels, scaled_budget, scaled_label, seed_units, split_scale
from dihal_bench.study.preflight import check_suite
from dihal_bench.study.run import Run
from dihal_bench.training.budget import Budget

#: the smoke suite's first job of each kind, as tests/test_suite_config.py pins them
SMOKE_FIRST_TRAIN = {"dihal-train": "5ddfa9881220fe25", "baseline-train": "acbea2602cff2dfc"}


def scaled(suite: str, **sets: str):
    return apply_overrides(resolve_suite(suite)[1], sets)


def test_a_row_label_and_its_scale_round_trip():
    for label in ("diffusion-lm", "dihal-chosen", "control-regressor", "ar-lora"):
        for scale in (1, 2, 32):
            assert split_scale(scaled_label(label, scale)) == (label, scale)
    assert scaled_label("sed", 1) == "sed" and scaled_label("sed", 4) == "sed@4x"
    assert split_scale("odd@name") == ("odd@name", 1)  # not a scale: a label may hold '@'
    assert split_scale("x@0x") == ("x@0x", 1)


def test_a_scaled_budget_is_the_same_protocol_for_longer_over_the_same_windows():
    budget = Budget(steps=600, batch_size=16, seq_len=64, epochs=6, lr=1e-3, param_allowance=1000)
    four = scaled_budget(budget, 4)
    assert (four.steps, four.epochs) == (2400, 24)
    assert four.distinct_sequences == budget.distinct_sequences  # the same windows, more passes
    assert {k: v for k, v in four.to_dict().items() if k not in ("steps", "epochs")} == \
           {k: v for k, v in budget.to_dict().items() if k not in ("steps", "epochs")}
    assert scaled_budget(budget, 1) is budget


def test_every_trained_row_gets_each_scale_and_untrained_rows_stay_at_one():
    config = scaled("diagnostic", **{"scales.factors": "[1, 2]",
                                     "scales.rows": '{"dihal-chosen" = [1, 4], "ld4lg-noise-input" = [1]}'})
    labels = {label: scale for label, _, _, scale in method_labels(config)}
    assert labels["dihal-chosen"] == 1 and labels["dihal-chosen@4x"] == 4 and "dihal-chosen@2x" not in labels
    assert labels["dihal-worst@2x"] == 2 and labels["control-regressor@2x"] == 2 and labels["sed@2x"] == 2
    assert "ld4lg-noise-input@2x" not in labels
    for untrained in ("control-skip", "reference-unigram", "reference-human", "ar-backbone"):
        assert labels[untrained] == 1 and not any(label.startswith(untrained + "@") for label in labels)
    units = {unit.label: unit for unit in seed_units(config)}
    assert units["sed@2x"].stage == "baselines" and units["sed@2x"].scale == 2
    assert units["dihal-chosen@4x"].stage == "dihal" and units["metrics dihal-chosen@4x"].stage == "metrics"


@pytest.mark.parametrize(("sets", "message"), [
    ({"scales.factors": "[]"}, "scales.factors must be a non-empty list"),
    ({"scales.factors": "[0, 2]"}, "scales.factors"),
    ({"scales.rows": '{"sed" = "twice"}'}, "scales.rows.sed"),
])
def test_bad_scales_are_refused_naming_the_key(sets, message):
    with pytest.raises(DihalError, match=message):
        scaled("smoke", **sets)


@pytest.mark.parametrize("row", ["reference-human", "control-skip", "ar-backbone", "no-such-row"])
def test_scaling_a_row_that_trains_nothing_or_does_not_exist_is_refused(row):
    config = scaled("diagnostic", device="cpu", dtype="float32", **{"scales.rows": f'{{"{row}" = [1, 2]}}'})
    with pytest.raises(DihalError, match=f"scales.rows names '{row}', which is not a trained row of this suite"):
        check_suite(config, here=False)


class SpecStore(RecordingStore):
    """A job store that runs nothing and keeps every job's kind, key and spec."""

    def __init__(self):
        super().__init__()
        self.jobs: list[tuple[str, str, dict]] = []

    def run(self, kind: str, spec: dict, work) -> dict:
        self.jobs.append((kind, spec_hash(kind, spec), spec))
        return super().run(kind, spec, work)


def test_scaled_rows_are_jobs_of_their_own_and_the_scale_one_rows_keep_their_keys(monkeypatch):
    config = scaled("smoke", **{"scales.factors": "[1, 2]"})
    monkeypatch.setattr(runner, "layer_correlations", lambda *args, **kwargs: {})
    monkeypatch.setattr(runner, "read_samples", lambda path: ([], []))
    run = Run("smoke", config, Path("never-written"), progress=False)
    run.__dict__["backbone"] = SimpleNamespace(width=576, num_layers=30, name="smollm2-135m")
    run.store = SpecStore()
    run.reference_texts = lambda *args: []
    [entry] = runner.study_seeds(run, LocalExecutor().start(run), [0])

    trained = {kind: [(key, spec) for k, key, spec in run.store.jobs if k == kind]
               for kind in ("dihal-train", "baseline-train")}
    for kind, jobs in trained.items():
        assert jobs[0][0] == SMOKE_FIRST_TRAIN[kind]  # scale 1 first, under its old key
        by_steps: dict[int, set[str]] = {}
        for key, spec in jobs:
            by_steps.setdefault(spec["budget"]["steps"], set()).add(key)
        assert set(by_steps) == {6, 12} and not by_steps[6] & by_steps[12]  # each scale its own jobs

    methods = entry["methods"]
    assert methods["dihal-chosen"]["scale"] == 1 and methods["dihal-chosen@2x"]["scale"] == 2
    assert methods["dihal-chosen@2x"]["budget"]["steps"] == 2 * entry["budget"]["steps"]
    assert "budget" not in methods["dihal-chosen"]
    [(_, _, latency)] = [job for job in run.store.jobs if job[0] == "latency"]
    assert latency["methods"] and not any("@" in name for name in latency["methods"])  # timed at scale 1 only


def test_a_scaled_row_read_back_is_counted_from_its_own_budget():
    config = resolve_suite("diagnostic")[1].to_dict()
    budget = Budget.from_dict(config["budget"]).to_dict()
    row = {"kind": "dihal", "layer": 3, "bridge": "dihal-bridge", "sample_steps": 4, "train": {}}
    entry = {"budget": budget, "methods": {"dihal-chosen": row,
                                           "dihal-chosen@4x": {**row, "budget": {**budget, "steps": 2400, "epochs": 24}}}}
    record = {"config": config, "backbone": "smollm2-135m"}
    one, four = (row_compute(record, entry, name) for name in ("dihal-chosen", "dihal-chosen@4x"))
    # the targets pass (layers 1..3 over the same distinct windows) once; the bridge's training 4x
    windows = Budget.from_dict(budget).distinct_sequences * budget["seq_len"]
    targets = windows * backbone_flops("smollm2-135m").layers_forward(3, budget["seq_len"])
    assert 0 < targets < one["train_flops"]
    assert four["train_flops"] == pytest.approx(targets + 4 * (one["train_flops"] - targets), rel=1e-9)
    assert four["inference_flops_per_token"] == one["inference_flops_per_token"]
