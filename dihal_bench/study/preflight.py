"""Checks that run before any work: every name a suite or command uses is registered (or is a
reference a plugin handles), every plugin option is one the plugin takes with a value of its
type, every device can be used, every output folder can be written, the job store is free, a
Ray address answers and the memory the largest steps need is there (`dihal_bench.study.memory`).

A study that fails on its evaluator's name after an hour of training, or on a read-only results
folder after all the work is done, wastes the user's time; so ``dihal-bench run`` and every
single-stage command call these first and stop with one ``Error:`` line.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dihal_bench.config.settings import SuiteConfig
from dihal_bench.errors import DihalError
from dihal_bench.registry.options import check_options, check_registered
from dihal_bench.registry.plugins import get_registry
from dihal_bench.study.plan import method_rows, trains


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
    from dihal_bench.config.suite import DTYPES

    if dtype not in DTYPES:
        raise DihalError(f"{key} {dtype!r} is not one of {', '.join(DTYPES)}")


def check_writable(folder: Path, what: str) -> None:
    """Prove a file can be written in ``folder``, leaving nothing behind: the folders this check
    creates (and its probe file) are removed again, so a refused command writes nothing."""
    folder = Path(folder)
    missing = []
    probe = folder
    try:
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
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
    from dihal_bench.registry.resolve import backbone_factory

    _named(backbone_factory, name, key, "backbone")


def check_corpus_name(spec: str, key: str = "corpus") -> None:
    from dihal_bench.registry.resolve import corpus_factory

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


def check_suite(config: SuiteConfig, *, folders: dict[str, Path] | None = None, here: bool = True,
                reporters: Sequence[str] = ()) -> None:
    """Everything about a resolved suite (see :func:`dihal_bench.config.suite.check_values` for its values)
    that can be known without loading a model; ``folders`` maps a description to a folder that
    must be writable (the job store, the results folder). ``here=False`` (a dry-run planning for
    another machine) does not ask whether this machine has the suite's device. ``reporters``: the
    run's ``--report-to`` names, each registered and able to run in this process (which runs them)."""
    check_reporters(reporters)
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
    check_scaled_rows(config)
    for what, folder in (folders or {}).items():
        check_writable(folder, what)
    if here:
        check_suite_data(config)


def check_reporters(names: Sequence[str], key: str = "--report-to") -> None:
    """Every name is a registered reporter (dihal_bench.study.reporting), and each one's ``check``
    passes here: the process that runs the suite runs its reporters."""
    names = list(dict.fromkeys(names))
    check_registered("reporter", names, key)
    for name in names:
        registration = get_registry().get("reporter", name)
        check = registration.meta.get("check")
        try:
            if check is not None:
                check()
        except DihalError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's check may raise anything
            detail = " ".join(str(exc).split())
            raise DihalError(f"reporter {name!r} from {registration.source}: its check failed: "
                             f"{type(exc).__name__}{f': {detail}' if detail else ''}") from exc


def check_scaled_rows(config: SuiteConfig) -> None:
    """Every row ``scales.rows`` names is a row of the suite that trains (docs/method.md#budget-scales)."""
    trained = [label for label, kind, name in method_rows(config) if trains(kind, name)]
    for label in config.scales.rows:
        if label not in trained:
            raise DihalError(f"scales.rows names {label!r}, which is not a trained row of this suite; "
                             f"trained rows: {', '.join(trained) or 'none'}")


# -- what the model and its data can take, known without loading weights -----------------------


def check_suite_data(config: SuiteConfig) -> None:
    """The suite's corpus builds, and what its backbone's ``describe`` and ``tokenizer`` hooks
    say without loading weights: explicit sweep layers exist, locate's dropped channels and token
    count fit the width and the validation split, and the training split feeds every budget.
    What a plugin without the hooks cannot say is checked after the load
    (:meth:`dihal_bench.study.run.Run.check_inputs`, through :func:`check_model_inputs`)."""
    from dihal_bench.registry.resolve import (
        backbone_tokenizer,
        describe_backbone,
        load_corpus,
    )

    corpus = load_corpus(config.corpus)
    check_model_inputs(config, describe_backbone(config.backbone), backbone_tokenizer(config.backbone), corpus)


