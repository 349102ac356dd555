"""A job store made small: each finished job's large tensors (checkpoints, stored hidden states)
taken out, their sha256 kept in the job's ``pruned.json`` (`dihal_bench.study.jobs`).

What stays is every job's result and its small artifacts (samples, metrics): enough for the run that
made the store to be run again and find every job done, for a record's cited results to be checked,
and for a study longer than one machine's sitting to go on elsewhere. A later job that needs a pruned
artifact has its producer's work done again, and the artifact must come out bit for bit the same.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.study.jobs import RESULT, JobStore, verified_result
from dihal_bench.study.pruned import PRUNED, pruned_files

#: what `prune` takes out: tensors (weights, optimizer states, hidden states), which a job's work makes
#: again bit for bit; never a JSON file, which may hold a wall time (a checkpoint's trainer.json does)
TENSORS = ".safetensors"
#: the smallest artifact `prune` takes out by default: every checkpoint and stored hidden state of the
#: embedded suites is larger (a 2.6M-parameter model is ~10 MB), every sample file smaller
DEFAULT_MIN_BYTES = 2**20
#: a job's folder (``<kind>-<16 hex digits>``, `JobStore.folder`), or what a remake left behind
JOB_FOLDER = re.compile(r"^(\.remake-)?[a-z0-9-]+-[0-9a-f]{16}(-\w+)?$")


@dataclass
class Pruned:
    jobs: int = 0  # finished jobs pruned of at least one artifact
    files: int = 0
    bytes: int = 0
    unfinished: int = 0  # job folders with no result, removed whole
    damaged: int = 0  # finished jobs left as they are (a run redoes them)


def prune(root: Path, min_bytes: int = DEFAULT_MIN_BYTES, keep: frozenset[str] = frozenset()) -> Pruned:
    """Take every safetensors artifact of ``min_bytes`` or more out of each finished, intact job under ``root``
    but what ``keep`` names (weights too dear to make again: a job's folder name, to keep it whole, or
    ``FOLDER/PATH``, to keep what is at or under PATH in it, e.g. a trained model without its
    optimizer state), and remove the folders of jobs that never finished (a partial checkpoint that a
    run would resume; it is started afresh instead). Holds the store's lock: no run may use it meanwhile."""
    kept = kept_paths(Path(root), keep)
    folders = sorted(path for path in Path(root).iterdir() if path.is_dir())
    strangers = [path.name for path in folders if not JOB_FOLDER.match(path.name)]
    if strangers:  # removing "unfinished jobs" of a folder that is no store would delete what it holds
        raise DihalError(f"{root} is not a job store (--out/<suite>/jobs): {strangers[0]} is not a job folder")
    done = Pruned()
    with JobStore(root).lock():
        for folder in folders:
            if not (folder / RESULT).exists():
                shutil.rmtree(folder)
                done.unfinished += 1
                continue
            inside = kept.get(folder.name, [])
            if Path() in inside:
                continue
            stored, problem = verified_result(folder)
            if problem is not None:
                done.damaged += 1
                continue
            pruned = pruned_files(folder)
            large = {name: digest for name, digest in stored["sha256"]["files"].items()
                     if name.endswith(TENSORS) and (folder / name).is_file()
                     and (folder / name).stat().st_size >= min_bytes
                     and not any(Path(name).is_relative_to(path) for path in inside)}
            if not large:
                continue
            # the list first: a kill between the two leaves files listed as pruned that are still there
            write_json_atomic(folder / PRUNED, {"files": {**pruned, **large}})
            for name in large:
                done.bytes += (folder / name).stat().st_size
                (folder / name).unlink()
            done.jobs += 1
            done.files += len(large)
    return done


def kept_paths(root: Path, keep: frozenset[str]) -> dict[str, list[Path]]:
    """``keep``'s names as job folder -> the paths in it to keep (``Path()``: all of it); DihalError for a
    name whose job has not finished in ``root`` or whose path is not there."""
    kept: dict[str, list[Path]] = {}
    for name in sorted(keep):
        folder, _, inside = name.partition("/")
        if not (root / folder / RESULT).exists():
            raise DihalError(f"no finished job {folder} in {root} to keep")
        if inside and not (root / folder / inside).exists():
            raise DihalError(f"no {inside} in job {folder} of {root} to keep")
        kept.setdefault(folder, []).append(Path(inside))
    return kept
