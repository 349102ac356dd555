"""Locate (docs/method.md#locate): score every candidate layer by the geometry of its hidden
states and choose the insertion layer ℓ*.

N token hidden states per layer are sampled from as few validation sequences as hold them
(position 0 excluded), all layers from one forward pass per batch over those sequences
only; each layer is preprocessed, every configured proxy runs on it, and the z-scored
proxies combine into S(ℓ).

Beside that choice, from the same sampled states, locate reports what could be deciding
it instead of geometry: the ``depth`` reference proxy (shallower is better), S(ℓ) and ℓ*
under other preprocessings, and how much of each layer's variance sits in one channel.
``dihal_bench.hybrid.sweep.layer_correlations`` then tests all of them against the sweep's bridgeability.
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.corpus import Corpus, pack, tokenize_documents
from dihal_bench.base.files import (
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)
from dihal_bench.base.provenance import environment
from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.locate.defaults import DIHAL_PROXIES
from dihal_bench.locate.geometry import (
    DROP_TOP_DEFAULT,
    PREPROCESSING_MODES,
    channel_shares,
    check_drop_top,
    check_proxy_setup,
    choose_layer,
    depth_spearman,
    evaluate_proxies,
    layer_scores,
    zscore,
)
from dihal_bench.locate.hidden_states import extract_sampled, sample_positions
from dihal_bench.registry.plugins import get_registry

#: proxies locate always measures, as reference columns: part of S(ℓ) only where selected
REFERENCE_PROXIES = ("depth",)
#: preprocessings whose S(ℓ) and ℓ* locate reports beside the configured one
VARIANTS = ("trace", "standardize", "trace-drop-top")


@dataclass
class LocateConfig:
    tokens: int = 4096
    seq_len: int = 128
    seed: int = 0
    proxies: tuple[str, ...] = DIHAL_PROXIES
    preprocessing: str = "trace"
    weights: dict[str, float] = field(default_factory=dict)
    params: dict[str, dict] = field(default_factory=dict)
    batch_size: int = 8
    #: validation sequences the N tokens are drawn from; None: the fewest that hold them
    #: (⌈N / (seq_len−1)⌉), which keeps the forward passes to what N needs
    sequences: int | None = None
    #: preprocessings whose S(ℓ) and ℓ* are reported beside the configured one (which
    #: alone sets ℓ*), computed from the same sampled states
    variants: tuple[str, ...] = VARIANTS
    #: k of ``trace-drop-top``: the channels of largest variance each layer loses
    drop_top: int = DROP_TOP_DEFAULT


def resolve_proxies(names) -> dict:
    """Proxy names -> {name: (fn, higher_is_better)}; ``all`` means every registered proxy
    except the references (``depth``), which measure no geometry and enter the score only
    when named."""
    registry = get_registry()
    if list(names) == ["all"]:
        names = [name for name in registry.names("proxy") if name not in REFERENCE_PROXIES]
    resolved = {}
    for name in names:
        reg = registry.get("proxy", name)
        resolved[name] = (reg.obj, reg.meta["higher_is_better"])  # required by the proxy contract
    return resolved


def proxy_origin(name: str) -> str:
    """Which plugin registered proxy ``name``, and from which distribution, for messages."""
    reg = get_registry().get("proxy", name)
    if reg.distribution is None:
        return f"plugin {reg.plugin}, not installed"
    return f"plugin {reg.plugin} from {reg.distribution} {reg.version}"


def check_variants(variants) -> tuple[str, ...]:
    """The preprocessing variants as a tuple of known, distinct modes."""
    variants = tuple(variants)
    for mode in variants:
        if mode not in PREPROCESSING_MODES:
            raise unknown_name("preprocessing variant", mode, PREPROCESSING_MODES)
    if len(set(variants)) != len(variants):
        raise DihalError(f"preprocessing variants name one twice: {', '.join(variants)}")
    return variants


def locate(backbone: Backbone, corpus: Corpus, config: LocateConfig, progress: bool = True) -> dict:
    """Run locate; returns the JSON-able record (config, per-layer values, scores, ℓ*, the
    preprocessing variants, the top-channel shares)."""
    if backbone.num_layers < 3:
        raise DihalError(f"{backbone.name} has {backbone.num_layers} layers; locate needs at least 3")
    selected, measured = measured_proxies(config)
    variants = check_variants(config.variants)
    check_drop_top(config.drop_top, backbone.width)
    for mode in {config.preprocessing, *variants}:  # fail before the slow part
        check_proxy_setup(measured, config.params, mode, config.seed, config.tokens, config.drop_top)
    sequences = pack(tokenize_documents(corpus.split("validation"), backbone.tokenizer), config.seq_len,
                     split_name="validation")
    positions = sample_positions(len(sequences), config.seq_len, config.tokens, config.seed, config.sequences)

    started = time.perf_counter()
    states = extract_sampled(backbone, sequences, positions, config.batch_size, progress)
    extract_seconds = time.perf_counter() - started

    candidates = range(1, backbone.num_layers)  # the hybrid keeps at least one upper layer
    hidden = {layer: states[layer] for layer in candidates}
    geometry, by_variant, timings = layer_geometry(hidden, config, selected, measured, variants, progress)
    layers = geometry["layers"]
    scores = score_proxies(geometry, selected, config.weights)
    shares = channel_shares(hidden)
    return {
        "kind": "locate",
        "backbone": backbone.describe(),
        "corpus": corpus.name,
        "config": {**asdict(config), "proxies": list(selected), "variants": list(variants)},
        "tokens_sampled": len(positions),
        "sequences_available": len(sequences),
        "sequences_read": len(positions[:, 0].unique()),
        "layers": layers,
        "preprocessing": geometry["preprocessing"],
        **{key: geometry[key] for key in ("drop_top", "dropped_channels") if key in geometry},
        "proxies": geometry["proxies"],
        "score": scores.tolist(),
        "chosen_layer": choose_layer(layers, scores),
        "depth_spearman": depth_spearman(layers, scores),
        "variants": by_variant,
        "top_channel_share": shares["top_channel_share"],
        "top_channel": shares["top_channel"],
        "timings": {"extract_seconds": extract_seconds, **timings},
        "environment": environment(),
    }


def layer_geometry(hidden: dict, config: LocateConfig, selected: dict, measured: dict,
                   variants: tuple[str, ...], progress: bool = False) -> tuple[dict, dict, dict]:
    """The proxies' part of locate on the sampled states ``hidden`` (by layer): every ``measured``
    proxy under the configured preprocessing, each variant's S(l) from the ``selected`` ones, and
    the seconds each took (``proxy_seconds``, ``variant_seconds``). Each layer costs the same, so
    the calibration times this on one layer."""
    origins = {name: proxy_origin(name) for name in measured}

    def evaluate(proxies: dict, mode: str) -> dict:
        return evaluate_proxies(hidden, proxies, config.params, mode, config.seed, progress, origins, config.drop_top)

    started = time.perf_counter()
    geometry = evaluate(measured, config.preprocessing)
    proxy_seconds = time.perf_counter() - started
    started = time.perf_counter()
    by_variant = {mode: variant_entry(geometry if mode == config.preprocessing else evaluate(selected, mode),
                                      selected, config.weights)
                  for mode in variants}
    return geometry, by_variant, {"proxy_seconds": proxy_seconds, "variant_seconds": time.perf_counter() - started}


def measured_proxies(config: LocateConfig) -> tuple[dict, dict]:
    """(the proxies ``config`` selects, every proxy locate measures: those and the references)."""
    selected = resolve_proxies(config.proxies)
    return selected, {**selected, **{name: spec for name, spec in resolve_proxies(REFERENCE_PROXIES).items()
                                     if name not in selected}}


def score_proxies(geometry: dict, selected: dict, weights: dict[str, float]) -> np.ndarray:
    """S(ℓ) from the ``selected`` proxies of an :func:`evaluate_proxies` record, whose entries
    gain ``z``, ``weight`` and ``in_score``. A measured proxy outside the selection (a
    reference) gets weight 0, so that S = Σ weight · sign · z over every entry."""
    entries = geometry["proxies"]
    raw = {name: entries[name]["values"] for name in selected}
    scores, z = layer_scores(raw, {name: better for name, (_, better) in selected.items()}, weights)
    for name, entry in entries.items():
        in_score = name in selected
        entry["z"] = (z[name] if in_score else zscore(entry["values"])).tolist()
        entry["weight"] = weights.get(name, 1.0) if in_score else 0.0
        entry["in_score"] = in_score
    return scores


def variant_entry(record: dict, selected: dict, weights: dict[str, float]) -> dict:
    """One preprocessing variant: its S(ℓ) from the ``selected`` proxies, its ℓ*, how S
    agrees with depth (:func:`~dihal_bench.locate.geometry.depth_spearman`) and the raw values."""
    layers = record["layers"]
    raw = {name: record["proxies"][name]["values"] for name in selected}
    scores, _ = layer_scores(raw, {name: better for name, (_, better) in selected.items()}, weights)
    entry = {"score": scores.tolist(), "chosen_layer": choose_layer(layers, scores),
             "depth_spearman": depth_spearman(layers, scores), "values": raw}
    return entry | {key: record[key] for key in ("drop_top", "dropped_channels") if key in record}


def variant_label(name: str, entry: dict) -> str:
    """A variant's name as shown: ``trace-drop-top`` carries its k."""
    return f"{name}(k={entry['drop_top']})" if "drop_top" in entry else name


