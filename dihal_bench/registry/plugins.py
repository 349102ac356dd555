"""Load plugins, check what they register against its kind's contract, and resolve references.

Every plugin, built-in or third-party, is a module listed under the ``dihal_bench``
entry-point group. We load the entry points ourselves (not with pluggy's
``load_setuptools_entrypoints``) so that one broken plugin is reported and skipped
instead of stopping the tool, and so that every registration knows which distribution
it came from.

Each ``register(name, obj, **meta)`` call is checked as it is made (:data:`META_RULES` for
the meta keys, :data:`OBJECT_CHECKS` for the object): a plugin whose registration breaks the contract is
a failure like one whose hook raises, found when the tool starts rather than as a wrong
number later (a misspelt ``higher_is_better`` once silently flipped a proxy's sign).

A plugin is someone else's code running in this process (docs/faults.md): its import gets
:func:`import_time_limit` seconds (the built-ins, loaded first, get no limit), in a thread, after which it is named, skipped and left
running (a thread cannot be killed from inside Python); what it prints to stdout while it loads
or registers is kept off stdout (which a command's ``--json`` output owns) and named in a
warning; one hook call registers at most :data:`MAX_REGISTRATIONS` items.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.metadata
import inspect
import io
import os
import reprlib
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pluggy

from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.registry import hookspecs

GROUP = "dihal_bench"

#: the environment variable that sets the seconds a plugin's import may take
IMPORT_TIMEOUT_ENV = "DIHAL_PLUGIN_IMPORT_TIMEOUT"
#: seconds a plugin's import may take by default: a plugin that imports torch and transformers
#: cold takes a few; one still importing after this is taken to hang
DEFAULT_IMPORT_TIMEOUT = 30.0
#: registrations one hook call may make: the built-ins make at most a few dozen; a plugin that
#: makes thousands is broken or hostile, and would bury every listing
MAX_REGISTRATIONS = 1000

#: kind of plugin -> the hook that registers it
KINDS = {
    "backbone": "register_backbones",
    "corpus": "register_corpora",
    "proxy": "register_proxies",
    "bridge": "register_bridges",
    "baseline": "register_baselines",
    "metric": "register_metrics",
    "suite": "register_suites",
    "reporter": "register_reporters",
}


class ContractViolation(DihalError):
    """A registration that breaks its kind's contract: the registering hook fails with it."""


# --- the contract of each kind ---------------------------------------------------------------


@dataclass(frozen=True)
class MetaRule:
    """One meta key a kind accepts: which values, said how in an error, and whether it must be given."""

    accepts: Callable[[Any], bool]
    expected: str
    required: bool = False


def _is_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip()) and "\n" not in value


DESCRIPTION = MetaRule(_is_text, "a non-empty one-line string")
HANDLES = MetaRule(callable, "a callable(reference: str) -> bool")

#: kind -> the meta keys its registrations may carry
META_RULES: dict[str, dict[str, MetaRule]] = {
    "backbone": {
        "description": DESCRIPTION,
        "handles": HANDLES,
        # bool is an int subclass; a True parameter count is a bug, not 1. A callable counts a
        # reference's parameters (a local checkpoint's) without loading its weights
        "parameters": MetaRule(lambda v: callable(v) or (isinstance(v, int) and not isinstance(v, bool) and v > 0),
                               "a positive int (the parameter count) or a callable(*arguments) -> it or None"),
        # both take the factory's positional arguments and must not load weights: the pre-flight
        # checks call them so that a layer, channel count or budget the model or its data cannot
        # take is refused before a load of seconds to minutes (dihal_bench.registry.resolve)
        "describe": MetaRule(callable, "a callable(*arguments) -> {'layers': int, 'width': int} or None"),
        "tokenizer": MetaRule(callable, "a callable(*arguments) -> the backbone's tokenizer or None"),
        # what a suite naming this backbone as its evaluator loads instead (resolve.load_evaluator)
        "evaluator": MetaRule(callable, "a callable(*arguments, device=..., dtype=...) -> the model that scores "
                                        "samples (tokenizer, device, logits_and_final_hidden, final_hidden)"),
    },
    "corpus": {"description": DESCRIPTION, "handles": HANDLES},
    "proxy": {
        "higher_is_better": MetaRule(lambda v: isinstance(v, bool), "True or False", required=True),
        "description": DESCRIPTION,
    },
    "bridge": {"description": DESCRIPTION},
    "baseline": {"description": DESCRIPTION},
    "metric": {
        "higher_is_better": MetaRule(lambda v: v is None or isinstance(v, bool),
                                     "True, False or None (no better direction)"),
        "display_name": MetaRule(_is_text, "a short one-line column title"),
        "description": DESCRIPTION,
        # in the suites' "default" metric set; honoured for built-in metrics only, so that
        # installing a plugin never changes what a built-in suite measures
        "default": MetaRule(lambda v: isinstance(v, bool), "True or False"),
        # whether fn runs the evaluator model: a metric that does not say is priced and counted as one
        # that does, since pricing a pass that is not run costs less than missing one that is
        "reads_evaluator": MetaRule(lambda v: isinstance(v, bool), "True or False"),
    },
    "suite": {"description": DESCRIPTION},
    # called before a run that names the reporter: raises DihalError when it cannot run here
    "reporter": {"description": DESCRIPTION,
                 "check": MetaRule(callable, "a callable() -> None that raises DihalError when the reporter "
                                             "cannot run here")},
}


