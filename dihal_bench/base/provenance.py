"""Where a number came from: versions, git revision and hardware, recorded with every result."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
import socket
import subprocess
from pathlib import Path

import torch

import dihal_bench


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_revision() -> str | None:
    """The commit of the dihal-bench checkout, with ``+dirty`` if it has local changes."""
    source = Path(dihal_bench.__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def process_revision() -> str | None:
    """:func:`git_revision` as read the first time this process asks (a run asks at its start):
    the code a process runs is what it imported then, whatever is checked out later, so every job
    it does is credited to that revision (dihal_bench.study.jobs)."""
    return git_revision()


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The processor's model name: /proc/cpuinfo's first ``model name`` (Linux on x86; on ARM
    Linux the field is often absent), else :func:`platform.processor` (macOS, Windows), else None."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def memory_bytes() -> int | None:
    """The machine's physical memory in bytes (POSIX sysconf), None where it cannot be read."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


#: hex digits of the host name's sha256 a record keeps: enough to tell a few machines apart,
#: too few to be worth reversing, and the name itself is never written
HOST_DIGITS = 12


def host_id() -> str | None:
    """A short sha256 prefix of this machine's host name: which records ran on the same machine,
    without recording the name."""
    name = socket.gethostname()
    return hashlib.sha256(name.encode("utf-8")).hexdigest()[:HOST_DIGITS] if name else None


#: characters of the kernel's boot id a record keeps
BOOT_DIGITS = 12


def boot_id(path: Path = Path("/proc/sys/kernel/random/boot_id")) -> str | None:
    """The start of the kernel's boot id (random, made anew at each boot; Linux only, else None):
    a machine lent for one sitting keeps its host name from one lease to the next (issue 36: one
    name, rates 1.5-2x apart on two leases), so the host name alone cannot say whether two jobs
    were done on one machine, and its boot can."""
    try:
        value = path.read_text(encoding="ascii").strip().replace("-", "")
    except (OSError, UnicodeDecodeError):
        return None
    return value[:BOOT_DIGITS] or None


def machine() -> dict:
    """Which machine does a job: CPU model, host name digest (:func:`host_id`) and boot (:func:`boot_id`)."""
    return {"cpu": cpu_model(), "host_sha256": host_id(), "boot": boot_id()}


def same_machine(one: dict, other: dict) -> bool:
    """Whether two :func:`machine` entries name one machine: the same host and, where both name
    their boot (entries from before it was kept do not), the same boot."""
    boots = one.get("boot"), other.get("boot")
    return one.get("host_sha256") == other.get("host_sha256") and (None in boots or boots[0] == boots[1])


def environment() -> dict:
    """Versions, the revision (:func:`process_revision`) and the hardware: CPU model, core count,
    physical memory, torch's threads, the first CUDA device's name and how many there are, and
    the host only as a sha256 prefix (:func:`host_id`)."""
    cuda = torch.cuda.is_available()
    return {
        "dihal_bench": dihal_bench.__version__,
        "git_revision": process_revision(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "numpy": _version("numpy"),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_bytes": memory_bytes(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if cuda else None,
        "cuda_devices": torch.cuda.device_count() if cuda else 0,
        "host_sha256": host_id(),
        "boot": boot_id(),
    }
