"""Resumable units of work, named by a content hash of their inputs.

A job is a kind and a JSON-able spec. Its folder ``<root>/<kind>-<hash>/`` holds
``spec.json``, any artifacts the job writes (checkpoints, samples) and, once the job has
finished, ``result.json`` (written atomically, last). A run that is killed at any point
and started again finds every finished job's result and redoes only the rest; a job cut
short mid-training resumes from its own checkpoint.

``result.json`` also records a sha256 of the result and of every other file in the folder (and,
outside the check, the seconds the work took, the git revision of the code that did it and the
machine it ran on, its CPU model and host digest: provenance, not a result).
A finished job is reused only when all of them still match: a damaged result or artifact
(a flipped bit, a truncated file, a hand edit) makes the job run again, with a warning, so
that wrong numbers never flow into later jobs. The job's work finds its folder as it was,
so a training job whose own checkpoint is intact resumes from it instead of starting over.

One run at a time may use a store: `JobStore.lock`. Within that run, several processes may do
its jobs at once (``dihal-bench run --executor ray``): each job is done under its own lock, so
that two of them asked for the same job (ℓ* that is also the oracle layer) do it once.

A store can be pruned of its large artifacts (`dihal_bench.study.pruning`, `dihal_bench.study.pruned`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dihal_bench.base.files import (
    file_sha256,
    is_temporary,
    json_sha256,
    result_file_mode,
    warn,
    write_json_atomic,
)
from dihal_bench.base.provenance import machine as this_machine
from dihal_bench.base.provenance import process_revision
from dihal_bench.errors import DihalError
from dihal_bench.study.job_clock import carried, job_done, job_reused
from dihal_bench.study.pruned import PRUNED, REMADE, RESULT, missing_under, pruned_files, remade_as, remake

LOCK = ".lock"
#: in a job's folder: held by the process doing the job, not an artifact
JOB_LOCK = ".job.lock"


#: part of every job's key: raised when what jobs compute changes while their specs stay the same
#: (a new training or evaluation protocol), so that a store never hands back results of the old code.
#: 2: the bridge's exact position 0 and start token, compact-vocabulary baselines, honest metrics.
JOB_FORMAT = 2

def spec_hash(kind: str, spec: dict) -> str:
    canonical = json.dumps({"kind": kind, "format": JOB_FORMAT, "spec": spec}, sort_keys=True,
                           separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass
class JobStore:
    root: Path
    #: put back a remade pruned artifact whose sha256 differs from the recorded one (another machine's
    #: rounding), listed in its job's remade.json, instead of stopping (dihal_bench.study.pruned)
    inexact_remakes: bool = False
    #: pruned job folder -> its work, for each pruned job this process reused: what `resolve` runs
    #: again to make a pruned artifact that a later job asks for
    _remakers: dict[Path, Callable[[Path], dict]] = field(default_factory=dict, repr=False, compare=False)

    def folder(self, kind: str, spec: dict) -> Path:
        return Path(self.root) / f"{kind}-{spec_hash(kind, spec)}"

    def run(self, kind: str, spec: dict, work: Callable[[Path], dict]) -> dict:
        """The stored result of (kind, spec), or ``work(folder)``'s result, stored first."""
        folder = self.folder(kind, spec)
        result = self._stored_result(folder, work)
        if result is not None:
            return result
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with _held(folder / JOB_LOCK):
                result = self._stored_result(folder, work)  # another process did the job while this one waited
                if result is not None:
                    return result
                write_json_atomic(folder / "spec.json", {"kind": kind, "spec": spec})
                revision = process_revision()  # the code that does the job: this process's, read before it starts
                # an interrupted attempt's training up to its checkpoint counts; remakes of pruned jobs do not
                carried_before, started = carried(), time.perf_counter()
                result = work(folder)
                seconds = time.perf_counter() - started + carried() - carried_before
                _uniform_modes(folder)
                # the machine beside the seconds: a store carried between machines mixes their speeds
                machine = this_machine()
                write_json_atomic(folder / RESULT, {"kind": kind, "spec": spec, "result": result, "seconds": seconds,
                                                    "revision": revision, "machine": machine,
                                                    "sha256": {"result": json_sha256(result),
                                                               "files": _artifact_hashes(folder)}})
        except (FileNotFoundError, DihalError) as exc:  # did another process delete the store, or a job in it?
            error = self.vanished(exc, folder)
            if error is None:
                raise
            raise error from None
        job_done(str(folder), revision, seconds, machine)
        return result

    def vanished(self, exc: FileNotFoundError | DihalError, folder: Path) -> DihalError | None:
        """The one-line error for a job whose input in the store vanished while it ran (another
        process deleted the store or a job in it); any other error is left as it is.

        A job whose own folder is gone failed because the store was deleted under it, whatever
        the error its work raised (a checkpoint "not trained yet", a file "not readable")."""
        if not folder.is_dir():
            missing = str(folder)
        elif isinstance(exc, DihalError):
            return None
        else:
            # safetensors names the file in its message only, quoted by some releases
            missing = exc.filename or str(exc).rpartition(": ")[2].strip("'\"")
            root = Path(self.root).resolve()
            if not (missing and Path(missing).resolve().is_relative_to(root)):
                return None
        return DihalError(f"{missing} vanished from the job store while job {folder.name} ran (was the store "
                          "deleted or changed by another process?); run the same command again: the jobs "
                          "still in the store are kept, the rest redone")

    def relative(self, path: Path) -> str:
        """A path inside the store as results record it: relative, so a store can be moved."""
        return str(Path(path).relative_to(self.root))

    def _stored_result(self, folder: Path, work: Callable[[Path], dict]) -> dict | None:
        """`_reused`'s result, with the work of a pruned job kept for `resolve`."""
        result = _reused(folder)
        if result is not None and (folder / PRUNED).exists():
            self._remakers[folder] = work
        return result

    def resolve(self, relative: str) -> Path:
        """The path of an artifact a job result names, made again first where the store was pruned of it."""
        path = Path(self.root) / relative
        folder = Path(self.root) / Path(relative).parts[0]
        if missing_under(folder, path.relative_to(folder)):
            if folder not in self._remakers:
                raise DihalError(f"job {folder} was pruned of its large artifacts ({PRUNED}) and this process has "
                                 "not reused it, so cannot make them again; run with --executor local")
            with _held(folder / JOB_LOCK):
                remake(folder, self._remakers[folder], Path(self.root), self.inexact_remakes)
                _uniform_modes(folder)
        return path

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold the store for one run; DihalError at once when another process holds it.

        An advisory ``flock`` on ``<root>/.lock``: the kernel drops it when the holder exits
        in any way, kill -9 included, so a dead run never leaves the store locked. The
        holder's pid is written into the file only for the message another run shows.
        """
        path = Path(self.root) / LOCK
        path.parent.mkdir(parents=True, exist_ok=True)
        # "a+": neither truncate nor replace the file before holding it; the file itself is
        # never deleted, since a process that opened the old one would then lock another inode
        with path.open("a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.seek(0)
                holder = handle.read().strip() or "unknown"
                raise DihalError(f"job store {self.root} is in use by another dihal-bench run (pid {holder}); "
                                 f"wait for it or use another --out") from None
            try:
                handle.seek(0)
                handle.truncate()
                handle.write(f"{os.getpid()}\n")
                handle.flush()
                yield
            finally:
                handle.truncate(0)  # no pid of a finished run for the next one to blame
                fcntl.flock(handle, fcntl.LOCK_UN)


def _reused(folder: Path) -> dict | None:
    """The result of the finished job in ``folder`` when it is intact, its stored seconds counted in
    this process's reused time (once: `job_clock`); else None, with a warning and its result.json
    removed when it is damaged."""
    done = folder / RESULT
    if not done.exists():
        return None
    stored, problem = verified_result(folder)
    if problem is None:
        job_reused(str(folder), stored.get("seconds"), stored.get("revision"), stored.get("machine"))
        return stored["result"]
    warn(f"{problem}; redoing job {folder}")
    done.unlink(missing_ok=True)
    return None


@contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``, waiting for it: the kernel drops it when its holder
    dies in any way, so a worker killed mid-job hands the job to the next one asking."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _uniform_modes(folder: Path) -> None:
    """Give every artifact a job's work wrote the mode of every other output (0666 minus the
    umask): a job may write with a library's own writer (safetensors' ``save_file`` makes 0600
    files), and a store's files are read by whoever reads its results."""
    mode = result_file_mode()
    for path in folder.rglob("*"):
        if (path.is_file() and not path.is_symlink() and path.name != JOB_LOCK and not is_temporary(path)
                and path.stat().st_mode & 0o777 != mode):
            os.chmod(path, mode)