def _check_meta(kind: str, meta: dict) -> str | None:
    rules = META_RULES[kind]
    for key, value in meta.items():
        if key not in rules:
            close = difflib.get_close_matches(key, rules, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (allowed: {', '.join(rules)})"
            return f"unknown meta key {key!r}{hint}"
        if not rules[key].accepts(value):
            return f"{key}={value!r} is not {rules[key].expected}"
    missing = [key for key, rule in rules.items() if rule.required and key not in meta]
    if missing:
        return f"missing required meta {', '.join(f'{key}=' for key in missing)}"
    return None


def _describe(obj: Any) -> str:
    return getattr(obj, "__qualname__", None) or reprlib.repr(obj)


def _check_callable(name: str, obj: Any) -> str | None:
    return None if callable(obj) else f"{_describe(obj)} is not callable"


def _check_proxy(name: str, obj: Any) -> str | None:
    if not callable(obj):
        return _check_callable(name, obj)
    try:
        parameters = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return f"the signature of {_describe(obj)} cannot be read, so it cannot be checked"
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                  inspect.Parameter.VAR_POSITIONAL)
    if not parameters or parameters[0].kind not in positional:
        return f"{_describe(obj)} takes no positional parameter for the (N, d) hidden-state tensor"
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    # the harness passes only the tensor positionally; constants must be able to stay unset
    undefaulted = [p.name for p in parameters[1:] if p.kind not in variadic and p.default is p.empty]
    if undefaulted:
        return (f"{_describe(obj)}: parameter(s) {', '.join(undefaulted)} after the tensor have no default "
                "(a proxy's constants need defaults)")
    return None


def _check_baseline(name: str, obj: Any) -> str | None:
    # imported here: dihal_bench.api.baseline pulls in torch and the training loop, which a
    # process that only lists plugins or resolves names does not otherwise need
    from dihal_bench.api.baseline import Baseline

    if not inspect.isclass(obj):
        return f"{_describe(obj)} is not a class: a baseline registers its Baseline subclass itself"
    if not issubclass(obj, Baseline):
        return f"class {obj.__qualname__} is not a subclass of dihal_bench.api.baseline.Baseline"
    if inspect.isabstract(obj):
        return f"class {obj.__qualname__} leaves {', '.join(sorted(obj.__abstractmethods__))} unimplemented"
    if obj.name != name:
        return f"class {obj.__qualname__} has name {obj.name!r}, not the registered {name!r}"
    return None


def _check_suite(name: str, obj: Any) -> str | None:
    if not isinstance(obj, (str, os.PathLike)):
        return f"{_describe(obj)} is not a path to a suite file"
    if not Path(obj).is_file():
        return f"suite file {os.fspath(obj)} does not exist"
    return None


def _check_reporter(name: str, obj: Any) -> str | None:
    if not callable(obj):
        return _check_callable(name, obj)
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"the signature of {_describe(obj)} cannot be read, so it cannot be checked"
    try:
        signature.bind(None)  # the harness calls it with the run's RunReport alone
    except TypeError:
        return f"{_describe(obj)} cannot be called with one argument (the run's RunReport)"
    return None


#: kind -> check of the registered object: None when it is fine, else what is wrong
OBJECT_CHECKS: dict[str, Callable[[str, Any], str | None]] = {
    "backbone": _check_callable,
    "corpus": _check_callable,
    "proxy": _check_proxy,
    # what a bridge factory returns is checked where it is built: calling it here would build one
    "bridge": _check_callable,
    "baseline": _check_baseline,
    "metric": _check_callable,
    "suite": _check_suite,
    "reporter": _check_reporter,
}


