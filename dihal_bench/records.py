"""Writing results so that a crash never leaves a half-written file behind."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

#: the schema tag of a run record (``results/*.json``)
RECORD_FORMAT = "dihal-bench/run-record/v1"


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: Path, payload) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=_jsonable) + "\n")


def _jsonable(obj):
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
