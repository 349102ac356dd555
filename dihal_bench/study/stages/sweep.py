"""Stage 3: one bridge per swept layer under the sweep's fixed protocol."""

from __future__ import annotations

from pathlib import Path

from dihal_bench.hybrid.training import BridgeSpec, evaluate_layer
from dihal_bench.study.identities import eval_identity, targets_identity
from dihal_bench.study.run import Run

#: the sweep's bridgeability measures the geometry is tested against: each dimension standardised,
#: and in locate's ``trace`` metric, where the dimensions weigh as they do for the proxies
CORRELATION_TARGETS = ("bridge_mse", "bridge_mse_trace")

def sweep_layer(run: Run, spec: BridgeSpec, layer: int, data_layers: list[int], targets: dict) -> dict:
    """Train and evaluate the sweep's bridge for ``layer`` under the sweep's fixed protocol, on the
    seed's bridge targets (``targets``: the bridge-targets jobs' results by sequence length)."""
    config = run.config
    job = {**run.identity(), **spec.identity(run.backbone.width), "layer": layer,
           **eval_identity(config), **targets_identity(config)}

    def work(folder: Path) -> dict:
        bridge, stats = run.train_bridge(spec, layer, folder / "checkpoint", targets)
        valid = run.valid_states(spec.budget.seq_len, layer, data_layers)
        return {"layer": layer, **stats, **evaluate_layer(run.backbone, bridge, layer, spec, valid,
                                                          lm_windows=config.sweep.eval_sequences)}

    return run.store.run("sweep-layer", job, work)
