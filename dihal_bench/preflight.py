"""Checks that run before any work: every name a suite or command uses is registered (or is a
reference a plugin handles), every plugin option is one the plugin takes with a value of its
type, every device can be used, every output folder can be written, the job store is free and a
Ray address answers.

A study that fails on its evaluator's name after an hour of training, or on a read-only results
folder after all the work is done, wastes the user's time; so ``dihal-bench run`` and every
single-stage command call these first and stop with one ``Error:`` line.
"""

from __future__ import annotations

import math
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
    check_options("bridge", config.bridge.name, dict(config.bridge.options), "bridge.options", harness_arguments=1)
    check_registered("baseline", config.methods.baselines, "methods.baselines")
    check_registered("metric", config.metrics.names, "metrics.names")
    for what, folder in (folders or {}).items():
        check_writable(folder, what)


# -- plugin options ---------------------------------------------------------------------------


def option_types(kind: str, name: str, harness_arguments: int) -> dict[str, object] | None:
    """The options plugin ``name`` of ``kind`` takes, option -> its annotation (or the type of its
    default; ``object`` when neither says), or None when they cannot be known (a plugin that
    takes ``**options`` and declares no options dataclass).

    A baseline that names an options dataclass in ``options_class`` (the built-ins do) takes its
    fields; otherwise the options are the keyword parameters of the factory or class after the
    ``harness_arguments`` positional ones the harness passes (a bridge's width; a baseline's
    backbone, budget and seed)."""
    import dataclasses
    import inspect

    from dihal_bench.plugins import get_registry

    obj = get_registry().get(kind, name).obj
    declared = getattr(obj, "options_class", None)
    if dataclasses.is_dataclass(declared):
        hints = _hints(declared)
        return {field.name: hints.get(field.name, object) for field in dataclasses.fields(declared)}
    try:
        parameters = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    hints = _hints(obj.__init__ if inspect.isclass(obj) else obj)
    taken = {}
    for parameter in parameters[harness_arguments:]:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.POSITIONAL_ONLY):
            continue
        default_type = object if parameter.default in (parameter.empty, None) else type(parameter.default)
        taken[parameter.name] = hints.get(parameter.name, default_type)
    return taken


def _hints(obj) -> dict:
    """``obj``'s resolved annotations; {} when a plugin's annotations do not resolve."""
    import typing

    try:
        return typing.get_type_hints(obj)
    except Exception:  # noqa: BLE001 - annotations are the plugin's; unreadable ones just go unchecked
        return {}


def _accepts(annotation, value) -> bool | None:
    """Whether ``value`` fits ``annotation``: True, False, or None where the annotation is not
    one this check understands (then the plugin's own code judges the value)."""
    import types
    import typing

    from dihal_bench.suite import INT64_MAX

    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        verdicts = [_accepts(member, value) for member in typing.get_args(annotation)]
        return True if True in verdicts else (None if None in verdicts else False)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= INT64_MAX
    if annotation is float:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and abs(value) <= INT64_MAX and math.isfinite(value))
    if annotation is str:
        return isinstance(value, str)
    return None


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def check_options(kind: str, name: str, options: dict, key: str, *, harness_arguments: int,
                  required: tuple[str, ...] = ()) -> None:
    """Every option in ``options`` is one plugin ``name`` takes, of the type it declares, and
    ``required`` ones are there (docs/plugins.md, "Bridges" and "Baselines"): a misspelt or mistyped option fails here,
    before any model loads, instead of as a TypeError mid-run or, worse, silently ignored."""
    if not isinstance(options, dict):
        raise DihalError(f"{key} must be a table of options, got {options!r:.60}")
    taken = option_types(kind, name, harness_arguments)
    if taken is None:
        return
    for option, value in options.items():
        if option not in taken:
            known = ", ".join(sorted(taken)) or "(none)"
            raise DihalError(f"{key}: {kind} {name!r} has no option {option!r}; its options: {known}")
        if isinstance(value, float) and not math.isfinite(value):
            raise DihalError(f"{key}: option {option} of {kind} {name!r} must be finite, got {value!r}")
        if _accepts(taken[option], value) is False:
            raise DihalError(f"{key}: option {option} of {kind} {name!r} must be "
                             f"{_type_name(taken[option])}, got {value!r:.60}")
    missing = [option for option in required if option not in options]
    if missing:
        raise DihalError(f"{key}: {kind} {name!r} needs option(s) {', '.join(missing)}")


# -- the job store and the Ray cluster, before any model loads --------------------------------


def check_store_free(root: Path) -> None:
    """DihalError when another run holds the job store ``root`` (see
    :meth:`dihal_bench.jobs.JobStore.lock`), found without creating anything: a second run is
    told so before it loads its models, not after. The run still takes the lock itself later;
    this only moves the common refusal ahead of the slow part."""
    import fcntl

    from dihal_bench.jobs import LOCK

    path = Path(root) / LOCK
    try:
        handle = path.open("r")
    except OSError:  # no store yet, or one this user cannot open: the lock itself will say
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip() or "unknown"
            raise DihalError(f"job store {root} is in use by another dihal-bench run (pid {holder}); "
                             f"wait for it or use another --out") from None
        fcntl.flock(handle, fcntl.LOCK_UN)


#: seconds a Ray address has to accept a connection: a cluster's head answers at once
RAY_CONNECT_TIMEOUT = 5.0


def check_ray_address(address: str | None, timeout: float = RAY_CONNECT_TIMEOUT) -> None:
    """A Ray address given as ``[ray://]host:port`` accepts a TCP connection within
    ``timeout`` seconds (Ray's own client retries a dead address for many minutes, with the
    run's store locked). ``auto``, ``local`` and no address are left to Ray."""
    import socket

    if not address or address in ("auto", "local"):
        return
    where = address.removeprefix("ray://")
    host, sep, port_text = where.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise DihalError(f"--address {address!r} is not host:port (or ray://host:port, auto, local)")
    try:
        with socket.create_connection((host, int(port_text)), timeout=timeout):
            pass
    except socket.gaierror as exc:
        raise DihalError(f"--address {address!r}: unknown host {host!r} ({exc.strerror or exc})") from None
    except OSError as exc:
        reason = f"no answer within {timeout:g} s" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise DihalError(f"--address {address!r}: no Ray cluster answers there ({reason}); start one with "
                         "`ray start --head` or check the address") from None
