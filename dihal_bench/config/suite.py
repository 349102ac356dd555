"""Suites as data (docs/method.md, "Suites"): a TOML file over these defaults, plus overrides.

Every key a suite may set appears in DEFAULTS and every one of them is read by the runner, so a
typo in a suite file or in ``--set`` is an error that names the key, never a silently ignored
setting. :func:`check_values` checks every value's type and range before any work starts; the
names in a suite (backbone, corpus, plugins) are checked against the registry by
:func:`dihal_bench.study.preflight.check_suite`. What :func:`resolve_suite`, :func:`load_suite_file` and
:func:`apply_overrides` return is the checked dict as a typed, frozen
:class:`~dihal_bench.config.settings.SuiteConfig`; its ``to_dict()`` is the dict again.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from dihal_bench.base.values import as_float, as_int, fail, parse_value
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.errors import DihalError
from dihal_bench.locate.defaults import DIHAL_PROXIES, PREPROCESSING_MODES
from dihal_bench.registry.plugins import get_registry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DIHAL_ROLES = ("chosen", "worst", "oracle")
#: controls at ℓ* (docs/method.md#controls): the upper stack fed h_0 with no bridge, and the
#: suite's bridge network trained as a one-step regressor under the matched budget
CONTROLS = ("skip", "regressor")
#: reference rows that cost no training: i.i.d. unigram text of the training split (a floor)
#: and held-out human windows (a ceiling), scored by the same metrics
REFERENCES = ("unigram", "human")
DTYPES = ("float32", "bfloat16", "float16")
#: the word a suite's ``device`` and ``dtype`` may say for "what this machine runs best", resolved
#: once at the start of a run (:func:`resolved_config`), so the record names what actually ran
AUTO = "auto"
#: the word in ``metrics.names`` that stands for every built-in metric registered with ``default=True``
DEFAULT_METRICS = "default"
#: how bridge training windows get their hidden states (bridge.targets)
BRIDGE_TARGETS = ("stored", "streamed")
#: the dihal-bridge's update rules (= dihal_builtin.bridge.SAMPLER_STEPS), which a steps axis may compare
BRIDGE_SAMPLERS = ("mean", "ddim", "ancestral")

DEFAULTS: dict = {
    "description": "",
    "backbone": "smollm2-135m",
    "corpus": "stdlib-docs",
    "evaluator": "gemma3-270m",
    # a model judging text its own upper layers wrote favours the hybrid and every row sharing its
    # weights: a suite whose evaluator is its backbone must say so (check_scorer)
    "evaluator_is_backbone": False,
    "seeds": [0],
    "device": AUTO,
    "dtype": AUTO,
    "device_map": "",
    "locate": {
        "tokens": 4096,
        "seq_len": 128,
        "proxies": list(DIHAL_PROXIES),
        "preprocessing": "trace",
        # S(ℓ) and ℓ* under these too, beside the one that sets ℓ* (docs/method.md#locate)
        "variants": ["trace", "standardize", "trace-drop-top"],
        "drop_top": 4,  # k of trace-drop-top: the largest-variance channels removed
    },
    "sweep": {
        "layers": "auto",
        "count": 10,
        "eval_sequences": 64,
        # validation windows bridgeability is measured on (and the LM windows drawn from): "all" or a
        # seeded subset, for validation splits whose states at every swept layer do not fit memory
        "bridgeability_windows": "all",
        "budget": {},
    },
    "budget": {},
    "bridge": {"name": "dihal-bridge", "options": {}, "sample_steps": 8, "sink_passthrough": True,
               # "stored": one extraction job keeps every training window's states at every bridge
               # layer on disk; "streamed": each training step computes its batch's states (docs/method.md#bridge)
               "targets": "stored",
               # DiHAL at ℓ* re-evaluated (bridgeability, hybrid PPL, samples) at each of these K
               "steps_axis": [],
               # ... under each of these samplers of the dihal-bridge ([]: the suite's own sampler alone)
               "steps_axis_samplers": []},
    "methods": {"dihal": list(DIHAL_ROLES), "controls": [], "references": [], "baselines": []},
    "sampling": {"samples": 64, "seq_len": 64, "batch_size": 16, "temperature": 1.0, "top_p": 1.0,
                 "diffusion_steps": 50},
    # budget scales (docs/method.md#budget-scales): every trained row at each factor of the matched
    # budget, or at its own list in `rows` (row label -> factors)
    "scales": {"factors": [1], "rows": {}},
    # quality frontiers (docs/method.md#frontiers): every scale-1 row that draws tokens from a next-token
    # distribution resampled at each of these temperatures, every diffusion baseline at each of these
    # numbers of denoising steps, each point scored by the suite's metrics ([]: none)
    "frontier": {"temperatures": [], "diffusion_steps": []},
    "metrics": {"names": [DEFAULT_METRICS],
                "mauve": True, "latency_repeats": 3, "max_length": 1024,
                # a method with fewer valid samples is flagged, not averaged (docs/method.md#metrics)
                "min_valid": 16,
                "mauve_bootstrap": 50,  # resamples for MAUVE's 95% interval; 0: none
                # held-out test windows each row's likelihood is computed on (docs/method.md#test-nll); 0: none
                "test_nll_windows": 0},
}

#: sections whose contents are free-form (checked by the component that reads them)
OPEN_SECTIONS = {("budget",), ("sweep", "budget"), ("bridge", "options"), ("scales", "rows")}


def _merge(base: dict, update: dict, where: tuple[str, ...], source: str) -> dict:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        path = (*where, key)
        if where in OPEN_SECTIONS:
            merged[key] = value
        elif key not in base:
            raise DihalError(f"{source}: unknown suite key {'.'.join(path)!r}")
        elif isinstance(base[key], dict):
            if not isinstance(value, dict):
                raise DihalError(f"{source}: {'.'.join(path)} must be a table")
            merged[key] = _merge(base[key], value, path, source)
        else:
            merged[key] = value
    return merged


def record_config(stored: dict, source: str = "run record") -> SuiteConfig:
    """The config a run record stores (its ``config``), typed. A key added to the suites since the
    record was written takes its default, which is always the behaviour before the key existed, so
    the config still names what that run did and its jobs' keys."""
    return SuiteConfig.from_checked(check_values(_merge(DEFAULTS, stored, (), source), source))


