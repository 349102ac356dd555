"""Run records: written through the atomic writers of ``dihal_bench.base.files``, read back
so that a damaged or edited one is never trusted.

A run record carries a seal (``integrity``, docs/method.md#records-and-leaderboards): the sha256
of its own content and of the job results it cites. :func:`record_integrity` tells an intact
record from an edited one and from one written before records were sealed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import string
from datetime import datetime, timezone
from pathlib import Path

from dihal_bench.base.files import file_sha256, json_sha256, jsonable, write_json_atomic
from dihal_bench.errors import DihalError

#: the schema tag of a run record (``results/*.json``)
RECORD_FORMAT = "dihal-bench/run-record/v2"
#: the format before v2, still read (through :func:`migrate_v1`)
RECORD_FORMAT_V1 = "dihal-bench/run-record/v1"
#: the JSON Schema of a v2 record, shipped in the package
RECORD_SCHEMA = Path(__file__).parent / "schemas" / "run-record-v2.schema.json"


# -- reading run records ------------------------------------------------------------------


def load_record(path: Path) -> dict:
    """The run record at ``path`` as a v2 record (a v1 record is migrated); DihalError naming
    the file when it cannot be read, is not JSON, does not match its own seal (edited or
    damaged: :func:`record_integrity`) or does not follow the record schema."""
    path = Path(path)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DihalError(f"run record {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DihalError(f"run record {path} is not readable JSON ({exc})") from None
    integrity = record_integrity(record) if isinstance(record, dict) else None
    if integrity is not None and integrity.status == DAMAGED:
        raise DihalError(f"run record {path} {integrity.detail}")
    if isinstance(record, dict) and record.get("format") == RECORD_FORMAT_V1:
        problem = _v1_problem(record)
        if problem:
            raise DihalError(f"{path} is not a valid dihal-bench run record: {problem}")
        record = migrate_v1(record)
    problem = record_problem(record)
    if problem:
        raise DihalError(f"{path} is not a valid dihal-bench run record: {problem}")
    return record


def record_problem(record) -> str | None:
    """What makes ``record`` not a v2 run record (the first schema violation), or None."""
    import jsonschema

    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    if record.get("format") != RECORD_FORMAT:
        return f"format {record.get('format')!r}, expected {RECORD_FORMAT!r} (or {RECORD_FORMAT_V1!r})"
    error = jsonschema.exceptions.best_match(_record_validator().iter_errors(record))
    if error is None:
        return None
    where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path) or "the record"
    return f"{where.lstrip('.')}: {error.message}"


@functools.cache
def _record_validator():
    import jsonschema

    schema = json.loads(RECORD_SCHEMA.read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def migrate_v1(record: dict) -> dict:
    """A v1 record as v2: the metrics it holds described from the current registry (a metric
    no installed plugin registers gets no direction and its own name as display name), no
    unit list and no example samples (v1 did not keep them)."""
    from dihal_bench.registry.plugins import get_registry

    registered = get_registry().items["metric"]
    names: list[str] = []
    for entry in record["per_seed"]:
        for method in entry["methods"].values():
            for key in method.get("metrics") or {}:
                if key in registered and key not in names:
                    names.append(key)
    migrated = {**record, "format": RECORD_FORMAT,
                "metrics": {name: metric_description(registered[name]) for name in names},
                "per_seed": [{**entry, "units": entry.get("units", [])} for entry in record["per_seed"]]}
    return migrated


def metric_description(registration) -> dict:
    """What a run record keeps of a metric's registration (record ``metrics`` entries)."""
    meta = registration.meta
    return {"higher_is_better": meta.get("higher_is_better"),
            "display_name": meta.get("display_name") or registration.name,
            "description": meta.get("description", ""), "source": registration.source}