def shown_variants(result: dict) -> dict[str, dict]:
    """The variants other than the configured preprocessing, whose S(ℓ) is ``score`` already
    (records written before variants existed have none)."""
    return {name: entry for name, entry in (result.get("variants") or {}).items()
            if name != result["preprocessing"]}


def table_rows(result: dict) -> tuple[list[str], list[list]]:
    """One row per layer: each proxy's raw value and z-score (``depth`` too), the score, the
    other preprocessings' scores, the top channel's share of the variance and its index,
    a ★ on ℓ*, and which other preprocessings would choose the layer."""
    names = list(result["proxies"])
    variants = shown_variants(result)
    shares = result.get("top_channel_share")
    headers = (["layer"] + [h for n in names for h in (n, f"z({n})")] + ["score"]
               + [f"score[{variant_label(name, entry)}]" for name, entry in variants.items()]
               + (["top share", "top channel"] if shares else []) + ["ℓ*"]
               + (["ℓ* under"] if variants else []))
    rows = []
    for i, layer in enumerate(result["layers"]):
        row = [layer]
        for name in names:
            entry = result["proxies"][name]
            row += [entry["values"][i], entry["z"][i]]
        row += [result["score"][i]] + [entry["score"][i] for entry in variants.values()]
        if shares:
            row += [shares[i], result["top_channel"][i]]
        row.append("★" if layer == result["chosen_layer"] else "")
        if variants:
            row.append(" ".join(variant_label(name, entry) for name, entry in variants.items()
                                if entry["chosen_layer"] == layer))
        rows.append(row)
    return headers, rows


