"""A run record's method as lm-eval model args, and lm-eval results folded back into the record."""

from __future__ import annotations

from pathlib import Path

from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.study.records import INTEGRITY, load_record, write_record


def is_intact_backbone(method: dict) -> bool:
    """Whether a record's method is the intact backbone: a baseline outside the matched budget
    that trained no parameters (``dihal_bench.study.runner.baseline_method`` records both)."""
    trained = method.get("parameters") or {}
    return method.get("kind") == "baseline" and method.get("in_budget") is False and not any(trained.values())


def model_args_from_record(record: dict, method: str, seed: int | None = None) -> tuple[dict, int]:
    """lm-eval model args for one method of a run record (as `load_record` returns it): the
    backbone for the intact backbone, the trained hybrid (backbone, layer, bridge checkpoint)
    for a DiHAL method."""
    runs = record["per_seed"]
    entry = next((r for r in runs if seed is None or r["seed"] == seed), None)
    if entry is None:
        raise DihalError(f"the record has no seed {seed}; it has {[r['seed'] for r in runs]}")
    if method not in entry["methods"]:
        raise DihalError(f"the record has no method {method!r}; it has {', '.join(entry['methods'])}")
    found = entry["methods"][method]
    if is_intact_backbone(found):
        return {"backbone": record["backbone"]}, entry["seed"]
    if found.get("kind") != "dihal":
        raise DihalError(f"lm-eval scores next-token models, the intact backbone and DiHAL hybrids; "
                         f"{method!r} (a trained {found.get('kind')}) is neither")
    try:
        checkpoint, layer = Path(found["train"]["checkpoint"]), int(found["layer"])
        steps = record["config"]["bridge"]["sample_steps"]
    except (KeyError, TypeError, ValueError) as exc:
        raise DihalError(f"the run record's {method!r} (seed {entry['seed']}) is malformed: "
                         f"{type(exc).__name__} {exc}") from None
    if not checkpoint.is_absolute() and not checkpoint.exists():  # stored relative to the job store
        checkpoint = Path(record["jobs"]) / checkpoint
    return {"backbone": record["backbone"], "layer": layer, "bridge": str(checkpoint), "steps": steps}, entry["seed"]


def attach_to_record(record_path: Path, method: str, seed: int, summary: dict) -> None:
    """Store ``summary`` as ``per_seed[seed].methods[method].lm_eval`` and rewrite the record
    atomically; DihalError naming the file when the record is unreadable, malformed or does
    not match its seal. A sealed record is sealed again over its new content (keeping the digests
    of the job results it cites); an unsealed one stays unsealed: sealing it now would vouch
    for content nobody checked."""
    record = load_record(record_path)  # refuses a record that does not match its seal
    entries = [entry for entry in record["per_seed"] if entry["seed"] == seed and method in entry["methods"]]
    if not entries:
        raise DihalError(f"run record {record_path} has no method {method!r} for seed {seed}")
    for entry in entries:
        entry["methods"][method]["lm_eval"] = summary["results"]
        entry["methods"][method]["lm_eval_config"] = summary["config"]
    if INTEGRITY in record:
        write_record(Path(record_path), record, artifacts=record[INTEGRITY]["artifacts"])
    else:
        write_json_atomic(Path(record_path), record)