def _v1_problem(record: dict) -> str | None:
    for key, kind in (("backbone", str), ("corpus", str), ("jobs", str), ("config", dict), ("per_seed", list)):
        if not isinstance(record.get(key), kind):
            return f"{key!r} is missing or not a {kind.__name__}"
    if not record["per_seed"]:
        return "'per_seed' is empty"
    for index, entry in enumerate(record["per_seed"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("seed"), int):
            return f"per_seed[{index}] has no integer 'seed'"
        methods = entry.get("methods")
        if not isinstance(methods, dict) or not all(isinstance(m, dict) for m in methods.values()):
            return f"per_seed[{index}] (seed {entry['seed']}) has no 'methods' object of method entries"
    return None


# -- sealing run records -------------------------------------------------------------------

#: the key of a run record's seal: {"algorithm", "artifacts", "sha256"}
INTEGRITY = "integrity"
#: how the seal's sha256 is computed: :func:`json_sha256` of {"record": the record without its
#: seal, "integrity": the seal without its sha256}
DIGEST_ALGORITHM = "sha256/canonical-json/v1"
#: what a record's seal says about it
VERIFIED, UNVERIFIED, DAMAGED = "verified", "unverified", "damaged"
#: where a method entry names a file in the job store: (section, key) -> a path whose first part
#: is the job's folder
CITED_PATHS = (("train", "checkpoint"), ("train", "model_dir"), ("samples", "path"))
#: a job's result file, which holds the sha256 of every artifact of the job (dihal_bench.study.jobs)
JOB_RESULT = "result.json"


@dataclasses.dataclass(frozen=True)
class Integrity:
    """What a record's seal says: ``status`` (VERIFIED, UNVERIFIED: no seal, DAMAGED), why
    (``detail``, a sentence that follows the record's name) and, for an intact record, the
    cited job results that changed since it was sealed (``changed``)."""

    status: str
    detail: str = ""
    changed: tuple[str, ...] = ()


def record_digest(record: dict) -> str:
    """The sha256 a seal records: of the record without its seal, and of the seal without its
    sha256 (so the cited artifacts' digests are covered too)."""
    body = {key: value for key, value in record.items() if key != INTEGRITY}
    seal = record.get(INTEGRITY)
    if isinstance(seal, dict):
        seal = {key: value for key, value in seal.items() if key != "sha256"}
    return json_sha256({"record": body, "integrity": seal})


def cited_jobs(record: dict) -> list[str]:
    """The job folders (relative to the record's job store) that the record's methods cite."""
    jobs: list[str] = []
    for entry in record.get("per_seed") or []:
        methods = entry.get("methods") if isinstance(entry, dict) else None
        for method in (methods or {}).values() if isinstance(methods, dict) else ():
            for section, key in CITED_PATHS:
                value = (method.get(section) or {}).get(key) if isinstance(method, dict) else None
                relative = isinstance(value, str) and value and not Path(value).is_absolute()
                job = Path(value).parts[0] if relative else None
                if job and job not in (".", "..") and job not in jobs:
                    jobs.append(job)
    return jobs


def seal_record(record: dict, store_root: Path | None = None, *, artifacts: dict[str, str] | None = None) -> dict:
    """``record`` with its seal: the sha256 of each cited job's result.json found in
    ``store_root`` (each of which holds the sha256 of that job's artifacts), or the given
    ``artifacts`` digests, and the digest of the whole (:func:`record_digest`). A seal already
    there is replaced."""
    normalised = json.loads(json.dumps(record, default=jsonable))  # what the file will read back as
    normalised.pop(INTEGRITY, None)
    artifacts = dict(artifacts or {})
    if store_root is not None and not artifacts:
        for job in cited_jobs(normalised):
            result = Path(store_root) / job / JOB_RESULT
            if result.is_file():
                artifacts[f"{job}/{JOB_RESULT}"] = file_sha256(result)
    normalised[INTEGRITY] = {"algorithm": DIGEST_ALGORITHM, "artifacts": artifacts}
    normalised[INTEGRITY]["sha256"] = record_digest(normalised)
    return normalised


def write_record(path: Path, record: dict, store_root: Path | None = None, *,
                 artifacts: dict[str, str] | None = None) -> None:
    """Write a run record sealed (:func:`seal_record`), atomically: what the runner's record
    and every edit through dihal-bench (lm-eval results) are written with."""
    write_json_atomic(Path(path), seal_record(record, store_root, artifacts=artifacts))


def record_integrity(record: dict, store_root: Path | None = None) -> Integrity:
    """Whether ``record`` (as read from its file, before any migration) matches its seal.

    A record without a seal was written before records were sealed: UNVERIFIED (read, and said
    to be unverified). A seal that is malformed or does not match: DAMAGED. With ``store_root``,
    the cited job results found there are compared with the seal's digests; a changed one does
    not make the record's numbers wrong, so it is reported in ``changed``, not as damage."""
    if INTEGRITY not in record:
        return Integrity(UNVERIFIED, "has no seal (written before run records carried one): its numbers "
                                     "cannot be verified")
    seal = record[INTEGRITY]
    if not (isinstance(seal, dict) and seal.get("algorithm") == DIGEST_ALGORITHM
            and isinstance(seal.get("sha256"), str) and isinstance(seal.get("artifacts"), dict)):
        return Integrity(DAMAGED, f"has a malformed seal (expected {{algorithm: {DIGEST_ALGORITHM!r}, "
                                  f"artifacts, sha256}}): edited or damaged")
    if record_digest(record) != seal["sha256"]:
        return Integrity(DAMAGED, "does not match the sha256 in its seal: edited or damaged since it was written")
    changed = []
    if store_root is not None:
        for name, digest in seal["artifacts"].items():
            path = Path(store_root) / name
            if not Path(name).is_absolute() and path.is_file() and file_sha256(path) != digest:
                changed.append(name)
    return Integrity(VERIFIED, changed=tuple(changed))


_SLUG_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._")
#: The most characters one name contributes to a folder name: a group's three names, the
#: separators and a digest stay well under the 255 bytes a file system allows one name.
SLUG_MAX_CHARACTERS = 64


def slug(name: str) -> str:
    """``name`` as a safe piece of one file or folder name: ASCII letters, digits, ``-``,
    ``.`` and ``_`` are kept and any other character (``/``, ``\\``, NUL, spaces, other
    scripts) becomes ``_``, as does a leading ``.`` or ``-`` (no ``..``, hidden or
    option-like names); at most SLUG_MAX_CHARACTERS characters. Lossy: the leaderboard's
    folders keep names that slug alike apart."""
    kept = "".join(c if c in _SLUG_CHARACTERS else "_" for c in name)[:SLUG_MAX_CHARACTERS]
    if kept[:1] in (".", "-"):
        kept = "_" + kept[1:]
    return kept or "_"


def new_record_path(folder: Path, stem: str) -> Path:
    """A record name no other run has taken: the time to the second, then -2, -3, ... if two runs
    finish within one second (claimed with O_EXCL, so two processes never pick the same name)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        path = folder / f"{stem}-{stamp}{'' if attempt == 1 else f'-{attempt}'}.json"
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return path
        except FileExistsError:
            continue
    raise DihalError(f"cannot find a free record name for {stem} in {folder}")
