"""Run records: the v2 schema shipped in the package, the migration of v1 records, and seals."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path

import pytest

from dihal_bench.errors import DihalError
from dihal_bench.lm_eval.record import attach_to_record
from dihal_bench.study.records import (
    DAMAGED,
    DIGEST_ALGORITHM,
    RECORD_FORMAT,
    RECORD_SCHEMA,
    UNVERIFIED,
    VERIFIED,
    Integrity,
    load_record,
    migrate_v1,
    record_integrity,
    record_problem,
    seal_record,
    write_record,
)

COMMITTED = sorted(Path(__file__).parents[1].glob("results/*.json"))


def test_the_schema_ships_in_the_package_and_is_a_valid_schema():
    import jsonschema

    schema = json.loads(RECORD_SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["properties"]["format"]["const"] == RECORD_FORMAT


@pytest.mark.parametrize("path", COMMITTED, ids=[p.name for p in COMMITTED])
def test_every_committed_record_loads_as_v2(path):
    raw = json.loads(path.read_text())
    record = load_record(path)
    assert record["format"] == RECORD_FORMAT and record_problem(record) is None
    assert record["per_seed"][0]["methods"].keys() == raw["per_seed"][0]["methods"].keys()
    if raw["format"].endswith("/v1"):
        # v1 kept no metric descriptions: the migration takes them from the registered metrics
        assert record["metrics"]["gen_ppl"]["higher_is_better"] is False
        assert record["metrics"]["entropy"]["higher_is_better"] is True


def v1_record() -> dict:
    method = {"kind": "baseline", "in_budget": False, "parameters": {}, "samples": {"path": "s.jsonl", "count": 2},
              "metrics": {"gen_ppl": 10.0, "gen_ppl_tokens": 20, "someone_elses_metric": 3.0}, "latency": None}
    seed = {"seed": 0, "locate": {"layers": [1, 2], "score": [0.1, -0.1], "chosen_layer": 1, "proxies": {},
                                  "preprocessing": "trace"},
            "sweep": {"layers": [{"layer": 1}], "budget": {}, "correlations": {}}, "roles": {"chosen": 1},
            "budget": {}, "methods": {"ar-backbone": method}}
    return {"format": "dihal-bench/run-record/v1", "suite": "s", "backbone": "b", "corpus": "c", "evaluator": "e",
            "seeds": [0], "config": {}, "created": "now", "environment": {}, "timings": {"total_seconds": 1.0},
            "jobs": "runs/s/jobs", "per_seed": [seed]}


def test_migration_describes_registered_metrics_and_leaves_the_rest_alone():
    original = v1_record()
    migrated = migrate_v1(copy.deepcopy(original))
    assert original == v1_record()  # the input is not modified
    assert list(migrated["metrics"]) == ["gen_ppl"]  # side values and unregistered metrics get no column
    assert migrated["metrics"]["gen_ppl"]["display_name"]
    assert migrated["per_seed"][0]["units"] == []
    assert migrated["per_seed"][0]["methods"] == original["per_seed"][0]["methods"]
    assert record_problem(migrated) is None


@pytest.mark.parametrize("damage, message", [
    (lambda r: r.pop("metrics"), "'metrics' is a required property"),
    (lambda r: r["per_seed"][0]["methods"]["ar-backbone"].update(kind="oracle"), "kind"),
    (lambda r: r["per_seed"][0].update(seed=-1), "seed"),
    (lambda r: r["metrics"]["gen_ppl"].update(higher_is_better="yes"), "higher_is_better"),
    (lambda r: r.update(format="dihal-bench/run-record/v9"), "format"),
])
def test_a_record_off_the_schema_is_named_with_what_is_wrong(tmp_path, damage, message):
    record = migrate_v1(v1_record())
    damage(record)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(record))
    with pytest.raises(DihalError, match=message) as error:
        load_record(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


# -- seals (docs/method.md#records-and-leaderboards) ----------------------------------------


def sealed_v2(store: Path | None = None) -> dict:
    record = migrate_v1(v1_record())
    record["per_seed"][0]["methods"]["ar-backbone"]["train"] = {"model_dir": "baseline-train-1/model"}
    record["per_seed"][0]["methods"]["ar-backbone"]["samples"]["path"] = "samples-2/samples.jsonl"
    return seal_record(record, store)


def test_the_seal_is_the_sha256_of_the_canonical_json_of_record_and_seal():
    record = sealed_v2()
    body = {key: value for key, value in record.items() if key != "integrity"}
    canonical = json.dumps({"record": body, "integrity": {"algorithm": DIGEST_ALGORITHM, "artifacts": {}}},
                           sort_keys=True, separators=(",", ":"))
    assert record["integrity"]["sha256"] == hashlib.sha256(canonical.encode()).hexdigest()
    assert record_integrity(record) == Integrity(VERIFIED)


def test_layout_does_not_break_a_seal_and_any_changed_value_does(tmp_path):
    record = sealed_v2()
    relaid = json.loads(json.dumps(dict(reversed(list(record.items()))), indent=4))
    assert record_integrity(relaid).status == VERIFIED
    for change in (lambda r: r["per_seed"][0]["methods"]["ar-backbone"]["metrics"].update(gen_ppl=12.5),
                   lambda r: r.update(suite="other"),
                   lambda r: r["integrity"]["artifacts"].update({"x/result.json": "0" * 64}),
                   lambda r: r.update(extra=None)):
        edited = copy.deepcopy(record)
        change(edited)
        assert record_integrity(edited).status == DAMAGED
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(edited))
        with pytest.raises(DihalError, match=f"run record {re.escape(str(path))} does not match the sha256 in its"):
            load_record(path)


def test_the_seal_holds_the_cited_job_results_and_names_one_that_changed(tmp_path):
    store = tmp_path / "jobs"
    for job in ("baseline-train-1", "samples-2"):
        (store / job).mkdir(parents=True)
        (store / job / "result.json").write_text(json.dumps({"job": job}))
    record = sealed_v2(store)
    assert record["integrity"]["artifacts"] == {
        f"{job}/result.json": hashlib.sha256(json.dumps({"job": job}).encode()).hexdigest()
        for job in ("baseline-train-1", "samples-2")}
    assert record_integrity(record, store) == Integrity(VERIFIED)
    (store / "samples-2" / "result.json").write_text("{}")
    assert record_integrity(record, store) == Integrity(VERIFIED, changed=("samples-2/result.json",))
    assert record_integrity(record, tmp_path / "elsewhere") == Integrity(VERIFIED)  # a store not at hand


def test_a_record_without_a_seal_is_unverified_and_still_loads(tmp_path):
    assert record_integrity(v1_record()).status == UNVERIFIED
    for path in COMMITTED:  # written before records were sealed, or sealed by the runner
        raw = json.loads(path.read_text())
        assert record_integrity(raw).status == (VERIFIED if "integrity" in raw else UNVERIFIED)
        load_record(path)
    assert any("integrity" not in json.loads(path.read_text()) for path in COMMITTED)  # the older ones


def test_lm_eval_results_reseal_a_sealed_record_and_an_edited_one_is_refused(tmp_path):
    path = tmp_path / "r.json"
    write_record(path, sealed_v2())
    artifacts = json.loads(path.read_text())["integrity"]["artifacts"]
    summary = {"results": {"task": {"ppl": 3.0}}, "config": {"limit": 1}}
    attach_to_record(path, "ar-backbone", 0, summary)
    attached = json.loads(path.read_text())
    assert attached["per_seed"][0]["methods"]["ar-backbone"]["lm_eval"] == {"task": {"ppl": 3.0}}
    assert record_integrity(attached).status == VERIFIED and attached["integrity"]["artifacts"] == artifacts
    path.write_text(path.read_text().replace('"ppl": 3.0', '"ppl": 1.0'))
    with pytest.raises(DihalError, match="does not match the sha256 in its seal"):
        attach_to_record(path, "ar-backbone", 0, summary)
    unsealed = tmp_path / "old.json"
    unsealed.write_text(json.dumps(migrate_v1(v1_record())))
    attach_to_record(unsealed, "ar-backbone", 0, summary)
    assert record_integrity(json.loads(unsealed.read_text())).status == UNVERIFIED  # not vouched for now
