"""Files written so that a crash never leaves a half-written one behind, and read back so that
a damaged one is never trusted.

Every write goes to a uniquely named temporary file in the target's folder (two processes
writing the same target never share one), is flushed to disk, gets the mode a plain
``open(path, "w")`` would give a new file under the user's umask, and is renamed over the
target in one step.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dihal_bench.errors import DihalError

#: how the temporary files of atomic writes end
TEMPORARY_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process's umask. Linux reports it in /proc; elsewhere it can only be read by setting
    it, which for an instant gives files created by other threads a wide-open mode."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to (by any writer that takes a path).

    When the block ends normally the file is synced to disk, given mode 0666 minus the
    umask and renamed over ``path``; when it raises, the temporary file is removed and
    ``path`` is untouched.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary name is the target's plus a few characters: a target whose name is near
        # the 255-byte limit gets a shortened prefix (the suffix keeps it recognisable)
        short = path.name.encode("utf-8")[:200].decode("utf-8", errors="ignore")
        fd, name = tempfile.mkstemp(prefix=f".{short}.", suffix=TEMPORARY_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise write_failure(path, exc) from None
    os.close(fd)
    temporary = Path(name)
    try:
        yield temporary
        with temporary.open("rb") as written:
            os.fsync(written.fileno())
        # mkstemp creates 0600: right for a file being written, wrong for a result others read
        os.chmod(temporary, result_file_mode())
        os.replace(temporary, path)
    except BaseException as exc:
        temporary.unlink(missing_ok=True)
        refused = _refused_write(exc)
        if refused is not None:
            raise write_failure(path, refused) from None
        raise
    _sync_folder(path.parent)


#: errno of a write the machine refused (not a bug): what the user is told to do about each
WRITE_FAULTS = {
    errno.ENOSPC: "free space on that disk (or write elsewhere), then run the same command again",
    errno.EDQUOT: "free space within your disk quota (or write elsewhere), then run the same command again",
    errno.EROFS: "the file system is mounted read-only: write elsewhere, or remount it read-write",
    errno.EACCES: "you may not write there: write elsewhere, or change the folder's permissions",
    errno.EPERM: "you may not write there: write elsewhere, or change the folder's permissions",
    errno.ENAMETOOLONG: "the file system does not take a name this long: use a shorter path",
    errno.ENOTDIR: "a file stands where a folder is needed: move it, or write elsewhere",
    errno.EIO: "the disk reported an I/O error: check it, then run the same command again",
}


#: how a writer written in Rust (safetensors) reports the operating system's error: its Display
#: form "(os error 28)" in newer releases, its Debug form "Os { code: 28, ... }" in older ones
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def _refused_write(exc: BaseException) -> OSError | None:
    """The OSError of a write the file system refused (`WRITE_FAULTS`), whether Python raised it
    or a library writing the file itself reported it in its own exception; else None."""
    if isinstance(exc, OSError):
        return exc if exc.errno in WRITE_FAULTS else None
    found = _RUST_OS_ERROR.search(str(exc)) if isinstance(exc, Exception) else None
    code = int(found.group(1) or found.group(2)) if found else None
    if code in WRITE_FAULTS:
        return OSError(code, os.strerror(code))
    return None


def write_failure(path: Path, exc: OSError) -> DihalError:
    """The one-line error for a write of ``path`` that the file system refused (a full disk, a
    read-only mount): what happened and what to do. The target is untouched (the write was to a
    temporary file, now removed); any other OSError is left to propagate as a bug."""
    advice = WRITE_FAULTS.get(exc.errno, "check the folder, then run the same command again")
    return DihalError(f"cannot write {path}: {exc.strerror or exc}; {advice}")


def is_temporary(path: Path) -> bool:
    """Whether ``path`` is an `atomic_path` temporary file (one a kill left behind, if no
    write is under way)."""
    return path.name.startswith(".") and path.name.endswith(TEMPORARY_SUFFIX)


def remove_temporaries(folder: Path) -> list[Path]:
    """Remove the `atomic_path` temporary files directly in ``folder`` and its subfolders: what
    writes cut short by a kill left behind. Only safe while no write into ``folder`` is under
    way (its writer holds the folder's lock). Returns the removed paths."""
    removed = []
    for path in sorted(Path(folder).rglob(f".*{TEMPORARY_SUFFIX}")) if Path(folder).is_dir() else []:
        if is_temporary(path) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (the folder's entry), where the platform allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)


def write_text_atomic(path: Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def write_safetensors_atomic(path: Path, tensors: dict, metadata: dict[str, str] | None = None) -> None:
    """``tensors`` as a safetensors file, written like every other output (atomically, mode 0666
    minus the umask): safetensors' own ``save_file`` creates its files 0600."""
    import safetensors.torch

    write_bytes_atomic(path, safetensors.torch.save(tensors, metadata=metadata))


def result_file_mode() -> int:
    """The mode every output file gets: what ``open(path, "w")`` gives a new file."""
    return 0o666 & ~current_umask()


def write_json_atomic(path: Path, payload) -> None:
    write_text_atomic(path, json.dumps(payload, indent=2, sort_keys=False, default=jsonable) + "\n")


def jsonable(obj):
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# -- checksums ----------------------------------------------------------------------------


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def json_sha256(payload) -> str:
    """sha256 of ``payload`` as it reads back from JSON: key order, tuples vs lists and int vs
    str keys do not change it, any changed value does (floats print exactly in JSON)."""
    normalised = json.loads(json.dumps(payload, default=jsonable))
    canonical = json.dumps(normalised, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def read_safetensors(path: Path, sha256: str | None = None, recorded_in: Path | None = None) -> dict:
    """The tensors in the safetensors file ``path``, checked against ``sha256`` when given
    (as recorded in ``recorded_in``). DihalError naming the file when it is damaged:
    truncated, not safetensors, or other bytes than were written."""
    import safetensors.torch

    path = Path(path)
    try:
        if sha256 is not None and file_sha256(path) != sha256:
            raise DihalError(f"{path} does not match the sha256 recorded in {recorded_in or 'its description'}: "
                             f"the file is damaged; train it again")
        return safetensors.torch.load_file(path)
    except OSError as exc:
        raise DihalError(f"cannot read {path}: {exc.strerror or exc}") from None
    except safetensors.SafetensorError as exc:
        raise DihalError(f"{path} is not a readable safetensors file ({exc}): the file is damaged or "
                         f"truncated; train it again") from None


def warn(message: str) -> None:
    """One line on stderr that does not tear a progress bar apart."""
    from tqdm.auto import tqdm

    tqdm.write(f"Warning: {message}", file=sys.stderr)