def load_suite_file(path: Path) -> SuiteConfig:
    """A suite TOML file over DEFAULTS, checked. A leading UTF-8 byte-order mark (which some
    Windows editors write) is read past: TOML forbids it, but it carries no content."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DihalError(f"cannot read suite file {path}: {reason}") from None
    return SuiteConfig.from_checked(check_values(_merge(DEFAULTS, data, (), str(path)), str(path)))


def resolve_suite(name_or_path: str) -> tuple[str, SuiteConfig]:
    """A registered suite name or a path to a suite TOML file -> (name, config)."""
    registry = get_registry()
    if name_or_path in registry.items["suite"]:
        return name_or_path, load_suite_file(registry.get("suite", name_or_path).obj)
    if Path(name_or_path).is_file():
        return Path(name_or_path).stem, load_suite_file(Path(name_or_path))
    registry.get("suite", name_or_path)  # raises: unknown suite, listing the known ones
    raise AssertionError("unreachable")


def check_scorer(config: SuiteConfig, source: str = "suite") -> None:
    """Refuse a suite that scores its samples with its own backbone unless it says so
    (``evaluator_is_backbone = true``): the evaluator would judge text its own layers wrote. Names are
    compared, so a copy of the backbone under another name is not caught."""
    if config.evaluator == config.backbone and not config.evaluator_is_backbone:
        raise DihalError(f"{source}: the evaluator is the backbone ({config.backbone}), which would score text its "
                         "own layers wrote; name another evaluator (--evaluator) or set evaluator_is_backbone = true "
                         "to accept it (the tables then say so)")


def apply_overrides(config: SuiteConfig, assignments: dict[str, str]) -> SuiteConfig:
    """``{"budget.steps": "100", "sampling.samples": "8"}`` applied to a resolved suite (a new one:
    ``config`` is frozen)."""
    update: dict = {}
    for dotted, text in assignments.items():
        node = update
        *parents, leaf = dotted.split(".")
        if not all(parents) or not leaf:
            raise DihalError(f"--set {dotted!r}: not a dotted suite key")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise DihalError(f"--set {dotted!r}: {part} is set twice, as a value and as a table")
        node[leaf] = parse_value(text)
    return SuiteConfig.from_checked(check_values(_merge(config.to_dict(), update, (), "--set"), "--set"))


# -- "auto" device and dtype ------------------------------------------------------------------


def resolve_device(name: str) -> str:
    """``name`` itself, or for "auto" the best device this machine has: CUDA, else MPS, else CPU."""
    if name != AUTO:
        return name
    import torch

    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def resolve_dtype(name: str, device: str) -> str:
    """``name`` itself, or for "auto" the dtype ``device`` (already resolved) runs best: bfloat16 on
    a CUDA device that computes in it natively (compute capability 8.0 and up), else float32. MPS
    stays float32: its bfloat16 support depends on the macOS version, and float32 is never wrong."""
    if name != AUTO:
        return name
    if device == AUTO:
        raise DihalError("resolve the device before its dtype: dtype 'auto' depends on the device")
    if not device.startswith("cuda"):
        return "float32"
    import torch

    if not torch.cuda.is_available():
        raise DihalError(f"dtype 'auto' on {device}: no CUDA device here to tell whether it computes in "
                         "bfloat16; name the dtype (bfloat16 or float32)")
    return "bfloat16" if torch.cuda.is_bf16_supported(including_emulation=False) else "float32"


def resolved_config(config: SuiteConfig) -> SuiteConfig:
    """``config`` with an "auto" device and dtype replaced by what this machine runs; the config a
    run works with and records. Neither is part of any job's key, so resolving changes no job."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if (device, dtype) == (config.device, config.dtype):
        return config
    merged = _merge(config.to_dict(), {"device": device, "dtype": dtype}, (), "resolved device")
    return SuiteConfig.from_checked(check_values(merged, "resolved device"))