def check_registration(kind: str, name: Any, obj: Any, meta: dict) -> None:
    """Raise :class:`ContractViolation` if ``register(name, obj, **meta)`` breaks ``kind``'s contract."""
    if not _is_text(name) or name != name.strip():
        raise ContractViolation(f"{kind} name {name!r} is not a non-empty string without surrounding blanks")
    problem = _check_meta(kind, meta) or OBJECT_CHECKS[kind](name, obj)
    if problem:
        raise ContractViolation(f"{kind} {name!r}: {problem}")


# --- the registry ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    kind: str
    name: str
    obj: Any
    meta: dict
    plugin: str
    distribution: str | None = None
    version: str | None = None

    @property
    def source(self) -> str:
        if self.distribution is None:
            return f"{self.plugin} (not installed)"
        return f"{self.distribution} {self.version}"


@dataclass(frozen=True)
class PluginFailure:
    plugin: str
    distribution: str | None
    reason: str


@dataclass
class Registry:
    """Everything the loaded plugins registered, by kind and name."""

    items: dict[str, dict[str, Registration]] = field(default_factory=lambda: {k: {} for k in KINDS})
    failures: list[PluginFailure] = field(default_factory=list)
    #: (kind, name) claimed by two plugins neither of which is built in: used by neither
    contested: set[tuple[str, str]] = field(default_factory=set)

    def add(self, reg: Registration) -> None:
        """Take ``reg`` unless its name is taken (docs/plugins.md, "What is checked, and when").
        A clash never stops the tool: a built-in keeps its name and the plugin that re-registers
        it is listed as a failure; two other plugins that claim one name both lose it (either
        choice would be arbitrary), so that the name is unknown, with both listed, until one is
        uninstalled."""
        kind_items = self.items[reg.kind]
        existing = kind_items.get(reg.name)
        if existing is None and (reg.kind, reg.name) not in self.contested:
            kind_items[reg.name] = reg
            return
        clash = f"{reg.kind} {reg.name!r} is registered twice"
        if existing is None:  # already withdrawn from two others
            self.failures.append(PluginFailure(reg.plugin, reg.distribution, f"{clash}; skipped"))
        elif _is_builtin(existing) != _is_builtin(reg):
            kept, skipped = (existing, reg) if _is_builtin(existing) else (reg, existing)
            kind_items[reg.name] = kept
            self.failures.append(PluginFailure(
                skipped.plugin, skipped.distribution,
                f"{clash}: by the built-in plugin {kept.plugin!r} ({kept.source}), which keeps it, and by "
                f"plugin {skipped.plugin!r} ({skipped.source}); skipped"))
        else:
            del kind_items[reg.name]
            self.contested.add((reg.kind, reg.name))
            for loser in (existing, reg):
                self.failures.append(PluginFailure(
                    loser.plugin, loser.distribution,
                    f"{clash}: by plugin {existing.plugin!r} ({existing.source}) and by plugin {reg.plugin!r} "
                    f"({reg.source}); neither is used"))

    def default_metrics(self) -> list[str]:
        """The built-in metrics registered with ``default=True``, in registration order: what a
        suite's ``metrics.names = ["default"]`` stands for."""
        return [name for name, reg in self.items["metric"].items() if reg.meta.get("default") and _is_builtin(reg)]

    def reads_evaluator(self, metrics) -> bool:
        """Whether scoring with ``metrics`` (registered names) runs the evaluator model at all; a name
        not registered here counts as one that does."""
        found = self.items["metric"]
        return any(name not in found or found[name].meta.get("reads_evaluator", True) for name in metrics)

    def get(self, kind: str, name: str) -> Registration:
        try:
            return self.items[kind][name]
        except KeyError:
            raise unknown_name(kind, name, self.items[kind]) from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.items[kind])

    def resolve(self, kind: str, reference: str) -> tuple[Registration, tuple]:
        """The registration a user's ``reference`` means, and the positional arguments its
        factory is called with: a registered name, ``()``; else the one registration whose
        declared ``handles(reference)`` is true, ``(reference,)``."""
        if reference in self.items[kind]:
            return self.items[kind][reference], ()
        handlers = [reg for _, reg in sorted(self.items[kind].items()) if "handles" in reg.meta]
        takers = [reg for reg in handlers if self._handles(reg, reference)]
        if len(takers) == 1:
            return takers[0], (reference,)
        if takers:
            claimants = ", ".join(f"{reg.name} (from {reg.source})" for reg in takers)
            raise DihalError(f"{kind} {reference!r} is accepted by more than one plugin: {claimants}; "
                             "uninstall one, or ask its author to narrow what its `handles` accepts")
        error = unknown_name(kind, reference, self.items[kind])
        if not handlers:
            raise error
        accepted = "; ".join(f"{reg.name} ({reg.meta.get('description', 'its own references')})" for reg in handlers)
        raise DihalError(f"{error}; or a reference handled by {accepted}")

    @staticmethod
    def _handles(reg: Registration, reference: str) -> bool:
        try:
            return bool(reg.meta["handles"](reference))
        except Exception as exc:  # noqa: BLE001 - name the plugin, whatever its bug
            raise DihalError(f"{reg.kind} {reg.name!r} from {reg.source}: handles({reference!r}) failed: "
                             f"{_one_line(exc)}") from exc

    def all(self) -> list[Registration]:
        return [reg for kind in KINDS for _, reg in sorted(self.items[kind].items())]


