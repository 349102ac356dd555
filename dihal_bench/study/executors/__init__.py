"""Where a run's units of work execute (docs/executors.md).

:func:`dihal_bench.study.runner.study_seeds` hands each stage (locate, the bridge targets, the sweep,
the methods, the steps axis, the metrics, latency) to an executor as one list of items, every seed's,
that do not depend on each other; the executor returns their results in item order. The local executor
does them one after the other in this process; the Ray executor (``ray.py``, extra ``[ray]``)
spreads them over Ray actors, on one machine or a cluster.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from dihal_bench.errors import DihalError
from dihal_bench.study.executors.base import Executor, Item
from dihal_bench.study.executors.local import LocalExecutor

#: the executors ``dihal-bench run --executor`` takes
EXECUTORS = ("local", "ray")

__all__ = ["EXECUTORS", "Executor", "Item", "LocalExecutor", "make_executor"]


def make_executor(name: str = "local", *, address: str | None = None, workers: int | None = None) -> Executor:
    """The executor called ``name``; ``address`` (a Ray cluster to join) and ``workers`` (how many
    actors) are the Ray executor's. Raises DihalError, before any work, when Ray is missing."""
    if name == "local":
        if address or workers:
            raise DihalError("--address and --workers are options of --executor ray")
        return LocalExecutor()
    if name != "ray":
        raise DihalError(f"unknown executor {name!r}; known: {', '.join(EXECUTORS)}")
    # found without importing it (seconds): a dead --address is refused before that cost
    if not _ray_installed():
        raise DihalError("--executor ray needs Ray: pip install 'dihal-bench[ray]'")
    from dihal_bench.study.preflight import check_ray_address

    check_ray_address(address or os.environ.get("RAY_ADDRESS"))
    from dihal_bench.study.executors.ray import RayExecutor

    return RayExecutor(address=address, workers=workers)


def _ray_installed() -> bool:
    """Whether ``import ray`` would find Ray (a None in sys.modules blocks an import)."""
    if "ray" in sys.modules:
        return sys.modules["ray"] is not None
    return importlib.util.find_spec("ray") is not None
