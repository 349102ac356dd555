"""One writer at a time for a folder: an advisory ``flock`` on the folder itself.

The job store holds its runs apart the same way (``dihal_bench.study.jobs.JobStore.lock``): a
kernel lock, dropped when its holder exits in any way, kill -9 included, so a dead writer never
leaves a stale lock to clear by hand. Locking the folder's own descriptor (Linux and the BSDs
allow ``flock`` on a directory) leaves no lock file in a folder that is committed to git.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dihal_bench.errors import DihalError


@contextmanager
def folder_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder`` (created if missing, and removed again if the holder wrote nothing into
    it) for one writer; DihalError at once, naming ``what`` the folder is, when another process
    holds it."""
    folder = Path(folder)
    created = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        _remove_empty(created)
        raise DihalError(f"cannot open the {what} {str(folder)!r}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DihalError(f"the {what} {str(folder)!r} is being written by another dihal-bench process; "
                             "wait for it to finish, then run the same command again") from None
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
        _remove_empty(created)  # a holder refused or failed before writing leaves no folder behind


def _remove_empty(folders: list[Path]) -> None:
    """Remove ``folders`` (deepest first) while they are empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break
