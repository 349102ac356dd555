"""A group's rows pooled into tables: each value's mean, sample standard deviation (ddof=1) and
count over the pooled seeds that have it, and the columns people see.

The methods table takes its metric columns, their order, titles and arrows from the records'
``metrics`` mapping, so a metric a plugin adds is ranked like a built-in one, even where that
plugin is not installed when the tables are built.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from dihal_bench.leaderboard.read import CORRELATION_KEYS, Group

METHODS_NOTE = (
    "Latency is wall-clock per generated token at batch 1, and its ratio to the backbone's own "
    "decode in the same run. Valid samples: those Gen.PPL and MAUVE read (not empty, not one "
    "word repeated over half the text); a method with fewer than the suite's min_valid has no "
    "Gen.PPL or MAUVE. Budget: matched = trained under the matched budget; outside = "
    "trains nothing (the intact backbone, the skip control: layers 1..ℓ* deleted); no model = "
    "text drawn rather than generated (reference-unigram: i.i.d. tokens from the training "
    "split's unigram distribution, a floor; reference-human: held-out validation windows, a "
    "ceiling). control-regressor is DiHAL's bridge network trained to map h_0 to h_ℓ* in one "
    "step, without diffusion. What each metric measures, and which direction is better: the "
    "metrics table."
)
METRICS_NOTE = (
    "The metrics of the methods table, as the run records describe them (from each metric's "
    "registration when the run was made). Key: the metric's columns in methods.csv are "
    "<key>_mean, <key>_std and <key>_n."
)
LAYERS_NOTE = (
    "Proxy columns are each locate proxy's raw value at the layer and Score is the combined "
    "S(ℓ). Bridge MSE and R² compare the bridge's sampled ĥ_ℓ with h_ℓ (standardised, validation "
    "split); Hybrid PPL and KL are the hybrid's teacher-forced perplexity and KL to the backbone; "
    "Skip PPL feeds the embeddings straight to the layers above ℓ (no bridge). The ℓ* column "
    "lists the seeds whose locate step chose the layer."
)
PROXIES_NOTE = (
    "Spearman ρ and Kendall τ of each proxy (signed so that higher is better), of S(ℓ) and of "
    "S(ℓ) under other preprocessings (score[…]) with −(bridge validation MSE) over the swept "
    "layers: the mean ± std over seeds of the per-seed point estimates. `depth` is the reference "
    "ranking \"shallower is better\": a proxy says something about bridgeability only where it "
    "beats depth, which the partial ρ given depth measures (rank correlation with the layer index "
    "held fixed). p: two-sided permutation p-values (exact up to 8 layers), averaged over seeds. "
    "The 95% intervals are the means over seeds of each seed's bootstrap percentile bounds "
    "(resampling layers), not an interval of the pooled estimate. Rows marked · trace-metric MSE "
    "use the bridge error in the metric of trace preprocessing, where dimensions weigh as they "
    "do for the proxies."
)

#: Sweep row key -> layer table header.
SWEEP_HEADERS = {
    "bridge_mse": "Bridge MSE ↓",
    "bridge_r2": "Bridge R² ↑",
    "hybrid_ppl": "Hybrid PPL ↓",
    "kl_to_backbone": "KL to backbone ↓",
    "skip_ppl": "Skip PPL",
}
#: At most this many metric columns in the table a reader ranks by (the first ones with a
#: direction, in the records' order); the others are one click away, so the table fits a window.
RANKED_METRICS = 6
DIHAL_ROLES = {"chosen": ("DiHAL", "ℓ*"), "worst": ("DiHAL worst", "ℓ"), "oracle": ("DiHAL oracle", "ℓ")}


@dataclass(frozen=True)
class Column:
    """One column people see.

    ``kind`` says how its cells are made: ``text`` from the table's ``labels``; ``stat`` (mean ±
    std) and ``count`` (a bare integer where it does not vary) from ``<key>_mean``, ``_std`` and
    ``_n`` of the table's numbers; ``interval`` from ``<key>_low_mean`` and ``<key>_high_mean``.
    ``main``: whether the page shows it in the table a reader ranks by, or one click away;
    ``description``: what it measures, where the records say.
    """

    key: str
    header: str
    kind: str = "stat"
    main: bool = True
    description: str = ""


@dataclass
class Table:
    """One leaderboard table: ``numbers`` for CSV (labels and numeric mean/std/n columns),
    ``labels`` the text of its text columns, and ``columns`` what people see, row for row."""

    name: str
    title: str
    note: str
    numbers: pd.DataFrame
    labels: dict[str, list[str]]
    columns: list[Column]
    #: the pooled seeds: the n of a value every seed has
    seeds: int


def summarise(rows: pd.DataFrame, by: str, columns: list[str], *, sort: bool = False) -> pd.DataFrame:
    """Mean, sample std (ddof=1) and count of non-missing values of each column per ``by``.

    Columns come out flat as ``<column>_mean``, ``<column>_std``, ``<column>_n``; rows keep
    first-seen order unless ``sort``.
    """
    numeric = rows[[by, *columns]].astype({column: float for column in columns})
    stats = numeric.groupby(by, sort=sort).agg(["mean", "std", "count"])
    stats.columns = [f"{column}_{'n' if stat == 'count' else stat}" for column, stat in stats.columns]
    return stats


def value_columns(rows: list[dict], fixed: Iterable[str], skip: Iterable[str]) -> list[str]:
    """``fixed`` first, then any other keys of ``rows`` (first-seen order) not in ``skip``."""
    fixed, skip = list(fixed), {"record", "seed", *skip}
    extra = dict.fromkeys(key for row in rows for key in row if key not in skip and key not in fixed)
    return fixed + list(extra)


def arrow(higher_is_better: bool | None) -> str:
    return {True: " ↑", False: " ↓"}.get(higher_is_better, "")


def method_table(group: Group) -> Table:
    frame = pd.DataFrame(group.rows["methods"])
    metrics = group.metrics
    counted = [metric for metric in metrics if f"{metric}_samples" in frame]
    bounded = [metric for metric in metrics if f"{metric}_low" in frame and f"{metric}_high" in frame]
    lm_eval = [key for key in frame.columns if key.startswith("lm_eval/")]
    ranked = [name for name, metric in metrics.items() if metric["higher_is_better"] is not None][:RANKED_METRICS]
    columns = [
        Column("name", "Method", "text"), Column("budget", "Budget", "text"),
        *(Column(name, f"{metric['display_name']}{arrow(metric['higher_is_better'])}", main=name in ranked,
                 description=metric["description"]) for name, metric in metrics.items()),
        *(Column(name, f"{metrics[name]['display_name']} 95% CI (mean bounds)", "interval", main=False)
          for name in bounded),
        *([Column("valid_samples", "Valid samples", "count")] if "valid_samples" in frame else []),
        Column("latency_ms_per_token", "ms/token, batch 1"),
        Column("latency_ratio", "× backbone, batch 1"),
        *(Column(f"{name}_samples", f"{metrics[name]['display_name']} samples", "count", main=False)
          for name in counted),
        Column("trainable_params", "Trainable params", "count", main=False),
        Column("steps", "Steps", "count", main=False),
        Column("tokens_seen", "Tokens seen", "count", main=False),
        *(Column(key, " ".join(key.split("/")[1:]), main=False) for key in lm_eval),
    ]
    numeric = [column.key for column in columns if column.kind not in ("text", "interval")]
    stats = summarise(frame, "method", [*numeric, *(f"{name}_{bound}" for name in bounded for bound in ("low", "high"))])
    per_method = frame.groupby("method", sort=False)
    labels = {"name": [method_name(name, rows) for name, rows in per_method],
              "budget": [budget_label(rows) for _, rows in per_method]}
    numbers = stats.reset_index().assign(**labels)[["method", "name", "budget", *stats.columns]]
    note = " ".join([METHODS_NOTE, *metric_notes(group)])
    return Table("methods", "Methods", note, numbers, labels, columns, group.seeds)


def budget_label(rows: pd.DataFrame) -> str:
    if rows["in_budget"].all():
        return "matched"
    return "no model" if (rows["kind"] == "reference").all() else "outside"


def metric_notes(group: Group) -> list[str]:
    """What the metrics warned about, and where the records disagree on one."""
    everyone = {row["method"] for row in group.rows["methods"]}
    notes = []
    for (name, warning), warned in group.warnings.items():
        which = "every method" if set(warned) == everyone else ", ".join(warned)
        notes.append(f"{group.metrics[name]['display_name']} warns ({which}): {warning.rstrip('.')}.")
    return notes + group.metric_notes


def metric_table(group: Group) -> Table:
    """The metrics of the methods table as the records describe them: the key of each one's
    columns in methods.csv, its title, which direction is better, what it measures and which
    plugin computed it."""
    metrics = group.metrics
    numbers = pd.DataFrame({
        "metric": list(metrics),
        "display_name": [metric["display_name"] for metric in metrics.values()],
        "higher_is_better": pd.array([metric["higher_is_better"] for metric in metrics.values()], dtype="boolean"),
        "arrow": [arrow(metric["higher_is_better"]).strip() for metric in metrics.values()],
        "description": [metric["description"] for metric in metrics.values()],
        "source": [metric["source"] for metric in metrics.values()],
    })
    better = {True: "↑ higher", False: "↓ lower", None: "—"}
    labels = {"display_name": list(numbers["display_name"]), "metric": list(metrics),
              "better": [better[metric["higher_is_better"]] for metric in metrics.values()],
              "description": list(numbers["description"]), "source": list(numbers["source"])}
    columns = [Column("display_name", "Metric", "text"), Column("metric", "Key", "text"),
               Column("better", "Better", "text"), Column("description", "What it measures", "text"),
               Column("source", "Computed by", "text")]
    return Table("metrics", "Metrics", METRICS_NOTE, numbers, labels, columns, group.seeds)


def method_name(name: str, rows: pd.DataFrame) -> str:
    """``DiHAL (ℓ*=3)``, ``DiHAL worst (ℓ=29)``, ``DiHAL oracle (ℓ∈{3, 5})`` (the layer
    differs across seeds); a baseline keeps its plugin name."""
    if not (rows["kind"] == "dihal").all():
        return name
    role = name.removeprefix("dihal-")
    label, symbol = DIHAL_ROLES.get(role, (f"DiHAL {role}", "ℓ"))
    layers = sorted({int(layer) for layer in rows["layer"].dropna()})
    if len(layers) == 1:
        return f"{label} ({symbol}={layers[0]})"
    return f"{label} ({symbol}∈{{{', '.join(map(str, layers))}}})"


def layer_table(group: Group) -> Table:
    rows = group.rows["layers"]
    frame = pd.DataFrame(rows)
    keys = value_columns(rows, (), skip=("layer", "chosen"))
    stats = summarise(frame, "layer", keys, sort=True)
    chosen_by = [[str(seed) for seed in frame.loc[(frame["layer"] == layer) & frame["chosen"], "seed"]]
                 for layer in stats.index]
    numbers = stats.reset_index().assign(chosen_for_seeds=[" ".join(seeds) for seeds in chosen_by])
    labels = {"layer": [str(layer) for layer in stats.index], "chosen": [", ".join(seeds) for seeds in chosen_by]}
    # a reader ranks layers by S(ℓ) and what the sweep measured; each proxy's raw value and the
    # skip control are one click away
    ranked = {"score", *SWEEP_HEADERS} - {"skip_ppl"}
    columns = [Column("layer", "Layer", "text"), Column("chosen", "ℓ* for seeds", "text"),
               *(Column(key, SWEEP_HEADERS.get(key, "Score" if key == "score" else key), main=key in ranked)
                 for key in keys)]
    return Table("layers", "Layers", LAYERS_NOTE, numbers, labels, columns, group.seeds)


def proxy_table(group: Group) -> Table:
    keys = [*CORRELATION_KEYS, "swept_layers"]
    frame = pd.DataFrame(group.rows["proxies"], columns=["record", "seed", "proxy", *keys])
    stats = summarise(frame, "proxy", keys)
    labels = {"proxy": ["score (combined S(ℓ))" if proxy == "score" else proxy for proxy in stats.index]}
    columns = [Column("proxy", "Proxy", "text"),
               Column("spearman", "Spearman ρ"), Column("spearman", "ρ 95% CI (mean bounds)", "interval"),
               Column("spearman_p", "ρ p"),
               Column("partial_spearman_given_depth", "partial ρ given depth"),
               Column("kendall", "Kendall τ", main=False), Column("kendall", "τ 95% CI (mean bounds)", "interval",
                                                                  main=False),
               Column("kendall_p", "τ p", main=False),
               Column("swept_layers", "Swept layers", "count")]
    note = " ".join([PROXIES_NOTE, *group.notes])
    return Table("proxies", "Proxies", note, stats.reset_index(), labels, columns, group.seeds)


def tables(group: Group) -> list[Table]:
    """The group's tables; a geometry-only group (records without methods) has no methods table."""
    methods = [method_table(group), metric_table(group)] if group.rows["methods"] else []
    return [*methods, layer_table(group), proxy_table(group)]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (x, y) points, x higher-is-better and y lower-is-better, that no other
    point beats on both (≥ x, ≤ y, and not equal)."""
    return [i for i, (x, y) in enumerate(points)
            if not any(x2 >= x and y2 <= y and (x2, y2) != (x, y) for x2, y2 in points)]