def format_table(result: dict) -> str:
    from tabulate import tabulate

    headers, rows = table_rows(result)
    return tabulate(rows, headers=headers, floatfmt=".4g")


def summary_lines(result: dict) -> list[str]:
    """What decides ℓ*, in two lines: ℓ* and S's agreement with depth under each
    preprocessing, and the largest top-channel share."""
    def agreement(value) -> str:
        return "n/a" if value is None else f"{value:+.2f}"

    variants = result.get("variants") or {}
    main = f"{result['preprocessing']} {result['chosen_layer']} (ρ {agreement(result.get('depth_spearman'))})"
    others = [f"{variant_label(name, entry)} {entry['chosen_layer']} (ρ {agreement(entry['depth_spearman'])})"
              for name, entry in shown_variants(result).items()]
    lines = []
    if variants:
        lines.append(f"ℓ* by preprocessing: {', '.join([main, *others])}; ρ = Spearman of S(ℓ) with depth "
                     "(+1: S ranks shallower layers first)")
    shares = result.get("top_channel_share")
    if shares:
        top = max(range(len(shares)), key=lambda i: (shares[i], -i))
        chosen = result["layers"].index(result["chosen_layer"])
        lines.append(f"top channel: {shares[top]:.0%} of the variance in channel {result['top_channel'][top]} "
                     f"at layer {result['layers'][top]} (largest share; 1/d = {1 / result['backbone']['width']:.2%}); "
                     f"{shares[chosen]:.0%} (channel {result['top_channel'][chosen]}) at ℓ* = {result['chosen_layer']}")
    return lines


