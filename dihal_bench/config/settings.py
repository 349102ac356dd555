"""A resolved suite as typed, frozen settings: one dataclass per table of a suite file.

:mod:`dihal_bench.config.suite` merges a suite file and the overrides over its ``DEFAULTS`` and checks
every value (``check_values``); :meth:`SuiteConfig.from_checked` turns that checked dict into
these dataclasses, and every reader uses attribute access (``config.sampling.seq_len``), so a
misspelt setting in the code fails where it is written rather than as a missing key mid-run.

:meth:`SuiteConfig.to_dict` gives back exactly the checked dict (same keys in the same order, same
values, lists where it has lists): job hashes are computed from parts of it and every run record
stores it as ``config``, so a dict that changed would orphan every stored job and record.

Lists are held as tuples. The free-form tables (``budget``, ``sweep.budget``, ``bridge.options``,
checked by the Budget and the bridge that read them) are read-only mappings over a private copy;
only their top level is read-only, so a caller must not change the values nested in them.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dihal_bench.errors import DihalError

if TYPE_CHECKING:
    from typing_extensions import Self


class _Table:
    """What every table shares: built from its checked dict, given back as that dict."""

    @classmethod
    def from_checked(cls, values: Mapping[str, Any], where: str = "") -> Self:
        """The table from a dict that :func:`dihal_bench.config.suite.check_values` has checked."""
        names = [field.name for field in dataclasses.fields(cls)]
        if set(values) != set(names):
            odd = sorted(set(values) ^ set(names))
            raise DihalError(f"not a checked suite: {', '.join(f'{where}{key}' for key in odd)} "
                             "missing or unknown")
        hints = typing.get_type_hints(cls)
        return cls(**{name: _freeze(values[name], hints[name], f"{where}{name}.") for name in names})

    def to_dict(self) -> dict:
        """The checked dict this table was built from, as fresh mutable data."""
        return {field.name: _thaw(getattr(self, field.name)) for field in dataclasses.fields(self)}


def _freeze(value, hint, where: str):
    if isinstance(hint, type) and issubclass(hint, _Table):
        return hint.from_checked(value, where)
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, dict):
        return MappingProxyType(copy.deepcopy(value))
    return value


def _thaw(value):
    if isinstance(value, _Table):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, Mapping):
        return copy.deepcopy(dict(value))
    return value


@dataclass(frozen=True)
class LocateSettings(_Table):
    """``[locate]``: how ℓ* is chosen (docs/method.md#locate)."""

    tokens: int
    seq_len: int
    proxies: tuple[str, ...]
    preprocessing: str
    variants: tuple[str, ...]
    drop_top: int


@dataclass(frozen=True)
class SweepSettings(_Table):
    """``[sweep]``: one bridge per layer under the sweep's own budget."""

    layers: str | tuple[int, ...]  # "auto" or the layers themselves
    count: int
    eval_sequences: int | str  # a count or "all"
    bridgeability_windows: int | str  # a count or "all"
    budget: Mapping[str, Any]  # free-form: a Budget's fields


@dataclass(frozen=True)
class BridgeSettings(_Table):
    """``[bridge]``: the bridge plugin every DiHAL role and the sweep train."""

    name: str
    options: Mapping[str, Any]  # free-form: the bridge plugin's keyword arguments
    sample_steps: int
    sink_passthrough: bool
    targets: str  # "stored" or "streamed"
    steps_axis: tuple[int, ...]
    steps_axis_samplers: tuple[str, ...]

    @property
    def streams_targets(self) -> bool:
        """Whether bridges train on states computed per batch rather than stored ones."""
        return self.targets == "streamed"


@dataclass(frozen=True)
class MethodsSettings(_Table):
    """``[methods]``: the rows of the methods table; all empty is a geometry-only suite."""

    dihal: tuple[str, ...]
    controls: tuple[str, ...]
    references: tuple[str, ...]
    baselines: tuple[str, ...]


@dataclass(frozen=True)
class SamplingSettings(_Table):
    """``[sampling]``: how every method's samples are drawn."""

    samples: int
    seq_len: int
    batch_size: int
    temperature: float
    top_p: float
    diffusion_steps: int


@dataclass(frozen=True)
class ScalesSettings(_Table):
    """``[scales]``: the budget factors each trained row is trained at (docs/method.md#budget-scales)."""

    factors: tuple[int, ...]
    rows: Mapping[str, Any]  # row label -> its own list of factors

    def of(self, label: str) -> tuple[int, ...]:
        """The factors row ``label`` (a trained row) is trained at."""
        return tuple(self.rows.get(label, self.factors))


@dataclass(frozen=True)
class FrontierSettings(_Table):
    """``[frontier]``: the sampling settings every eligible row is also sampled at (docs/method.md#frontiers)."""

    temperatures: tuple[float, ...]
    diffusion_steps: tuple[int, ...]


@dataclass(frozen=True)
class MetricsSettings(_Table):
    """``[metrics]``: which metrics score the samples, and how."""

    names: tuple[str, ...]
    mauve: bool
    latency_repeats: int
    max_length: int
    min_valid: int
    mauve_bootstrap: int
    test_nll_windows: int


@dataclass(frozen=True)
class SuiteConfig(_Table):
    """A whole resolved suite (docs/method.md#suites)."""

    description: str
    backbone: str
    corpus: str
    evaluator: str
    #: the suite says, on purpose, that its evaluator is its backbone (docs/method.md#metrics)
    evaluator_is_backbone: bool
    seeds: tuple[int, ...]
    device: str
    dtype: str
    device_map: str
    locate: LocateSettings
    sweep: SweepSettings
    budget: Mapping[str, Any]  # free-form: a Budget's fields
    bridge: BridgeSettings
    methods: MethodsSettings
    sampling: SamplingSettings
    scales: ScalesSettings
    frontier: FrontierSettings
    metrics: MetricsSettings

    def budget_table(self, section: str) -> Mapping[str, Any]:
        """The table of budget section ``section``: "budget" (the matched one) or "sweep.budget"."""
        if section == "budget":
            return self.budget
        if section == "sweep.budget":
            return self.sweep.budget
        raise ValueError(f"not a budget section: {section!r}")