# -- value checks: one rule per key, so every value is checked before any job runs ------------


def _string(value, key: str, source: str, choices=None, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise fail(source, key, "a non-empty string" if not allow_empty else "a string", value)
    if "\n" in value or "\x00" in value:
        raise fail(source, key, "a single line", value)
    if choices is not None and value not in choices:
        raise fail(source, key, f"one of {', '.join(choices)}", value)
    return value


def _names(value, key: str, source: str, choices=None, allow_empty: bool = False) -> list[str]:
    if not isinstance(value, list) or (not allow_empty and not value):
        raise fail(source, key, "a list of names" if allow_empty else "a non-empty list of names", value)
    names = [_string(v, key, source, choices) for v in value]
    if len(set(names)) != len(names):
        raise fail(source, key, "a list without repeats", value)
    return names


def _bool(value, key: str, source: str) -> bool:
    if not isinstance(value, bool):
        raise fail(source, key, "true or false", value)
    return value


def _seeds(value, key: str, source: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise fail(source, key, "a non-empty list of non-negative integers", value)
    seeds = [as_int(v, key, source, minimum=0) for v in value]
    if len(set(seeds)) != len(seeds):
        raise fail(source, key, "a list without repeats", value)
    return seeds


def _layers(value, key: str, source: str):
    if value == "auto":
        return value
    if not isinstance(value, list) or not value:
        raise fail(source, key, "'auto' or a non-empty list of layers", value)
    return sorted({as_int(v, key, source, minimum=1) for v in value})


def _metric_names(names: list[str]) -> list[str]:
    """``names`` with "default" replaced by the default metrics, so that adding a metric to a suite
    is one word (``["default", "mine"]``) and the record names every metric that ran."""
    if DEFAULT_METRICS not in names:
        return names
    expanded = [m for name in names for m in (get_registry().default_metrics() if name == DEFAULT_METRICS else [name])]
    return list(dict.fromkeys(expanded))


def _counts(value, key: str, source: str) -> list[int]:
    if not isinstance(value, list):
        raise fail(source, key, "a list of integers >= 1", value)
    return sorted({as_int(v, key, source, minimum=1) for v in value})


def _temperatures(value, key: str, source: str) -> list[float]:
    if not isinstance(value, list):
        raise fail(source, key, "a list of temperatures > 0", value)
    return sorted({as_float(v, key, source, low=0.0, low_open=True) for v in value})


def _factors(value, key: str, source: str) -> list[int]:
    factors = _counts(value, key, source)
    if not factors:
        raise fail(source, key, "a non-empty list of integers >= 1", value)
    return factors


def _row_factors(value, key: str, source: str) -> dict:
    """``scales.rows``: row label -> its own budget factors (which rows train is checked by preflight)."""
    return {_string(label, key, source): _factors(factors, f"{key}.{label}", source)
            for label, factors in _table(value, key, source).items()}


def _count_or_all(value, key: str, source: str) -> int | str:
    if value == "all":
        return value
    try:
        return as_int(value, key, source, minimum=1)
    except DihalError:
        raise fail(source, key, "'all' or an integer >= 1", value) from None


def _table(value, key: str, source: str) -> dict:
    if not isinstance(value, dict):
        raise fail(source, key, "a table", value)
    return value


RULES = {
    "description": lambda v, k, s: _string(v, k, s, allow_empty=True),
    "backbone": _string,
    "corpus": _string,
    "evaluator": _string,
    "evaluator_is_backbone": _bool,
    "seeds": _seeds,
    "device": _string,
    "dtype": lambda v, k, s: _string(v, k, s, (AUTO, *DTYPES)),
    "device_map": lambda v, k, s: _string(v, k, s, allow_empty=True),
    "locate.tokens": lambda v, k, s: as_int(v, k, s, minimum=2),
    "locate.seq_len": lambda v, k, s: as_int(v, k, s, minimum=2),
    "locate.proxies": _names,
    "locate.preprocessing": lambda v, k, s: _string(v, k, s, PREPROCESSING_MODES),
    "locate.variants": lambda v, k, s: _names(v, k, s, PREPROCESSING_MODES, allow_empty=True),
    "locate.drop_top": lambda v, k, s: as_int(v, k, s, minimum=0),
    "sweep.layers": _layers,
    # an automatic sweep always holds ℓ* and the worst-scored layer, which may be two layers
    "sweep.count": lambda v, k, s: as_int(v, k, s, minimum=2),
    "sweep.eval_sequences": lambda v, k, s: _count_or_all(v, k, s),
    "sweep.bridgeability_windows": lambda v, k, s: _count_or_all(v, k, s),
    "sweep.budget": _table,
    "budget": _table,
    "bridge.name": _string,
    "bridge.options": _table,
    "bridge.sample_steps": lambda v, k, s: as_int(v, k, s, minimum=1),
    "bridge.sink_passthrough": _bool,
    "bridge.targets": lambda v, k, s: _string(v, k, s, BRIDGE_TARGETS),
    "bridge.steps_axis": lambda v, k, s: _counts(v, k, s),
    "bridge.steps_axis_samplers": lambda v, k, s: _names(v, k, s, BRIDGE_SAMPLERS, allow_empty=True),
    "methods.dihal": lambda v, k, s: _names(v, k, s, DIHAL_ROLES, allow_empty=True),
    "methods.controls": lambda v, k, s: _names(v, k, s, CONTROLS, allow_empty=True),
    "methods.references": lambda v, k, s: _names(v, k, s, REFERENCES, allow_empty=True),
    "methods.baselines": lambda v, k, s: _names(v, k, s, allow_empty=True),
    "sampling.samples": lambda v, k, s: as_int(v, k, s, minimum=1),
    "sampling.seq_len": lambda v, k, s: as_int(v, k, s, minimum=2),
    "sampling.batch_size": lambda v, k, s: as_int(v, k, s, minimum=1),
    "sampling.temperature": lambda v, k, s: as_float(v, k, s, low=0.0, low_open=True),
    "sampling.top_p": lambda v, k, s: as_float(v, k, s, low=0.0, high=1.0, low_open=True),
    "sampling.diffusion_steps": lambda v, k, s: as_int(v, k, s, minimum=1),
    "frontier.temperatures": _temperatures,
    "frontier.diffusion_steps": _counts,
    "scales.factors": _factors,
    "scales.rows": _row_factors,
    "metrics.names": lambda v, k, s: _metric_names(_names(v, k, s, allow_empty=True)),
    "metrics.mauve": _bool,
    "metrics.latency_repeats": lambda v, k, s: as_int(v, k, s, minimum=1),
    "metrics.max_length": lambda v, k, s: as_int(v, k, s, minimum=2),
    "metrics.min_valid": lambda v, k, s: as_int(v, k, s, minimum=1),
    "metrics.mauve_bootstrap": lambda v, k, s: as_int(v, k, s, minimum=0),
    "metrics.test_nll_windows": lambda v, k, s: as_int(v, k, s, minimum=0),
}


def check_values(config: dict, source: str = "suite") -> dict:
    """``config`` with every value checked (and whole floats made ints) against RULES; budget
    tables are checked by building their Budget. Raises DihalError naming the first bad key."""
    from dihal_bench.training.budget import Budget

    checked = copy.deepcopy(config)
    for dotted, rule in RULES.items():
        *parents, leaf = dotted.split(".")
        node = checked
        for part in parents:
            node = node[part]
        node[leaf] = rule(node[leaf], dotted, source)
    for section, table in (("budget", checked["budget"]), ("sweep.budget", checked["sweep"]["budget"])):
        budget = Budget.from_dict(table, section=section, source=source)
        table.update({key: getattr(budget, key) for key in table})  # typed as the Budget holds them
    sweep = checked["sweep"]
    if sweep["bridgeability_windows"] != "all" and (sweep["eval_sequences"] == "all"
                                                     or sweep["eval_sequences"] > sweep["bridgeability_windows"]):
        raise DihalError(f"{source}: sweep.eval_sequences ({sweep['eval_sequences']}) must not exceed "
                         f"sweep.bridgeability_windows ({sweep['bridgeability_windows']}): the LM windows are drawn from them")
    if checked["bridge"]["steps_axis"] and "chosen" not in checked["methods"]["dihal"]:
        raise DihalError(f"{source}: bridge.steps_axis re-evaluates DiHAL at ℓ*, so methods.dihal must include 'chosen'")
    return checked
