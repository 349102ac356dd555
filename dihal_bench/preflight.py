"""Checks that run before any work: every name a suite or command uses is registered (or is a
reference a plugin handles), every device can be used, and every output folder can be written.

A study that fails on its evaluator's name after an hour of training, or on a read-only results
folder after all the work is done, wastes the user's time; so ``dihal-bench run`` and every
single-stage command call these first and stop with one ``Error:`` line.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from dihal_bench.errors import DihalError
from dihal_bench.suite_config import SuiteConfig


def check_device(device: str, key: str = "device", *, here: bool = True) -> None:
    """``device`` is a string torch parses naming a supported device type, and (``here``) one
    this machine has."""
    import torch

    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DihalError(f"{key} {device!r} is not a torch device ({str(exc).splitlines()[0]}); "
                         "use cpu, cuda, cuda:N or mps") from None
    if parsed.type not in ("cpu", "cuda", "mps"):
        raise DihalError(f"{key} {device!r}: unsupported device type {parsed.type!r}; use cpu, cuda or mps")
    if not here:
        return
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise DihalError(f"{key} {device!r}: CUDA is not available on this machine")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise DihalError(f"{key} {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        raise DihalError(f"{key} {device!r}: MPS is not available on this machine")


def check_dtype(dtype: str, key: str = "dtype") -> None:
    from dihal_bench.suite import DTYPES

    if dtype not in DTYPES:
        raise DihalError(f"{key} {dtype!r} is not one of {', '.join(DTYPES)}")


def check_writable(folder: Path, what: str) -> None:
    """Prove a file can be written in ``folder``, leaving nothing behind: the folders this check
    creates (and its probe file) are removed again, so a refused command writes nothing."""
    folder = Path(folder)
    missing = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".dihal-write-check-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise DihalError(f"cannot write to the {what} {str(folder)!r}: {exc.strerror or exc}") from None
    finally:
        for created in missing:  # deepest first
            try:
                created.rmdir()
            except OSError:
                break


def check_backbone_name(name: str, key: str = "backbone") -> None:
    from dihal_bench.backbone import backbone_factory

    _named(backbone_factory, name, key, "backbone")


def check_corpus_name(spec: str, key: str = "corpus") -> None:
    from dihal_bench.corpus import corpus_factory

    _named(corpus_factory, spec, key, "corpus")


def _named(resolve, name: str, key: str, kind: str) -> None:
    """``resolve(name)``, its error prefixed with the setting's key where the message alone
    would not say which setting it is about (an evaluator is a backbone too)."""
    try:
        resolve(name)
    except DihalError as exc:
        if key in (kind, f"--{kind}"):
            raise
        raise DihalError(f"{key}: {exc}") from None


def check_registered(kind: str, names, key: str) -> None:
    from dihal_bench.plugins import get_registry

    registry = get_registry()
    for name in names:
        try:
            registry.get(kind, name)
        except DihalError as exc:
            raise DihalError(f"{key}: {exc}") from None


def check_suite(config: SuiteConfig, *, folders: dict[str, Path] | None = None, here: bool = True) -> None:
    """Everything about a resolved suite (see :func:`dihal_bench.suite.check_values` for its values)
    that can be known without loading a model; ``folders`` maps a description to a folder that
    must be writable (the job store, the results folder). ``here=False`` (a dry-run planning for
    another machine) does not ask whether this machine has the suite's device."""
    check_backbone_name(config.backbone, "backbone")
    check_backbone_name(config.evaluator, "evaluator")
    check_corpus_name(config.corpus)
    check_device(config.device, here=here)
    check_dtype(config.dtype)
    check_registered("proxy", config.locate.proxies, "locate.proxies")
    check_registered("bridge", [config.bridge.name], "bridge.name")
    check_registered("baseline", config.methods.baselines, "methods.baselines")
    check_registered("metric", config.metrics.names, "metrics.names")
    for what, folder in (folders or {}).items():
        check_writable(folder, what)
