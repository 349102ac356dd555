"""Suites as data (DESIGN.md §4.5): a TOML file over these defaults, plus CLI overrides.

Every key a suite may set appears in DEFAULTS, so a typo in a suite file or in
``--set`` is an error that names the key, never a silently ignored setting.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from dihal_bench.errors import DihalError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: the three proxies of the DiHAL paper, combined as z(m_curv) + z(m_mono) − z(k_eff). Kept in this
#: torch-free module so that the CLI can show it as a default without importing models.
DIHAL_PROXIES = ("local_curvature", "global_monotonicity", "effective_rank")

DEFAULTS: dict = {
    "description": "",
    "backbone": "smollm2-135m",
    "corpus": "stdlib-docs",
    "evaluator": "gemma3-270m",
    "seeds": [0],
    "device": "cpu",
    "dtype": "float32",
    "device_map": "",
    "batch_size": 16,
    "locate": {
        "tokens": 4096,
        "seq_len": 128,
        "proxies": list(DIHAL_PROXIES),
        "preprocessing": "trace",
    },
    "sweep": {
        "layers": "auto",
        "count": 10,
        "eval_sequences": 64,
        "budget": {},
    },
    "budget": {},
    "bridge": {"name": "dihal-bridge", "options": {}, "sample_steps": 8, "sink_passthrough": True},
    "methods": {"dihal": ["chosen", "worst", "oracle"], "baselines": []},
    "sampling": {"samples": 64, "seq_len": 64, "batch_size": 16, "temperature": 1.0, "top_p": 1.0,
                 "diffusion_steps": 50},
    "metrics": {"names": ["gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity", "mauve"],
                "mauve": True, "latency_repeats": 3, "max_length": 1024},
}

#: sections whose contents are free-form (checked by the component that reads them)
OPEN_SECTIONS = {("budget",), ("sweep", "budget"), ("bridge", "options")}


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


def load_suite_file(path: Path) -> dict:
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DihalError(f"cannot read suite file {path}: {exc}") from None
    return _merge(DEFAULTS, data, (), str(path))


def resolve_suite(name_or_path: str) -> tuple[str, dict]:
    """A registered suite name or a path to a suite TOML file -> (name, config)."""
    from dihal_bench.plugins import get_registry

    registry = get_registry()
    if name_or_path in registry.items["suite"]:
        return name_or_path, load_suite_file(registry.get("suite", name_or_path).obj)
    if Path(name_or_path).is_file():
        return Path(name_or_path).stem, load_suite_file(Path(name_or_path))
    registry.get("suite", name_or_path)  # raises: unknown suite, listing the known ones
    raise AssertionError("unreachable")


def parse_value(text: str):
    """A ``--set`` value: TOML syntax when it parses (numbers, booleans, [lists]), else a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(config: dict, assignments: dict[str, str]) -> dict:
    """``{"budget.steps": "100", "sampling.samples": "8"}`` applied to a resolved suite."""
    update: dict = {}
    for dotted, text in assignments.items():
        node = update
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = parse_value(text)
    return _merge(config, update, (), "--set")
