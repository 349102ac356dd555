"""lm-eval's per-document records (``log_samples``) as JSON lines, one file per task.

Each line is one of lm-eval's sample dicts as it made it: ``doc_id``, ``doc``, ``target``,
``arguments`` (the requests' arguments), ``resps`` and ``filtered_resps`` (the model's answers
before and after the task's filter), ``filter``, ``metrics`` (the names of the metrics it
scored), lm-eval's ``doc_hash``/``prompt_hash``/``target_hash``, then each metric's value for
this document. One line per document and filter, in lm-eval's order.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

from dihal_bench.base.files import atomic_path

#: how a task's sample log is named in the output folder: ``samples_<task>.jsonl``
PREFIX, SUFFIX = "samples_", ".jsonl"
#: non-finite floats, which JSON has no numbers for, as the strings JavaScript prints for them
NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def sample_log_name(task: str) -> str:
    """``samples_<task>.jsonl``; a task name with characters other than letters, digits, ``.``,
    ``_`` and ``-`` has them replaced by ``_`` and gets 8 hex digits of its sha256, so that two
    names never share a file."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task)
    if safe != task or not task:
        safe = f"{safe}-{hashlib.sha256(task.encode('utf-8')).hexdigest()[:8]}"
    return f"{PREFIX}{safe}{SUFFIX}"


def json_safe(value):
    """``value`` as plain JSON values, converted deterministically: tuples become lists, sets
    sorted lists (numbers, then strings, then the rest by their JSON), numpy and torch values
    their ``tolist()``, non-finite floats the strings "NaN", "Infinity" and "-Infinity", mapping
    keys strings (as ``json.dumps`` writes them), bytes text (undecodable bytes as ``\\xNN``),
    anything else its ``str()``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else NON_FINITE[repr(float(value))]
    if isinstance(value, Mapping):
        return {_key(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    if isinstance(value, (set, frozenset)):
        return sorted((json_safe(item) for item in value), key=_order)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="backslashreplace")
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return json_safe(value.tolist())
    return str(value)


def _order(item) -> tuple:
    """A set's items in order: numbers by value, then strings, then anything else by its JSON."""
    if isinstance(item, (int, float)):
        return (0, item, "")
    if isinstance(item, str):
        return (1, 0, item)
    return (2, 0, json.dumps(item, sort_keys=True))


def _key(key) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int)) or (isinstance(key, float) and math.isfinite(key)):
        return json.dumps(key)
    return str(json_safe(key))


def sample_line(sample: dict) -> str:
    """One sample as one line of strict JSON (no NaN), keys in lm-eval's order."""
    return json.dumps(json_safe(sample), allow_nan=False) + "\n"


def write_sample_logs(samples: dict[str, list[dict]], out_dir: Path) -> dict[str, str]:
    """Write each task's samples to ``out_dir/samples_<task>.jsonl`` atomically (a killed run
    leaves the previous file or none, never half of one). Returns task -> file name."""
    written = {}
    for task in sorted(samples):
        name = sample_log_name(task)
        with atomic_path(Path(out_dir) / name) as temporary, temporary.open("w", encoding="utf-8") as out:
            for sample in samples[task]:
                out.write(sample_line(sample))
        written[task] = name
    return written
