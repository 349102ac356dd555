"""A group's plots as PNG bytes, drawn in one style (`STYLE`) with matplotlib's object API
(no pyplot: no global state, no GUI backend).

- the locate proxies' z-scores and S(ℓ) against depth, ℓ* marked;
- S(ℓ) against bridge validation MSE per swept layer;
- the methods' trade-off: the first lower-is-better metric of the records against their first
  higher-is-better one (Gen.PPL against entropy for the built-in metrics), with its Pareto front.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from dihal_bench.leaderboard.aggregate import (
    Table,
    arrow,
    pareto_front,
    summarise,
    value_columns,
)
from dihal_bench.leaderboard.read import Group, one_line

#: Every plot's look. usetex off: a user's matplotlibrc may turn it on, and it would typeset
#: every label (names from records included) as LaTeX.
STYLE = {
    "text.usetex": False,
    "figure.figsize": (7.0, 4.5),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 10,
    "axes.titlesize": "medium",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": "small",
    "legend.frameon": False,
    "lines.markersize": 6,
}
#: A scale is logarithmic when its positive values span more than this factor.
LOG_SCALE_SPAN = 100.0
#: Longer plot labels are cut (with "…"): a title much wider than the 7-inch figure makes
#: the layout squeeze the axes to nothing. The tables keep every name whole.
PLOT_TEXT_MAX_CHARACTERS = 80


@dataclass(frozen=True)
class Plot:
    png: bytes
    caption: str


def plot_text(text) -> str:
    """``text`` for a matplotlib label: one line, at most PLOT_TEXT_MAX_CHARACTERS, and every
    ``$`` escaped (a pair would start mathtext, which fails on anything it cannot parse).
    Plots are drawn with usetex off (`STYLE`), so nothing else in a label is markup."""
    text = one_line(text)
    if len(text) > PLOT_TEXT_MAX_CHARACTERS:
        text = text[: PLOT_TEXT_MAX_CHARACTERS - 1] + "…"
    return text.replace("$", r"\$")


def _figure():
    from matplotlib.figure import Figure

    figure = Figure(layout="constrained")
    return figure, figure.subplots()


def _title(axes, title: str, group: Group) -> None:
    axes.set_title(f"{plot_text(title)}\n{plot_text(group.title)}")


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def plot_proxies(group: Group, methods: Table | None) -> Plot | None:
    """Each proxy's z-score and S(ℓ) against layer (mean over seeds, ± std band); ℓ* dotted."""
    rows = group.rows["z"]
    if not rows:
        return None
    keys = value_columns(rows, ("score",), skip=("layer",))
    stats = summarise(pd.DataFrame(rows), "layer", keys, sort=True)
    figure, axes = _figure()
    for key in [*keys[1:], "score"]:
        mean, std = stats[f"{key}_mean"], stats[f"{key}_std"].fillna(0)
        score = key == "score"
        (line,) = axes.plot(stats.index, mean, label="S(ℓ) (score)" if score else plot_text(key),
                            linewidth=2.5 if score else 1.2, color="black" if score else None)
        axes.fill_between(stats.index, mean - std, mean + std, alpha=0.15, color=line.get_color())
    for layer in sorted({row["layer"] for row in group.rows["layers"] if row["chosen"]}):
        axes.axvline(layer, linestyle=":", color="grey")
        axes.annotate(f"ℓ*={layer}", (layer, 0.98), xycoords=("data", "axes fraction"), xytext=(3, 0),
                      textcoords="offset points", va="top")
    axes.set(xlabel="layer ℓ", ylabel="z-score")
    _title(axes, "Locate proxies vs layer (mean ± std over seeds)", group)
    axes.legend()
    return Plot(_png(figure), "Locate proxies' z-scores and S(ℓ) against layer")


