"""Suite values from text and TOML, checked one key at a time: the parsers both the suite
loader (``dihal_bench.config.suite``) and ``Budget`` (``dihal_bench.training.budget``) use.
A failed check is a DihalError naming the key, what it must be and what it got."""

from __future__ import annotations

import math
import sys

from dihal_bench.errors import DihalError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_value(text: str):
    """A ``--set`` value: TOML syntax when it parses (numbers, booleans, [lists]), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def fail(source: str, key: str, expected: str, value) -> DihalError:
    prefix = f"{source}: " if source else ""
    return DihalError(f"{prefix}{key} must be {expected}, got {value!r}")


#: the largest integer a suite value may hold: seeds, counts and sizes end up in int64 tensors
#: and torch generators, which raise OverflowError on anything larger, mid-run
INT64_MAX = 2**63 - 1


def as_int(value, key: str, source: str, minimum: int | None = None, maximum: int = INT64_MAX):
    """An integer in [minimum, maximum] (a whole float such as TOML's ``1e5`` counts; a bool
    does not)."""
    given = value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    expected = "an integer" if minimum is None else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(source, key, expected, given)
    if minimum is not None and value < minimum:
        raise fail(source, key, expected, given)
    if value > maximum:
        raise fail(source, key, f"{expected} and <= {maximum}", given)
    return value


def as_float(value, key: str, source: str, low: float | None = None, high: float | None = None,
             low_open: bool = False) -> float:
    """A finite number within [low, high] (``low_open``: low excluded)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise fail(source, key, "a finite number", value)
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        interval = f"{'(' if low_open else '['}{'' if low is None else low}, {'' if high is None else high}]"
        raise fail(source, key, f"a number in {interval}", value)
    return float(value)
