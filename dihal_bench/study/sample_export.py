"""Every sample of a run, inspectable: ``<record stem>.samples.jsonl`` beside the run record
(docs/method.md#records-and-leaderboards).

The record keeps five texts per method (``samples.examples``); the samples themselves stay in the
job store, which is not published. The export writes them all, one JSON line per sample, in the
record's order (seed, method, index): ``method`` (the record's label, ``<row>@<s>x`` at a budget
scale), ``seed``, ``scale``, ``index``, ``text``, ``token_ids``, a frontier point's ``temperature`` or
``diffusion_steps`` (docs/method.md#frontiers; its lines follow the seed's rows) and, where the method's metrics carry
them (Gen.PPL's per-sample side values), ``nll`` (the sample's summed token NLL under the evaluator,
nats), ``nll_tokens`` (the tokens it is summed over), ``valid`` (whether Gen.PPL counted it: the
record's NLL is None for an invalid one) and, for an invalid one, ``invalid_reason`` (the validity
rule, `dihal_bench.api.metrics.invalid_reason`, applied again to the text and count). No metric
records entropy per sample, so there is none to export. The NLLs are the record's own values, not
computed again.

Samples are exported as a record's only where they are its own: from the store its seal was made
against, or from another whose samples match the record's fingerprint of them
(`dihal_bench.study.sample_match`). `dihal-bench run` exports right after writing its record
(`export_beside`: a failure there is a warning, never a lost record); ``dihal-bench samples export
RECORD`` writes the same file later from the job store the record names.
"""

from __future__ import annotations

import json
from pathlib import Path

from dihal_bench.api.metrics import invalid_reason
from dihal_bench.base.files import file_sha256, warn, write_text_atomic
from dihal_bench.errors import DihalError
from dihal_bench.study.jobs import RESULT, JobStore
from dihal_bench.study.plan import split_scale
from dihal_bench.study.sample_match import describe, sample_entries, unmatched_rows
from dihal_bench.study.samples import read_samples

SUFFIX = ".samples.jsonl"
#: the metrics' per-sample side values the export carries: record key -> key in a line
PER_SAMPLE = {"gen_ppl_nll_per_sample": "nll", "gen_ppl_tokens_per_sample": "nll_tokens"}


def samples_path(record_path: Path) -> Path:
    """Where a record's samples go: beside it, ``<record stem>.samples.jsonl``."""
    record_path = Path(record_path)
    return record_path.with_name(record_path.stem + SUFFIX)


def export_samples(record_path: Path, record: dict, store: JobStore, out: Path | None = None) -> Path:
    """Write every sample of ``record`` (read from ``store``) as JSON lines to ``out`` (default:
    beside ``record_path``), atomically; returns the path. DihalError naming the file when a sample
    file is missing, unreadable, changed since its job stored it, or holds other samples than the
    record counts."""
    out = Path(out) if out is not None else samples_path(record_path)
    lines = [json.dumps(line, ensure_ascii=False) + "\n" for line in sample_lines(record, store)]
    write_text_atomic(out, "".join(lines))
    return out


def sample_lines(record: dict, store: JobStore) -> list[dict]:
    """One dict per sample of every seed and method, in the record's order (a frontier point's setting
    on each of its lines). DihalError where the store's samples of a row are not shown to be the
    record's (`dihal_bench.study.sample_match`)."""
    unmatched = unmatched_rows(record, store)
    if unmatched:
        raise DihalError(f"the job store {store.root} does not hold this record's samples for {len(unmatched)} "
                         f"row(s): {'; '.join(unmatched)}")
    lines = []
    for seed, method, entry, setting in sample_entries(record):
        samples = entry["samples"]
        texts, ids = _read(store, samples["path"], samples.get("count"), describe(seed, method, setting))
        lines += [line | setting for line in method_lines(method, seed, entry, texts, ids)]
    return lines


def method_lines(name: str, seed: int, method: dict, texts: list[str], ids: list[list[int]] | None) -> list[dict]:
    """One method's samples on one seed as export lines (``ids`` None: no token ids at hand)."""
    scale = method.get("scale", split_scale(name)[1])
    per_sample = per_sample_values(method, len(texts))
    lines = []
    for index, text in enumerate(texts):
        line = {"method": name, "seed": seed, "scale": scale, "index": index, "text": text}
        if ids is not None:
            line["token_ids"] = ids[index]
        line |= {key: values[index] for key, values in per_sample.items()}
        if "nll" in line:
            line["valid"] = line["nll"] is not None
            reason = None if line["valid"] else invalid_reason(text, line.get("nll_tokens"))
            if reason is not None:
                line["invalid_reason"] = reason
        lines.append(line)
    return lines


def per_sample_values(method: dict, count: int) -> dict[str, list]:
    """The method's per-sample side values that the export carries (`PER_SAMPLE`), by line key;
    {} where its metrics lack them or hold another number of samples than ``count``."""
    metrics = method.get("metrics") or {}
    values = {line_key: metrics.get(key) for key, line_key in PER_SAMPLE.items()}
    if all(isinstance(value, list) and len(value) == count for value in values.values()):
        return values
    return {}


def _read(store: JobStore, relative: str, count, what: str) -> tuple[list[str], list[list[int]]]:
    path = store.resolve(relative)
    try:
        _check_digest(path)
        texts, ids = read_samples(path)
    except FileNotFoundError:
        raise DihalError(f"the samples of {what}, {path}, are not in the job store {store.root}") from None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DihalError(f"the samples of {what}, {path}, are not readable ({type(exc).__name__}: {exc})") from None
    if isinstance(count, int) and len(texts) != count:
        raise DihalError(f"{path} holds {len(texts)} samples, the record counts {count} for {what}: the job "
                         f"store changed since the run")
    return texts, ids


def _check_digest(path: Path) -> None:
    """DihalError when the job that wrote ``path`` recorded another sha256 for it (where it did)."""
    try:
        files = json.loads((path.parent / RESULT).read_text(encoding="utf-8"))["sha256"]["files"]
        expected = files.get(path.name)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # no integrity record beside it: nothing to check against
    if isinstance(expected, str) and file_sha256(path) != expected:
        raise DihalError(f"{path} does not match the sha256 its job recorded: changed or damaged since the run")


def export_beside(record_path: Path, record: dict, store: JobStore) -> Path | None:
    """`export_samples` beside a record just written; a failure is one warning line, and the record
    stays (it is the product; the export can be done again with ``dihal-bench samples export``)."""
    try:
        return export_samples(record_path, record, store)
    except Exception as exc:  # noqa: BLE001  (whatever it was, the record must survive it)
        detail = " ".join(str(exc).split()) or type(exc).__name__
        warn(f"{record_path} is written, but not its samples file ({detail}); write it with "
             f"`dihal-bench samples export {record_path}`")
        return None
