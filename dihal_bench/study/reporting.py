"""Reporters: a finished run handed to trackers (``dihal-bench run --report-to NAME``; none by default).

A reporter is a plugin (``register_reporters``, dihal_bench/registry/hookspecs.py) called once the
run's record and its samples file are written, with a :class:`RunReport`: the record as written,
its params (the resolved suite config flattened to dotted keys), its metrics (every numeric metric
value, keyed ``seed<seed>/<method>/<metric>``) and its artifacts (the record, and its samples file
where it is there). The names are checked before the run starts
(:func:`dihal_bench.study.preflight.check_reporters`): an unknown name, or a reporter whose ``check``
says it cannot run here (a missing package), stops the run before any work. The record is the
product: a reporter that raises is one warning line, and the record stays
(docs/method.md#records-and-leaderboards).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from dihal_bench.base.files import warn
from dihal_bench.registry.plugins import Registration, get_registry
from dihal_bench.study.sample_export import samples_path

#: under the run's --out folder: each reporter's own folder, ``reports/<name>``
REPORTS_FOLDER = "reports"


@dataclass(frozen=True)
class RunReport:
    """What a reporter receives about one finished run."""

    record_path: Path
    #: the sealed record, as read back from ``record_path``
    record: dict
    #: the resolved suite config flattened to dotted keys (``"budget.steps": 6``); lists and empty
    #: tables are values as they are (``"seeds": [0, 1]``)
    params: dict[str, object]
    #: every numeric (int or float, not bool) metric value: ``"seed1/dihal-chosen/gen_ppl": 31.2``
    metrics: dict[str, float | int]
    #: ``"record"``: the record's path; ``"samples"``: its samples file, where it is beside it
    artifacts: dict[str, Path]
    #: where this reporter may write files: ``<--out>/reports/<name>`` (not created for it)
    out_dir: Path


def flatten(table: dict, prefix: str = "") -> dict[str, object]:
    """``{"a": {"b": 1}, "c": [2]}`` -> ``{"a.b": 1, "c": [2]}``; an empty table stays a value."""
    flat: dict[str, object] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{name}.")
        else:
            flat[name] = value
    return flat


def metric_values(record: dict) -> dict[str, float | int]:
    """Each numeric metric value of each seed and method, keyed ``seed<seed>/<method>/<metric>``, in
    the record's order; None, text, lists (per-sample values) and non-finite numbers are left out."""
    values: dict[str, float | int] = {}
    for entry in record.get("per_seed", []):
        for method, row in entry.get("methods", {}).items():
            for name, value in (row.get("metrics") or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    values[f"seed{entry['seed']}/{method}/{name}"] = value
    return values


def run_report(record_path: Path, out_dir: Path) -> RunReport:
    """The :class:`RunReport` of the record at ``record_path``, as written there."""
    record_path = Path(record_path)
    record = json.loads(record_path.read_text(encoding="utf-8"))
    artifacts = {"record": record_path}
    if samples_path(record_path).is_file():
        artifacts["samples"] = samples_path(record_path)
    return RunReport(record_path, record, flatten(record.get("config") or {}), metric_values(record), artifacts,
                     Path(out_dir))


def report_run(record_path: Path, names: Iterable[str], out_root: Path) -> list[str]:
    """Hand the written record at ``record_path`` to each reporter in ``names`` (in order, each once);
    the names of those that finished. One that raises is one warning line: the record stays."""
    names = list(dict.fromkeys(names))
    if not names:
        return []
    try:
        report = run_report(record_path, Path(out_root) / REPORTS_FOLDER)
    except Exception as exc:  # noqa: BLE001 - the record is written; nothing here may lose it
        warn(f"{record_path} is written, but could not be read back for its reporters ({_one_line(exc)})")
        return []
    done = []
    for name in names:
        registration: Registration | None = None
        try:
            registration = get_registry().get("reporter", name)
            # each its own copy: one reporter's edits never reach the next
            registration.obj(replace(copy.deepcopy(report), out_dir=report.out_dir / name))
        except Exception as exc:  # noqa: BLE001 - a reporter's failure must not lose the record
            source = f" from {registration.source}" if registration is not None else ""
            warn(f"reporter {name!r}{source} failed ({_one_line(exc)}); the record {record_path} is written")
            continue
        done.append(name)
    return done


def _one_line(exc: BaseException) -> str:
    detail = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
