"""Names and options a suite gives plugins, checked against the registry before any model
loads: a name no plugin registers, a misspelt option or a mistyped value fails in one line
instead of as a TypeError mid-run or, worse, silently ignored (docs/plugins.md)."""

from __future__ import annotations

import dataclasses
import inspect
import math
import types
import typing

from dihal_bench.base.values import INT64_MAX
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import get_registry


def check_registered(kind: str, names, key: str) -> None:
    registry = get_registry()
    for name in names:
        try:
            registry.get(kind, name)
        except DihalError as exc:
            raise DihalError(f"{key}: {exc}") from None


def option_types(kind: str, name: str, harness_arguments: int) -> dict[str, object] | None:
    """The options plugin ``name`` of ``kind`` takes, option -> its annotation (or the type of its
    default; ``object`` when neither says), or None when they cannot be known (a plugin that
    takes ``**options`` and declares no options dataclass).

    A baseline that names an options dataclass in ``options_class`` (the built-ins do) takes its
    fields; otherwise the options are the keyword parameters of the factory or class after the
    ``harness_arguments`` positional ones the harness passes (a bridge's width; a baseline's
    backbone, budget and seed)."""
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

    try:
        return typing.get_type_hints(obj)
    except Exception:  # noqa: BLE001 - annotations are the plugin's; unreadable ones just go unchecked
        return {}


def _accepts(annotation, value) -> bool | None:
    """Whether ``value`` fits ``annotation``: True, False, or None where the annotation is not
    one this check understands (then the plugin's own code judges the value)."""

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
