"""The bridgeability sweep (DESIGN.md §4.2): one bridge per candidate layer under one fixed
training protocol, then how well each reconstructs h_ℓ and how good its hybrid LM is, and
how well the geometry score predicted that.

Bridge targets for every swept layer come from one forward pass per batch over the
training split (``extract_layers``), not one pass per layer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from dihal_bench.backbone import Backbone
from dihal_bench.bridge import HiddenStateBridge, training_loss
from dihal_bench.budget import Budget
from dihal_bench.corpus import Corpus, pack, tokenize_documents
from dihal_bench.errors import DihalError
from dihal_bench.evaluation import bridge_reconstruction, kl_to_backbone, teacher_forced_nll
from dihal_bench.hidden import extract_layers
from dihal_bench.hybrid import HybridLM, skip_control
from dihal_bench.plugins import get_registry
from dihal_bench.training import count_trainable, train


@dataclass
class BridgeSpec:
    """Which bridge plugin, with which options, trained under which budget."""

    name: str = "dihal-bridge"
    options: dict = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    sample_steps: int | None = None  # None: the bridge's own default
    sink_passthrough: bool = True

    def build(self, width: int) -> HiddenStateBridge:
        return get_registry().get("bridge", self.name).obj(width, **self.options)

    def parameter_count(self, width: int) -> int:
        return count_trainable(self.build(width))

    def identity(self, width: int) -> dict:
        """What a trained bridge depends on, for job hashes. The parameter count stands in for
        the architecture, so that a changed bridge implementation does not reuse stale jobs."""
        return {"bridge": self.name, "options": self.options, "budget": self.budget.to_dict(),
                "sample_steps": self.sample_steps, "sink_passthrough": self.sink_passthrough,
                "bridge_parameters": self.parameter_count(width)}


def auto_layers(num_layers: int, chosen: int, count: int = 10) -> list[int]:
    """About ``count`` candidate layers spread evenly over 1..L-1, always including ℓ*."""
    top = num_layers - 1
    if top <= count:
        return list(range(1, top + 1))
    spread = {round(1 + i * (top - 1) / (count - 1)) for i in range(count)}
    return sorted(spread | {chosen})


def check_layers(backbone: Backbone, layers: list[int]) -> list[int]:
    if not layers:
        raise DihalError("no layers to sweep")
    return sorted({backbone.check_layer(layer) for layer in layers})


@dataclass
class SplitTensors:
    """Packed token sequences of one split and their hidden states at the needed layers."""

    sequences: torch.Tensor
    states: dict[int, torch.Tensor]

    @property
    def mask(self) -> torch.Tensor:
        mask = torch.ones(self.sequences.shape, dtype=torch.bool)
        mask[:, 0] = False  # the attention sink: computed exactly by the hybrid, never learned
        return mask

    def head(self, count: int) -> "SplitTensors":
        return SplitTensors(self.sequences[:count], {layer: s[:count] for layer, s in self.states.items()})


def packed_split(backbone: Backbone, corpus: Corpus, split: str, seq_len: int) -> torch.Tensor:
    return pack(tokenize_documents(corpus.split(split), backbone.tokenizer), seq_len, split_name=split)


def distinct_sequences(budget: Budget) -> int:
    """How many different training sequences a budget draws (it repeats them ``epochs`` times)."""
    return -(-budget.sequences_needed // budget.epochs)


def training_subset(sequences: torch.Tensor, budgets: list[Budget], seed: int) -> torch.Tensor:
    """The training sequences the budgets draw from: a seeded random subset large enough for
    the largest of them. Every budget trains on a prefix of it, so methods share their data
    and one hidden-state extraction serves them all."""
    for budget in budgets:
        budget.check_fits(len(sequences))
    count = min(len(sequences), max(distinct_sequences(b) for b in budgets))
    order = torch.randperm(len(sequences), generator=torch.Generator().manual_seed(seed))
    return sequences[order[:count]]


def with_states(backbone: Backbone, sequences: torch.Tensor, layers: list[int], progress: bool = True) -> SplitTensors:
    """The sequences with their hidden states at ``layers`` and at 0 (the bridge's condition)."""
    return SplitTensors(sequences, extract_layers(backbone, sequences, sorted({0, *layers}), progress=progress))


def train_bridge(backbone: Backbone, spec: BridgeSpec, layer: int, train_data: SplitTensors,
                 checkpoint_dir: Path | None = None, progress: bool = True) -> tuple[HiddenStateBridge, dict]:
    """Fit the standardiser and train one bridge for ``layer``; returns it and its training stats."""
    mask = train_data.mask
    cond, target = train_data.states[0], train_data.states[layer]
    torch.manual_seed(spec.budget.seed)  # the same initial weights for every layer of a sweep
    bridge = spec.build(backbone.width)
    bridge.fit_standardizer(cond, target, mask)
    result = train(bridge, training_loss, {"cond": cond, "target": target, "mask": mask}, spec.budget,
                   checkpoint_dir=checkpoint_dir, progress=progress, desc=f"bridge ℓ={layer}")
    return bridge, {
        "parameters": count_trainable(bridge),
        "steps": result.steps_done,
        "tokens_seen": result.tokens_seen,
        "train_seconds": result.wall_seconds,
        "final_loss": sum(result.losses[-10:]) / len(result.losses[-10:]),
    }


def evaluate_layer(backbone: Backbone, bridge: HiddenStateBridge, layer: int, spec: BridgeSpec,
                   valid: SplitTensors, batch_size: int = 16) -> dict:
    """Bridgeability (standardised MSE, R²) and the hybrid's perplexity and KL on validation."""
    recon = bridge_reconstruction(bridge, valid.states[0], valid.states[layer], valid.mask,
                                  spec.sample_steps, batch_size)
    hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=spec.sink_passthrough, steps=spec.sample_steps)
    return {
        "bridge_mse": recon["mse"],
        "bridge_r2": recon["r2"],
        "hybrid_ppl": teacher_forced_nll(hybrid.logits, valid.sequences, batch_size)["ppl"],
        "kl_to_backbone": kl_to_backbone(backbone, hybrid, valid.sequences, batch_size),
        "skip_ppl": teacher_forced_nll(skip_control(backbone, layer).logits, valid.sequences, batch_size)["ppl"],
    }