#: the distribution whose plugins (the repository's plugins/ folder) are the built-ins
BUILTIN_DISTRIBUTION = "dihal-bench"


def _is_builtin(reg: Registration) -> bool:
    return reg.distribution == BUILTIN_DISTRIBUTION


def call_factory(registration: Registration, *args, **options):
    """``registration.obj(*args, **options)``: what a backbone, corpus or bridge plugin builds.
    A DihalError from it passes as it is; any other exception is the plugin's, and becomes one
    line naming the plugin (``--debug`` shows its traceback), not a traceback to the user."""
    try:
        return registration.obj(*args, **options)
    except DihalError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's code may raise anything
        raise DihalError(f"{registration.kind} {registration.name!r} from {registration.source} failed: "
                         f"{_one_line(exc)}") from exc


def build_named(kind: str, reference: str, **options):
    """The object plugin ``kind`` builds for a user's ``reference`` (see
    :meth:`Registry.resolve`), through :func:`call_factory`."""
    registration, arguments = get_registry().resolve(kind, reference)
    return call_factory(registration, *arguments, **options)


def _new_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    return pm


def _register_checked(pm: pluggy.PluginManager, plugin: object, name: str) -> None:
    """Register ``plugin``; unregister it again if it implements a hook we do not define
    (usually a misspelt name), so that it cannot half-work."""
    pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError:
        pm.unregister(name=name)
        raise


def import_time_limit() -> float:
    """The seconds a plugin's import may take: ``$DIHAL_PLUGIN_IMPORT_TIMEOUT``, else 30."""
    text = os.environ.get(IMPORT_TIMEOUT_ENV, "").strip()
    if not text:
        return DEFAULT_IMPORT_TIMEOUT
    try:
        limit = float(text)
    except ValueError:
        limit = float("nan")
    if not limit > 0 or limit == float("inf"):
        raise DihalError(f"{IMPORT_TIMEOUT_ENV}={text!r} is not a positive number of seconds")
    return limit


class ImportTimeout(Exception):
    """A plugin's import did not finish within its time limit."""


def _load_limited(ep: importlib.metadata.EntryPoint, limit: float, printed: io.StringIO) -> object:
    """``ep.load()`` in a daemon thread, given ``limit`` seconds; what it prints to stdout meanwhile
    goes to ``printed``. ImportTimeout when it has not finished: the thread is left running (Python
    cannot stop it) and, being a daemon, does not keep the process alive at exit."""
    outcome: dict[str, object] = {}

    def load() -> None:
        try:
            outcome["plugin"] = ep.load()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            outcome["error"] = exc

    thread = threading.Thread(target=load, name=f"dihal-plugin-import:{ep.name}", daemon=True)
    # redirected around the wait, not inside the thread: a hung thread must not keep stdout redirected
    with contextlib.redirect_stdout(printed):
        thread.start()
        thread.join(limit)
    if thread.is_alive():
        raise ImportTimeout(f"its import did not finish within {limit:g} s (it may hang; {IMPORT_TIMEOUT_ENV} "
                            f"sets the limit); skipped, its import thread left running")
    error = outcome.get("error")
    if isinstance(error, Exception):
        raise error
    if error is not None:  # a plugin's sys.exit() at import must not end the tool
        raise RuntimeError(f"its import raised {type(error).__name__}{f': {error}' if str(error) else ''}")
    return outcome["plugin"]