def _artifact_hashes(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` but result.json, the job's lock, the store's notes on pruning
    and remaking, and the temporary files of writes a kill cut short, by path relative to ``folder``."""
    return {path.relative_to(folder).as_posix(): file_sha256(path)
            for path in sorted(folder.rglob("*"))
            if path.is_file() and path not in (folder / RESULT, folder / JOB_LOCK, folder / PRUNED, folder / REMADE)
            and not is_temporary(path)}


def verified_result(folder: Path) -> tuple[dict | None, str | None]:
    """(result.json's content, None) when it and every artifact it lists are intact, else
    (None, what is wrong, naming the file)."""
    done = folder / RESULT
    try:
        stored = json.loads(done.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{done} is not readable JSON ({exc})"
    try:
        result, hashes = stored["result"], stored["sha256"]
        expected_result, files = hashes["result"], hashes["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (KeyError, TypeError):
        return None, f"{done} has no integrity record (damaged, or written by an older dihal-bench)"
    if json_sha256(result) != expected_result:
        return None, f"{done} does not match its recorded sha256 (edited or damaged)"
    pruned = pruned_files(folder)
    for name, digest in files.items():
        path = folder / name
        # remade.json changes with each remake; a result written before it was left out of the hashes lists it
        if name == REMADE or (pruned.get(name) == digest and not path.exists()):
            continue
        try:
            if (actual := file_sha256(path)) != digest and actual != remade_as(folder, name, digest):
                return None, f"{path} does not match the sha256 recorded in {done} (edited or damaged)"
        except OSError as exc:
            return None, f"{path}, recorded in {done}, cannot be read ({exc.strerror or exc})"
    return stored, None