def layer_correlations(located: dict, rows: list[dict], seed: int) -> dict:
    """Spearman ρ and Kendall τ (bootstrap 95% CI) of the score and each proxy against
    −(bridge validation MSE), over the swept layers (DESIGN.md §4.4)."""
    from dihal_builtin.metrics import rank_correlations

    index = {layer: i for i, layer in enumerate(located["layers"])}
    swept = [row for row in rows if row["layer"] in index]
    if len(swept) < 3:
        return {"warning": f"rank correlations need at least 3 swept layers, got {len(swept)}"}
    negative_mse = [-row["bridge_mse"] for row in swept]
    series = {"score": [located["score"][index[row["layer"]]] for row in swept]}
    for name, entry in located["proxies"].items():
        sign = 1 if entry["higher_is_better"] else -1
        series[name] = [sign * entry["values"][index[row["layer"]]] for row in swept]
    return {name: rank_correlations(values, negative_mse, seed=seed) for name, values in series.items()}


def run_sweep(backbone: Backbone, corpus: Corpus, layers: list[int], spec: BridgeSpec, *,
              eval_sequences: int = 64, work_dir: Path | None = None, progress: bool = True,
              keep_bridges: bool = False) -> dict:
    """Train and evaluate one bridge per layer; returns the per-layer table and timings
    (and the trained bridges under ``"bridges"`` when ``keep_bridges``)."""
    layers = check_layers(backbone, layers)
    seq_len = spec.budget.seq_len
    started = time.perf_counter()
    train_sequences = training_subset(packed_split(backbone, corpus, "train", seq_len), [spec.budget], spec.budget.seed)
    train_data = with_states(backbone, train_sequences, layers, progress)
    valid = with_states(backbone, packed_split(backbone, corpus, "validation", seq_len)[:eval_sequences], layers, progress)
    extract_seconds = time.perf_counter() - started

    rows, bridges = [], {}
    for layer in layers:
        checkpoint = None if work_dir is None else Path(work_dir) / f"bridge-layer{layer}"
        bridge, stats = train_bridge(backbone, spec, layer, train_data, checkpoint, progress)
        rows.append({"layer": layer, **stats, **evaluate_layer(backbone, bridge, layer, spec, valid)})
        if keep_bridges:
            bridges[layer] = bridge
    return {
        **({"bridges": bridges} if keep_bridges else {}),
        "layers": rows,
        "backbone_ppl": teacher_forced_nll(backbone.logits, valid.sequences, 16)["ppl"],
        "train_sequences": len(train_data.sequences),
        "eval_sequences": len(valid.sequences),
        "extract_seconds": extract_seconds,
    }


