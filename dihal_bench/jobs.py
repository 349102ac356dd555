"""Resumable units of work, named by a content hash of their inputs.

A job is a kind and a JSON-able spec. Its folder ``<root>/<kind>-<hash>/`` holds
``spec.json``, any artifacts the job writes (checkpoints, samples) and, once the job has
finished, ``result.json`` (written atomically, last). A run that is killed at any point
and started again finds every finished job's result and redoes only the rest; a job cut
short mid-training resumes from its own checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dihal_bench.records import write_json_atomic

RESULT = "result.json"


def spec_hash(kind: str, spec: dict) -> str:
    canonical = json.dumps({"kind": kind, "spec": spec}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass
class JobStore:
    root: Path

    def folder(self, kind: str, spec: dict) -> Path:
        return Path(self.root) / f"{kind}-{spec_hash(kind, spec)}"

    def run(self, kind: str, spec: dict, work: Callable[[Path], dict]) -> dict:
        """The stored result of (kind, spec), or ``work(folder)``'s result, stored first."""
        folder = self.folder(kind, spec)
        done = folder / RESULT
        if done.exists():
            try:
                return json.loads(done.read_text())["result"]
            except (ValueError, KeyError):
                done.unlink()  # unreadable: redo the job rather than trust it
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / "spec.json", {"kind": kind, "spec": spec})
        result = work(folder)
        write_json_atomic(done, {"kind": kind, "spec": spec, "result": result})
        return result

    def relative(self, path: Path) -> str:
        """A path inside the store as results record it: relative, so a store can be moved."""
        return str(Path(path).relative_to(self.root))

    def resolve(self, relative: str) -> Path:
        return Path(self.root) / relative

    def is_done(self, kind: str, spec: dict) -> bool:
        return (self.folder(kind, spec) / RESULT).exists()