def write_outputs(result: dict, out_dir: Path) -> list[Path]:
    """locate.json, locate.csv and locate.png in ``out_dir``, each written atomically, all
    rendered before any is written so that a failure leaves no partial set."""
    out_dir = Path(out_dir)
    headers, rows = table_rows(result)
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(headers)
    writer.writerows(rows)
    png = render_plot(result)
    paths = [out_dir / "locate.json", out_dir / "locate.csv", out_dir / "locate.png"]
    write_json_atomic(paths[0], result)
    write_text_atomic(paths[1], buffer.getvalue())
    write_bytes_atomic(paths[2], png)
    return paths


def render_plot(result: dict) -> bytes:
    """Two panels over the layers: the proxies' z-scores (``depth`` dotted), S(ℓ) and ℓ*;
    then S(ℓ) under each preprocessing with its ℓ*, and the top channel's share of the
    variance on a second axis."""
    layers = result["layers"]
    variants = result.get("variants") or {result["preprocessing"]: {"score": result["score"],
                                                                    "chosen_layer": result["chosen_layer"]}}
    shares = result.get("top_channel_share")

    def draw(axes):
        top, bottom = axes
        for name, entry in result["proxies"].items():
            sign = "+" if entry["higher_is_better"] else "−"
            reference = "" if entry.get("in_score", True) else ", not in S"
            top.plot(layers, entry["z"], marker=".", linewidth=1, linestyle="-" if not reference else ":",
                     label=f"z({name}) [{sign}{reference}]")
        top.plot(layers, result["score"], color="black", linewidth=2.2, label="score S(ℓ)")
        top.axvline(result["chosen_layer"], color="crimson", linestyle="--", label=f"ℓ* = {result['chosen_layer']}")
        top.set_ylabel("z-score across layers")
        top.set_title(f"{result['backbone']['name']} on {result['corpus']}: geometry proxies "
                      f"(N={result['tokens_sampled']}, {result['preprocessing']} preprocessing)")
        top.legend(fontsize=7, loc="best")

        for name, entry in variants.items():
            main = name == result["preprocessing"]
            (line,) = bottom.plot(layers, entry["score"], linewidth=2.2 if main else 1.2,
                                  label=f"S(ℓ) under {variant_label(name, entry)}: ℓ* = {entry['chosen_layer']}"
                                        + (" (the choice)" if main else ""))
            best = layers.index(entry["chosen_layer"])
            bottom.plot([entry["chosen_layer"]], [entry["score"][best]], marker="*", markersize=12,
                        color=line.get_color(), linestyle="none")
        bottom.set_xlabel("layer ℓ")
        bottom.set_ylabel("score S(ℓ)")
        handles, labels = bottom.get_legend_handles_labels()
        if shares:
            right = bottom.twinx()
            right.fill_between(layers, shares, step="mid", color="grey", alpha=0.25)
            (share_line,) = right.step(layers, shares, where="mid", color="grey",
                                       label="top channel's share of the variance (right)")
            right.set_ylim(0, 1)
            right.set_ylabel("top-channel share")
            handles, labels = handles + [share_line], labels + [share_line.get_label()]
        bottom.legend(handles, labels, fontsize=7, loc="best")

    return figure_png(draw, panels=2)


def figure_png(draw, panels: int = 1) -> bytes:
    """A PNG of matplotlib axes drawn by ``draw`` (rendered off-screen, in memory):
    ``draw(ax)`` for one panel, ``draw(axes)`` with ``panels`` stacked axes sharing x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(panels, 1, figsize=(8, 4.5 * panels), sharex=True, squeeze=False)
    axes = list(axes[:, 0])
    try:
        draw(axes[0] if panels == 1 else axes)
        for ax in axes:
            ax.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buffer.getvalue()