def _warn_printed(plugin: str, printed: io.StringIO) -> None:
    text = printed.getvalue().strip()
    if text:
        first = text.splitlines()[0]
        print(f"Warning: plugin {plugin!r} printed to stdout while loading ({len(text)} characters, first line "
              f"{reprlib.repr(first)}); kept off stdout: report it to the plugin's author", file=sys.stderr)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def build_registry(
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> Registry:
    """Load the entry points (default: the installed ``dihal_bench`` group) plus any
    ``(name, plugin_object)`` pairs given inline, and collect their registrations."""
    if entry_points is None:
        entry_points = importlib.metadata.entry_points(group=GROUP)
    pm = _new_manager()
    registry = Registry()
    origin: dict[str, tuple[str | None, str | None]] = {}

    limit = import_time_limit()

    def builtin_first(ep: importlib.metadata.EntryPoint) -> tuple[bool, str]:
        dist = getattr(ep, "dist", None)
        return (dist is None or dist.name != BUILTIN_DISTRIBUTION), ep.name

    # the built-ins first, and with no time limit: they are this package's own code, and they
    # import the heavy libraries (torch, transformers, peft) that a plugin's import then finds
    # loaded, so that its limit times its own import, not a cold start of those
    for ep in sorted(entry_points, key=builtin_first):
        dist = getattr(ep, "dist", None)
        dist_name, dist_version = (dist.name, dist.version) if dist is not None else (None, None)
        if pm.has_plugin(ep.name):
            registry.failures.append(PluginFailure(ep.name, dist_name, "a plugin of this name is already loaded"))
            continue
        printed = io.StringIO()
        try:
            if dist_name == BUILTIN_DISTRIBUTION:
                with contextlib.redirect_stdout(printed):
                    plugin = ep.load()
            else:
                plugin = _load_limited(ep, limit, printed)
            _register_checked(pm, plugin, ep.name)
        except ImportTimeout as exc:
            registry.failures.append(PluginFailure(ep.name, dist_name, str(exc)))
            print(f"Warning: plugin {ep.name!r} ({dist_name or 'no distribution'}): {exc}", file=sys.stderr)
            continue
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the tool
            registry.failures.append(PluginFailure(ep.name, dist_name, _one_line(exc)))
            continue
        finally:
            _warn_printed(ep.name, printed)
        origin[ep.name] = (dist_name, dist_version)

    for name, plugin in extra_plugins:
        try:
            _register_checked(pm, plugin, name)
        except pluggy.PluginValidationError as exc:
            raise DihalError(f"plugin {name!r}: {exc}") from None
        origin[name] = (None, None)

    # Call each implementation on its own so a registration is attributed to its plugin
    # and one plugin's failing hook does not hide the others' registrations.
    for kind, hook_name in KINDS.items():
        for impl in getattr(pm.hook, hook_name).get_hookimpls():
            dist_name, dist_version = origin.get(impl.plugin_name, (None, None))
            collected: list[Registration] = []

            def register(name: str, obj: Any, _kind=kind, _impl=impl, _d=dist_name, _v=dist_version, **meta):
                if len(collected) >= MAX_REGISTRATIONS:
                    raise ContractViolation(f"more than {MAX_REGISTRATIONS} registrations in one call; "
                                            "none of them is used")
                check_registration(_kind, name, obj, meta)
                collected.append(Registration(_kind, name, obj, meta, _impl.plugin_name, _d, _v))

            printed = io.StringIO()
            try:
                with contextlib.redirect_stdout(printed):
                    impl.function(register=register)
            except Exception as exc:  # noqa: BLE001
                # a contract message is written for this list; a raised bug is named by its type
                reason = str(exc) if isinstance(exc, ContractViolation) else _one_line(exc)
                registry.failures.append(PluginFailure(impl.plugin_name, dist_name, f"{hook_name}: {reason}"))
                continue
            finally:
                _warn_printed(impl.plugin_name, printed)
            for reg in collected:
                registry.add(reg)
    return registry


_registry: Registry | None = None
_inline: list[tuple[str, object]] = []


def get_registry(refresh: bool = False) -> Registry:
    """The process-wide registry, built on first use."""
    global _registry
    if _registry is None or refresh:
        _registry = build_registry(extra_plugins=_inline)
    return _registry


def register_plugin(plugin: object, name: str) -> None:
    """Add a plugin object (a module or any object with hookimpls) without an entry point."""
    _inline.append((name, plugin))
    try:
        get_registry(refresh=True)
    except Exception:
        _inline.pop()  # a rejected plugin must not poison every later rebuild
        get_registry(refresh=True)
        raise


def unregister_plugin(name: str) -> None:
    _inline[:] = [(n, p) for n, p in _inline if n != name]
    get_registry(refresh=True)

