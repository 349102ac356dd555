"""Load plugins and collect what they register.

Every plugin, built-in or third-party, is a module listed under the ``dihal_bench``
entry-point group. We load the entry points ourselves (not with pluggy's
``load_setuptools_entrypoints``) so that one broken plugin is reported and skipped
instead of stopping the tool, and so that every registration knows which distribution
it came from.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import pluggy

from dihal_bench import hookspecs
from dihal_bench.errors import DihalError, unknown_name

GROUP = "dihal_bench"

#: kind of plugin -> the hook that registers it
KINDS = {
    "backbone": "register_backbones",
    "corpus": "register_corpora",
    "proxy": "register_proxies",
    "bridge": "register_bridges",
    "baseline": "register_baselines",
    "metric": "register_metrics",
    "suite": "register_suites",
}


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

    def add(self, reg: Registration) -> None:
        existing = self.items[reg.kind].get(reg.name)
        if existing is not None:
            raise DihalError(
                f"{reg.kind} {reg.name!r} is registered twice: by plugin {existing.plugin!r} "
                f"({existing.source}) and by plugin {reg.plugin!r} ({reg.source})"
            )
        self.items[reg.kind][reg.name] = reg

    def get(self, kind: str, name: str) -> Registration:
        try:
            return self.items[kind][name]
        except KeyError:
            raise unknown_name(kind, name, self.items[kind]) from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.items[kind])

    def all(self) -> list[Registration]:
        return [reg for kind in KINDS for _, reg in sorted(self.items[kind].items())]


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

    for ep in sorted(entry_points, key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        dist_name, dist_version = (dist.name, dist.version) if dist is not None else (None, None)
        if pm.has_plugin(ep.name):
            registry.failures.append(PluginFailure(ep.name, dist_name, "a plugin of this name is already loaded"))
            continue
        try:
            _register_checked(pm, ep.load(), ep.name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the tool
            registry.failures.append(PluginFailure(ep.name, dist_name, _one_line(exc)))
            continue
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
                collected.append(Registration(_kind, name, obj, meta, _impl.plugin_name, _d, _v))

            try:
                impl.function(register=register)
            except Exception as exc:  # noqa: BLE001
                registry.failures.append(PluginFailure(impl.plugin_name, dist_name, f"{hook_name}: {_one_line(exc)}"))
                continue
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


def lookup(kind: str, name: str) -> Registration:
    return get_registry().get(kind, name)


def factory(kind: str, name: str) -> Callable:
    return lookup(kind, name).obj
