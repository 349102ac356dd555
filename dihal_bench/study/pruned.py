"""Pruned artifacts of a job: listed in the job's ``pruned.json`` when `dihal_bench.study.pruning` took
them out, and made again by the job's own work when a later job asks for one (docs/method.md#pruned-job-stores).

A pruned job's result is reused as it is. Its work is done again aside, in a scratch folder, so that
what the job kept is not touched, and each file it makes must have the sha256 recorded when the job
was first done (same seed, same numbers): other weights than the ones the stored samples came from
would put two models in one row.

That holds on the machine that first did the job. Another machine of the same kind can round a float
differently (hidden states after one transformer layer were seen to differ, the embeddings not; likely
the matmul kernels chosen by the CPU's instruction set), so a remake there is refused unless the run
accepts inexact remakes (``dihal-bench run --accept-inexact-remakes``); each file so accepted is listed in
the job's ``remade.json`` with both digests and the machine, so the record audits back to it, and
beside them each number of the job's result that came out otherwise (a trained row's final loss, a
bridge's held-out error): how far the remade weights are from the first, which the digests cannot say.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dihal_bench.base.files import atomic_path, file_sha256
from dihal_bench.base.provenance import cpu_model
from dihal_bench.errors import DihalError

#: in a pruned job's folder: the artifacts taken out of it, path (relative to the folder) -> sha256
PRUNED = "pruned.json"
#: in a remade job's folder: the files put back although their sha256 differs from the recorded one
REMADE = "remade.json"
#: a finished job's record, written last (dihal_bench.study.jobs, which imports this module, names it so)
RESULT = "result.json"
#: the start of the name of the scratch folder a remake works in, beside the job's folder
SCRATCH_PREFIX = ".remake-"

#: the seconds this process has spent in `remake` (a running sum): a job store takes them out of the
#: time of the job that asked for the artifact, since the remade job's own time was counted when it was done
_remade_seconds = 0.0


def remade_seconds() -> float:
    """The seconds this process has spent making pruned artifacts again so far."""
    return _remade_seconds


def pruned_files(folder: Path) -> dict[str, str]:
    """The artifacts a pruned job's folder was pruned of (path -> sha256); {} for a job not pruned,
    or whose list is unreadable (its missing artifacts then make it damaged, so redone)."""
    try:
        files = json.loads((folder / PRUNED).read_text(encoding="utf-8"))["files"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return {}
    return files if isinstance(files, dict) else {}


def missing_under(folder: Path, inside: Path) -> bool:
    """Whether a pruned artifact of ``folder`` at or under ``inside`` (relative to it) is absent."""
    return any(Path(name).is_relative_to(inside) and not (folder / name).exists() for name in pruned_files(folder))


def remade_as(folder: Path, name: str, recorded: str) -> str | None:
    """The sha256 that ``name`` in ``folder`` was accepted with by an inexact remake of the file
    recorded as ``recorded`` (``remade.json``), else None: such a file is intact as remade."""
    try:
        entry = json.loads((folder / REMADE).read_text(encoding="utf-8"))["files"][name]
        return entry["remade"] if entry["recorded"] == recorded else None
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def remake(folder: Path, work: Callable[[Path], dict], scratch_in: Path, inexact: bool = False) -> None:
    """Do the job's ``work`` again in a scratch folder under ``scratch_in`` and put back each pruned
    artifact of ``folder`` that is absent, once it matches its recorded sha256 (DihalError naming the
    first that does not; with ``inexact``, put back anyway and listed in ``remade.json``); then the
    folder is no longer pruned."""
    global _remade_seconds
    started = time.perf_counter()
    absent = {name: digest for name, digest in pruned_files(folder).items() if not (folder / name).exists()}
    if absent:
        # a remake killed outright (SIGKILL, a lost machine) leaves its scratch folder, GBs for stored hidden
        # states; the caller holds the job's lock, so no other remake of this job can be using one
        for stale in scratch_in.glob(f"{SCRATCH_PREFIX}{folder.name}-*"):
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{folder.name}-", dir=scratch_in))
        inexact_files = {}
        try:
            remade_result = work(scratch)
            for name, digest in absent.items():
                made = scratch / name
                if not made.is_file():
                    raise DihalError(f"{folder / name}, pruned, was not made again by its job's work")
                remade = file_sha256(made)
                if remade != digest:
                    if not inexact:
                        raise DihalError(f"{folder / name}, made again for a pruned job, does not match the sha256 "
                                         "recorded when the job was first done: the job is not reproducible here "
                                         "(--accept-inexact-remakes takes it, listed in the job's remade.json; or "
                                         "delete its folder to redo it and the jobs after it)")
                    inexact_files[name] = {"recorded": digest, "remade": remade}
            put_back = list(absent)
            if inexact_files:
                recorded = json.loads((folder / RESULT).read_text(encoding="utf-8"))
                # the remade job's files replace the first job's wherever they differ: a small file can
                # describe a large one (bridge.json holds its weights' sha256), so a job keeps one make's files
                for name, digest in recorded["sha256"]["files"].items():
                    if name in absent or not (scratch / name).is_file():
                        continue
                    if (remade := file_sha256(scratch / name)) != digest:
                        inexact_files[name] = {"recorded": digest, "remade": remade}
                        put_back.append(name)
            for name in put_back:
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(scratch / name, folder / name)
            if inexact_files:
                _list_inexact(folder, inexact_files, differing_numbers(recorded["result"], remade_result))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            _remade_seconds += time.perf_counter() - started
    (folder / PRUNED).unlink(missing_ok=True)


def differing_numbers(recorded: dict, remade: dict) -> dict[str, dict[str, float]]:
    """Each number at the top of a job's result that the remake gave otherwise, with both values;
    wall times (keys ending in ``seconds``) left out, since they differ on every make."""
    def number(value: object) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return {key: {"recorded": value, "remade": remade[key]} for key, value in recorded.items()
            if not key.endswith("seconds") and number(value) and number(remade.get(key)) and remade[key] != value}


def _list_inexact(folder: Path, files: dict[str, dict[str, str]], result: dict[str, dict[str, float]]) -> None:
    path = folder / REMADE
    listed = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    machine = {"cpu": cpu_model(), "machine": platform.machine()}
    listed.setdefault("files", {}).update({name: {**digests, **machine} for name, digests in files.items()})
    listed["result"] = result  # the latest remake's: its files are the ones put back
    with atomic_path(path) as temporary:
        temporary.write_text(json.dumps(listed, indent=2, sort_keys=True), encoding="utf-8")
