"""Run records: the v2 schema shipped in the package, and the migration of v1 records."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dihal_bench.errors import DihalError
from dihal_bench.records import (
    RECORD_FORMAT,
    RECORD_SCHEMA,
    load_record,
    migrate_v1,
    record_problem,
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