def plot_score_vs_bridge(group: Group, methods: Table | None) -> Plot | None:
    """S(ℓ) against bridge validation MSE per swept layer (mean ± std over seeds)."""
    stats = summarise(pd.DataFrame(group.rows["layers"]), "layer", ["score", "bridge_mse"], sort=True)
    stats = stats[(stats["score_n"] > 0) & (stats["bridge_mse_n"] > 0)]
    if stats.empty:
        return None
    figure, axes = _figure()
    axes.errorbar(stats["score_mean"], stats["bridge_mse_mean"], xerr=stats["score_std"].fillna(0),
                  yerr=stats["bridge_mse_std"].fillna(0), fmt="o", capsize=3)
    for layer, row in stats.iterrows():
        axes.annotate(f"ℓ={layer}", (row["score_mean"], row["bridge_mse_mean"]), textcoords="offset points",
                      xytext=(4, 4), fontsize="small")
    axes.set(xlabel="locate score S(ℓ)", ylabel="bridge validation MSE (standardised)")
    _title(axes, "Score vs bridge loss per swept layer", group)
    return Plot(_png(figure), "S(ℓ) against bridge validation MSE per swept layer")


def plot_tradeoff(group: Group, methods: Table | None) -> Plot | None:
    """The records' first lower-is-better metric (y) against their first higher-is-better one
    (x) per method, the Pareto front dashed; □ marks methods outside the budget. None without
    methods (a geometry-only group)."""
    if methods is None:
        return None
    directions = {name: metric["higher_is_better"] for name, metric in group.metrics.items()}
    x = next((name for name, higher in directions.items() if higher is True), None)
    y = next((name for name, higher in directions.items() if higher is False), None)
    if x is None or y is None:
        return None
    table = methods.numbers
    table = table[(table[f"{x}_n"] > 0) & (table[f"{y}_n"] > 0)]
    if table.empty:
        return None
    figure, axes = _figure()
    labels: dict[tuple[float, float], list[str]] = {}  # methods at the same point share one label
    for _, row in table.iterrows():
        point = (row[f"{x}_mean"], row[f"{y}_mean"])
        labels.setdefault(point, []).append(row["name"])
        reference = row["budget"] != "matched"
        axes.scatter(*point, marker="s" if reference else "o", color="C0",
                     facecolors="none" if reference else None)
    for point, names in labels.items():
        axes.annotate(plot_text(" / ".join(names)), point, textcoords="offset points", xytext=(4, 4),
                      fontsize="small")
    points = list(labels)
    front = sorted(points[i] for i in pareto_front(points))
    if len(front) > 1:
        axes.plot([p for p, _ in front], [q for _, q in front], color="grey", linestyle="--", label="Pareto front")
        axes.legend()
    titles = {name: f"{group.metrics[name]['display_name']}{arrow(directions[name])}" for name in (x, y)}
    for name, values, set_scale in ((x, table[f"{x}_mean"], axes.set_xscale), (y, table[f"{y}_mean"], axes.set_yscale)):
        if (values > 0).all() and values.max() / values.min() > LOG_SCALE_SPAN:
            set_scale("log")
            titles[name] += " (log scale)"
    axes.set(xlabel=plot_text(titles[x]), ylabel=plot_text(titles[y]))
    names = f"{group.metrics[y]['display_name']} against {group.metrics[x]['display_name']}"
    _title(axes, f"{names} per method (□ = reference outside budget)", group)
    return Plot(_png(figure), f"{names} per method, with the Pareto front")


#: File stem -> plot. Stems are fixed, not built from metric names, so links to them hold.
PLOTS: dict[str, Callable[[Group, Table | None], Plot | None]] = {
    "proxies_vs_layer": plot_proxies,
    "score_vs_bridge_mse": plot_score_vs_bridge,
    "methods_tradeoff": plot_tradeoff,
}


def plots(group: Group, methods: Table | None) -> dict[str, Plot]:
    """The group's plots that have something to show, by file stem."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        drawn = {stem: plot(group, methods) for stem, plot in PLOTS.items()}
    return {stem: plot for stem, plot in drawn.items() if plot is not None}