def check_model_inputs(config: SuiteConfig, shape, tokenizer, corpus) -> None:
    """A suite's layers, channel counts, token counts and budgets against a backbone's
    :class:`~dihal_bench.api.backbone.BackboneShape` (None: unknown yet) and ``tokenizer`` (None:
    unknown yet) and the corpus; each check runs on what is known."""
    from dihal_bench.study.estimate import worker_memory
    from dihal_bench.study.memory import check_memory
    from dihal_bench.study.plan import budget_sections
    from dihal_bench.study.protocol import section_budget

    locate = config.locate
    check_locate_inputs(shape, tokenizer, corpus, tokens=locate.tokens, seq_len=locate.seq_len,
                        drop_top=locate.drop_top, key="locate.")
    if shape is not None and config.sweep.layers != "auto":
        for layer in config.sweep.layers:
            shape.check_layer(layer)
    # before the data checks: a request the machine cannot hold is refused with its price in memory
    check_memory(config, shape, len(tokenizer) if tokenizer is not None else None, worker_memory(config))
    if tokenizer is not None:
        for section in budget_sections(config, shape.num_layers if shape is not None else None):
            check_budget_fits(section_budget(config, section, seed=0), tokenizer, corpus)


def check_locate_inputs(shape, tokenizer, corpus, *, tokens: int, seq_len: int, drop_top: int, key: str) -> None:
    """Locate's dropped channels against the width and its ``tokens`` against the positions of
    the validation split's windows of ``seq_len`` tokens; ``key`` prefixes the option names in
    messages (``locate.`` for a suite, ``--`` for the command)."""
    from dihal_bench.locate.geometry import check_drop_top

    if shape is not None:
        if shape.num_layers < 3:  # locate scores layers 1..L-1 and needs two neighbours
            raise DihalError(f"{shape.name} has {shape.num_layers} layers; locate needs at least 3")
        try:
            check_drop_top(drop_top, shape.width)
        except DihalError as exc:
            option = "drop_top" if key.endswith(".") else "drop-top"
            raise DihalError(key + str(exc).replace("drop_top", option, 1)) from None
    if tokenizer is None:
        return
    windows = split_windows(tokenizer, corpus, "validation", seq_len)
    positions = windows * (seq_len - 1)  # position 0 is never sampled: it has no context
    if tokens > positions:
        raise DihalError(f"{key}tokens={tokens} exceeds the {positions} token positions of the validation split "
                         f"({windows} windows of {seq_len} tokens)")


def check_budget_fits(budget, tokenizer, corpus) -> None:
    """The training split, in windows of the budget's length, feeds the budget's steps."""
    budget.check_fits(split_windows(tokenizer, corpus, "train", budget.seq_len))


def split_windows(tokenizer, corpus, split: str, seq_len: int) -> int:
    """How many windows of ``seq_len`` tokens ``split`` packs into: the same tokenization and
    packing as the training and locate code (dihal_bench.api.corpus), from the tokenizer alone."""
    from dihal_bench.api.corpus import pack, tokenize_documents

    return len(pack(tokenize_documents(corpus.split(split), tokenizer), seq_len, split_name=split))


# -- the job store and the Ray cluster, before any model loads --------------------------------


def check_store_free(root: Path) -> None:
    """DihalError when another run holds the job store ``root`` (see
    :meth:`dihal_bench.study.jobs.JobStore.lock`), found without creating anything: a second run is
    told so before it loads its models, not after. The run still takes the lock itself later;
    this only moves the common refusal ahead of the slow part."""
    import fcntl

    from dihal_bench.study.jobs import LOCK

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