SWEEP_COLUMNS = ["layer", "score", "bridge_mse", "bridge_r2", "hybrid_ppl", "kl_to_backbone", "skip_ppl",
                 "train_seconds"]


def sweep_table(result: dict) -> list[dict]:
    """The layer table: each swept layer's geometry score (from locate) beside its bridgeability."""
    located = result["locate"]
    score = dict(zip(located["layers"], located["score"]))
    return [{"layer": row["layer"], "score": score.get(row["layer"]),
             **{key: row[key] for key in SWEEP_COLUMNS[2:]}} for row in result["layers"]]


def format_sweep(result: dict) -> str:
    from tabulate import tabulate

    lines = [tabulate(sweep_table(result), headers="keys", floatfmt=".4g"),
             f"backbone validation PPL {result['backbone_ppl']:.2f}; ℓ* = {result['locate']['chosen_layer']}"]
    for name, corr in result["correlations"].items():
        if name == "warning":
            lines.append(f"rank correlations: {corr}")
        else:
            lines.append(f"{name:>22}: Spearman ρ {corr['spearman']:+.2f} [{corr['spearman_low']:+.2f}, "
                         f"{corr['spearman_high']:+.2f}], Kendall τ {corr['kendall']:+.2f} "
                         f"[{corr['kendall_low']:+.2f}, {corr['kendall_high']:+.2f}] vs −(bridge MSE)")
    return "\n".join(lines)


def write_sweep_outputs(result: dict, out_dir: Path) -> list[Path]:
    """sweep.json, sweep.csv and sweep.png (score vs bridge MSE), rendered first, then written atomically."""
    import pandas as pd

    from dihal_bench.locate import figure_png
    from dihal_bench.records import write_bytes_atomic, write_json_atomic, write_text_atomic

    table = sweep_table(result)
    csv_text = pd.DataFrame(table).to_csv(index=False)

    def draw(ax):
        ax.scatter([r["score"] for r in table], [r["bridge_mse"] for r in table], color="tab:blue")
        for r in table:
            ax.annotate(f"ℓ={r['layer']}", (r["score"], r["bridge_mse"]), textcoords="offset points", xytext=(4, 4))
        ax.set_xlabel("geometry score S(ℓ)")
        ax.set_ylabel("bridge validation MSE (standardised)")
        ax.set_title(f"{result['backbone']}: does the geometry score predict bridgeability?")

    png = figure_png(draw)
    paths = [Path(out_dir) / name for name in ("sweep.json", "sweep.csv", "sweep.png")]
    write_json_atomic(paths[0], result)
    write_text_atomic(paths[1], csv_text)
    write_bytes_atomic(paths[2], png)
    return paths
