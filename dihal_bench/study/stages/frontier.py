"""Stage 7: quality frontiers (docs/method.md#frontiers): a scale-1 row resampled at another temperature
or number of diffusion steps, scored by the suite's metrics.

A point is the row under the suite with that one ``[sampling]`` setting changed: its samples and metrics
are the very jobs such a suite would make for the row, and its training is the row's own, found done.
"""

from __future__ import annotations

from dihal_bench.hybrid.training import BridgeSpec
from dihal_bench.study.plan import FrontierPoint
from dihal_bench.study.run import Run
from dihal_bench.study.stages.methods import method_row
from dihal_bench.study.stages.metrics import metrics_unit
from dihal_bench.training.budget import Budget


def frontier_point(run: Run, point: FrontierPoint, roles: dict, spec: BridgeSpec, budget: Budget, seed: int,
                   data_layers: list[int], targets: dict, references: list[str]) -> dict:
    """The record's entry of one frontier point: the row, the setting, its samples and its metrics."""
    key, value = point.setting
    variant = run.with_sampling(**{key: value})
    method = method_row(variant, point.kind, point.name, roles, spec, budget, seed, data_layers, targets)
    return {"method": point.label, key: value, "samples": method["samples"], "samples_job": method["samples_job"],
            "metrics": metrics_unit(variant, point.label, method, references, seed)}
