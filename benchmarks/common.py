"""What every benchmark script shares: its standard flags, timing, the diagnostic suite's
settings, and the one-JSON-line report.

The scripts run as ``python benchmarks/NAME.py``, so this folder is on ``sys.path`` and
they import this module as ``common``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from dihal_bench.base.files import write_json_atomic
from dihal_bench.base.provenance import environment
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.config.suite import resolve_suite
from dihal_bench.hybrid.training import BridgeSpec
from dihal_bench.training.budget import Budget


def parser(docstring: str) -> argparse.ArgumentParser:
    """An argument parser described by the first paragraph of the script's docstring, with
    the flags every benchmark takes: --quick, --seed, --json."""
    parser = argparse.ArgumentParser(description=" ".join(docstring.split("\n\n")[0].split()))
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, a check that the script runs (well under a minute), not a measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the JSON report to PATH")
    return parser


def timed(fn: Callable, *args, **kwargs) -> tuple[object, float]:
    """``fn(*args, **kwargs)`` and its wall-clock seconds."""
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def median_seconds(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls, after one untimed call
    that pays for lazy initialisation and cold caches."""
    if warmup:
        fn()
    return statistics.median(timed(fn)[1] for _ in range(repeats))


def diagnostic_suite() -> SuiteConfig:
    """The resolved diagnostic suite: the budget, bridge and sampling settings a run uses."""
    return resolve_suite("diagnostic")[1]


def bridge_spec(suite: SuiteConfig, budget: Budget) -> BridgeSpec:
    """The suite's DiHAL bridge trained under ``budget``, as the runner builds it."""
    bridge = suite.bridge
    return BridgeSpec(name=bridge.name, options=dict(bridge.options), budget=budget,
                      sample_steps=bridge.sample_steps, sink_passthrough=bridge.sink_passthrough)


def verdict(value: float, limit: float) -> str:
    return "PASS" if value <= limit else "FAIL"


def report(name: str, figures: dict, settings: dict, json_path: Path | None) -> dict:
    """Print the final JSON line (figures, settings, environment) and write it to ``json_path``."""
    record = {"benchmark": name, "settings": settings, "figures": figures, "environment": environment()}
    print(json.dumps(record))
    if json_path is not None:
        write_json_atomic(json_path, record)
    return record
