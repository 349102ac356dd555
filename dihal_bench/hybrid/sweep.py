"""The bridgeability sweep (docs/method.md#bridge): one bridge per candidate layer under one fixed
training protocol, then how well each reconstructs h_ℓ and how good its hybrid LM is, and
how well the geometry score predicted that. How one bridge is trained and measured is
``dihal_bench.hybrid.training``; the rank statistics are ``dihal_bench.numerics.stats``.

Bridge targets for every swept layer come from one forward pass per batch over the
training split (``extract_layers``), not one pass per layer, and that pass stops at the
deepest swept layer.
"""

from __future__ import annotations

import time
from pathlib import Path

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.corpus import Corpus
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import teacher_forced_nll
from dihal_bench.hybrid.training import (
    BridgeSpec,
    bridge_windows,
    evaluate_layer,
    packed_split,
    train_bridge,
    train_bridge_streamed,
    training_subset,
    validation_subset,
    with_states,
)
from dihal_bench.locate.series import located_series
from dihal_bench.numerics.stats import partial_spearman, rank_correlations


def check_layers(backbone: Backbone, layers: list[int]) -> list[int]:
    if not layers:
        raise DihalError("no layers to sweep")
    return sorted({backbone.check_layer(layer) for layer in layers})


def layer_correlations(located: dict, rows: list[dict], seed: int, target: str = "bridge_mse") -> dict:
    """How well the geometry ranked the swept layers by bridgeability, against the depth
    reference (docs/method.md#locate).

    Over the swept layers that locate scored, for S(ℓ), each recorded proxy (signed so that
    higher is better), each other preprocessing's S(ℓ) (``score[<mode>]``) and ``depth``
    (−ℓ): :func:`~dihal_bench.numerics.stats.rank_correlations` with −``target`` (Spearman ρ and Kendall
    τ, bootstrap 95% CIs, permutation p-values) and ``partial_spearman_given_depth``, ρ with
    the layer index held fixed: what a series knows about bridgeability beyond "shallower
    is better" (None for depth itself). ``target`` is ``bridge_mse`` (each dimension
    standardised) or ``bridge_mse_trace`` (the proxies' own ``trace`` metric).

    Returns ``{series: statistics}``, or ``{"warning": ...}`` with fewer than 3 swept layers.
    """
    scored = set(located["layers"])
    swept = sorted((row for row in rows if row["layer"] in scored), key=lambda row: row["layer"])
    if len(swept) < 3:
        return {"warning": f"rank correlations need at least 3 swept layers, got {len(swept)}"}
    layers = [row["layer"] for row in swept]
    series = located_series(located, layers)
    negative = [-row[target] for row in swept]
    return {name: {**rank_correlations(values, negative, seed=seed),
                   "partial_spearman_given_depth": partial_spearman(values, negative, layers)}
            for name, values in series.items()}


