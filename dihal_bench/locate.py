"""Locate (docs/method.md#locate): score every candidate layer by the geometry of its hidden
states and choose the insertion layer ℓ*.

N token hidden states per layer are sampled from as few validation sequences as hold them
(position 0 excluded), all layers from one forward pass per batch over those sequences
only; each layer is preprocessed, every configured proxy runs on it, and the z-scored
proxies combine into S(ℓ).
"""

from __future__ import annotations

import csv
import io
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dihal_bench.backbone import Backbone
from dihal_bench.corpus import Corpus, pack, tokenize_documents
from dihal_bench.errors import DihalError
from dihal_bench.geometry import (
    check_proxy_setup,
    choose_layer,
    evaluate_proxies,
    layer_scores,
)
from dihal_bench.hidden import extract_sampled, sample_positions
from dihal_bench.plugins import get_registry
from dihal_bench.provenance import environment
from dihal_bench.records import write_bytes_atomic, write_json_atomic, write_text_atomic
from dihal_bench.suite import DIHAL_PROXIES


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


def resolve_proxies(names) -> dict:
    """Proxy names -> {name: (fn, higher_is_better)}; ``all`` means every registered proxy."""
    registry = get_registry()
    if list(names) == ["all"]:
        names = registry.names("proxy")
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


def locate(backbone: Backbone, corpus: Corpus, config: LocateConfig, progress: bool = True) -> dict:
    """Run locate; returns the JSON-able record (config, per-layer values, scores, ℓ*)."""
    if backbone.num_layers < 3:
        raise DihalError(f"{backbone.name} has {backbone.num_layers} layers; locate needs at least 3")
    proxies = resolve_proxies(config.proxies)
    check_proxy_setup(proxies, config.params, config.preprocessing, config.seed, config.tokens)  # fail before the slow part
    sequences = pack(tokenize_documents(corpus.split("validation"), backbone.tokenizer), config.seq_len,
                     split_name="validation")
    positions = sample_positions(len(sequences), config.seq_len, config.tokens, config.seed, config.sequences)

    started = time.perf_counter()
    states = extract_sampled(backbone, sequences, positions, config.batch_size, progress)
    extract_seconds = time.perf_counter() - started

    candidates = list(range(1, backbone.num_layers))  # the hybrid keeps at least one upper layer
    started = time.perf_counter()
    geometry = evaluate_proxies({layer: states[layer] for layer in candidates}, proxies, config.params,
                                config.preprocessing, config.seed, progress,
                                origins={name: proxy_origin(name) for name in proxies})
    proxy_seconds = time.perf_counter() - started

    raw = {name: entry["values"] for name, entry in geometry["proxies"].items()}
    better = {name: entry["higher_is_better"] for name, entry in geometry["proxies"].items()}
    scores, z = layer_scores(raw, better, config.weights)
    for name, entry in geometry["proxies"].items():
        entry["z"] = z[name].tolist()
        entry["weight"] = config.weights.get(name, 1.0)
    return {
        "kind": "locate",
        "backbone": backbone.describe(),
        "corpus": corpus.name,
        "config": {**asdict(config), "proxies": list(proxies)},
        "tokens_sampled": len(positions),
        "sequences_available": len(sequences),
        "sequences_read": len(positions[:, 0].unique()),
        "layers": geometry["layers"],
        "preprocessing": geometry["preprocessing"],
        "proxies": geometry["proxies"],
        "score": scores.tolist(),
        "chosen_layer": choose_layer(geometry["layers"], scores),
        "timings": {"extract_seconds": extract_seconds, "proxy_seconds": proxy_seconds},
        "environment": environment(),
    }


def table_rows(result: dict) -> tuple[list[str], list[list]]:
    """One row per layer: each proxy's raw value and z-score, the score, and a ★ on ℓ*."""
    names = list(result["proxies"])
    headers = ["layer"] + [h for n in names for h in (n, f"z({n})")] + ["score", "ℓ*"]
    rows = []
    for i, layer in enumerate(result["layers"]):
        row = [layer]
        for name in names:
            entry = result["proxies"][name]
            row += [entry["values"][i], entry["z"][i]]
        row += [result["score"][i], "★" if layer == result["chosen_layer"] else ""]
        rows.append(row)
    return headers, rows


def format_table(result: dict) -> str:
    from tabulate import tabulate

    headers, rows = table_rows(result)
    return tabulate(rows, headers=headers, floatfmt=".4g")


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
    def draw(ax):
        layers = result["layers"]
        for name, entry in result["proxies"].items():
            sign = "+" if entry["higher_is_better"] else "−"
            ax.plot(layers, entry["z"], marker=".", linewidth=1, label=f"z({name}) [{sign}]")
        ax.plot(layers, result["score"], color="black", linewidth=2.2, label="score S(ℓ)")
        ax.axvline(result["chosen_layer"], color="crimson", linestyle="--", label=f"ℓ* = {result['chosen_layer']}")
        ax.set_xlabel("layer ℓ")
        ax.set_ylabel("z-score across layers")
        ax.set_title(f"{result['backbone']['name']} on {result['corpus']}: geometry proxies "
                     f"(N={result['tokens_sampled']}, {result['preprocessing']} preprocessing)")
        ax.legend(fontsize=8, loc="best")

    return figure_png(draw)


def figure_png(draw) -> bytes:
    """A PNG of one matplotlib axes drawn by ``draw(ax)`` (rendered off-screen, in memory)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        draw(ax)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buffer.getvalue()