def run_sweep(backbone: Backbone, corpus: Corpus, layers: list[int], spec: BridgeSpec, *,
              eval_sequences: int | str = 64, work_dir: Path | None = None, progress: bool = True,
              keep_bridges: bool = False, stream_targets: bool = False) -> dict:
    """Train and evaluate one bridge per layer; returns the per-layer table and timings
    (and the trained bridges under ``"bridges"`` when ``keep_bridges``). With
    ``stream_targets`` the training states are computed per batch, never stored
    (``bridge_training.StreamedStates``) and the validation states one layer at a time, from
    a pass that stops at that layer: memory bounded by the batch and one layer's validation
    states, for backbones whose states of the whole training subset do not fit."""
    layers = check_layers(backbone, layers)
    seq_len = spec.budget.seq_len
    started = time.perf_counter()
    train_sequences = training_subset(packed_split(backbone, corpus, "train", seq_len), [spec.budget], spec.budget.seed)
    # bridgeability on every validation window, the language-model measures on a seeded subset
    valid_sequences = packed_split(backbone, corpus, "validation", seq_len)
    # streamed: only the bridge's token windows are held, and the validation states of one layer
    # at a time; stored: the states of both splits at every swept layer, from one pass
    if stream_targets:
        windows = bridge_windows(backbone, train_sequences)
    else:
        train_data = with_states(backbone, train_sequences, layers, progress)
        valid = with_states(backbone, valid_sequences, layers, progress)
    extract_seconds = time.perf_counter() - started

    scored_windows = validation_subset(bridge_windows(backbone, valid_sequences), eval_sequences)
    rows, bridges = [], {}
    for layer in layers:
        checkpoint = None if work_dir is None else Path(work_dir) / f"bridge-layer{layer}"
        if stream_targets:
            started = time.perf_counter()
            valid = with_states(backbone, valid_sequences, [layer], progress)
            extract_seconds += time.perf_counter() - started
            bridge, stats = train_bridge_streamed(backbone, spec, layer, windows, checkpoint, progress)
        else:
            bridge, stats = train_bridge(backbone, spec, layer, train_data, checkpoint, progress)
        rows.append({"layer": layer, **stats,
                     **evaluate_layer(backbone, bridge, layer, spec, valid, lm_windows=eval_sequences)})
        if keep_bridges:
            bridges[layer] = bridge
    return {
        **({"bridges": bridges} if keep_bridges else {}),
        "layers": rows,
        "backbone_ppl": teacher_forced_nll(backbone.logits, scored_windows, 16)["ppl"],
        "train_sequences": len(train_sequences),
        "eval_sequences": len(scored_windows),
        "bridgeability_sequences": len(valid.sequences),
        "extract_seconds": extract_seconds,
    }


SWEEP_COLUMNS = ["layer", "score", "bridge_mse", "bridge_mse_trace", "bridge_r2", "hybrid_ppl", "kl_to_backbone",
                 "skip_ppl", "train_seconds"]


def sweep_table(result: dict) -> list[dict]:
    """The layer table: each swept layer's geometry score (from locate) beside its bridgeability."""
    located = result["locate"]
    score = dict(zip(located["layers"], located["score"]))
    return [{"layer": row["layer"], "score": score.get(row["layer"]),
             **{key: row.get(key) for key in SWEEP_COLUMNS[2:]}} for row in result["layers"]]


def format_sweep(result: dict) -> str:
    from tabulate import tabulate

    lines = [tabulate(sweep_table(result), headers="keys", floatfmt=".4g"),
             f"backbone validation PPL {result['backbone_ppl']:.2f}; ℓ* = {result['locate']['chosen_layer']}"]
    for key, target in (("correlations", "bridge MSE"), ("correlations_trace", "bridge MSE, trace metric")):
        lines += correlation_lines(result.get(key) or {}, target)
    return "\n".join(lines)


def correlation_lines(correlations: dict, target: str) -> list[str]:
    """One line per series of :func:`layer_correlations`: ρ and τ with their CIs and
    permutation p-values, and the partial ρ given depth."""
    def shown(value, form="+.2f") -> str:
        return "n/a" if value is None else format(value, form)

    if "warning" in correlations:
        return [f"rank correlations vs −({target}): {correlations['warning']}"]
    lines = [f"rank correlations vs −({target}), over the swept layers:"]
    for name, c in correlations.items():
        lines.append(f"{name:>28}: ρ {shown(c['spearman'])} [{shown(c['spearman_low'])}, {shown(c['spearman_high'])}]"
                     f" p={shown(c['spearman_p'], '.3g')}, τ {shown(c['kendall'])} p={shown(c['kendall_p'], '.3g')},"
                     f" partial ρ given depth {shown(c['partial_spearman_given_depth'])}")
    return lines


def write_sweep_outputs(result: dict, out_dir: Path) -> list[Path]:
    """sweep.json, sweep.csv and sweep.png (score vs bridge MSE), rendered first, then written atomically."""
    import pandas as pd

    from dihal_bench.base.files import (
        write_bytes_atomic,
        write_json_atomic,
        write_text_atomic,
    )
    from dihal_bench.locate.pipeline import figure_png

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
