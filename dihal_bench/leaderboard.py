"""Leaderboards: run records aggregated into tables and plots (DESIGN.md §4.6).

Records are grouped by (suite, backbone, evaluator), and every (record, seed) pair of a
group is pooled: each table cell is the mean ± sample standard deviation (ddof=1) over the
pairs that have the value, with n, the number of those pairs. A group gets three tables:

- methods: one row per method (DiHAL at ℓ*, worst and oracle layers, the baselines and the
  backbone itself) with its sample quality, latency and training budget;
- layers: one row per swept layer with each locate proxy's raw value, the combined score
  S(ℓ) and the sweep's bridgeability and hybrid measurements;
- proxies: the rank correlation of each proxy and of S(ℓ) with −(bridge validation MSE).

and three PNG plots (proxy z-scores and S(ℓ) against depth, S(ℓ) against bridge MSE, and
Gen.PPL against diversity). Every output is rendered in memory before the first file is
written, and each file is written atomically, so a failure never leaves half a leaderboard.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.records import write_bytes_atomic
from dihal_bench.records import RECORD_FORMAT

#: Output format -> file suffix.
FORMAT_SUFFIXES = {"md": ".md", "csv": ".csv", "html": ".html", "latex": ".tex"}

#: Per-method values taken from a record: (column key, header, (section, key) in the record).
METHOD_VALUES = (
    ("gen_ppl", "Gen.PPL ↓ (corpus-level gen_ppl, MDLM)", ("metrics", "gen_ppl")),
    ("gen_ppl_sample_mean", "Gen.PPL sample mean ↓", ("metrics", "gen_ppl_sample_mean")),
    ("entropy", "Entropy", ("metrics", "entropy")),
    ("diversity", "Diversity ↑", ("metrics", "diversity")),
    ("mauve", "MAUVE ↑", ("metrics", "mauve")),
    ("latency_ms_per_token", "Latency ms/token (batch 1)", ("latency", "batch1_ms_per_token")),
    ("latency_ratio", "Latency ratio to backbone (batch 1)", ("latency", "batch1_ratio_to_backbone")),
    ("steps", "Steps", ("train", "steps")),
    ("tokens_seen", "Tokens seen", ("train", "tokens_seen")),
)
#: Method columns derived from more than one record field.
METHOD_DERIVED = (("mauve_samples", "MAUVE samples"), ("trainable_params", "Trainable params"))
#: Columns that count things fixed by the configuration: shown as plain integers.
COUNT_COLUMNS = {"mauve_samples", "trainable_params", "steps", "tokens_seen", "swept_layers"}
#: Order of the method table's columns (lm-eval columns, when records have them, follow).
METHOD_ORDER = ("gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity", "mauve", "mauve_samples",
                "latency_ms_per_token", "latency_ratio", "trainable_params", "steps", "tokens_seen")

#: Sweep row key -> layer table header.
SWEEP_VALUES = {
    "bridge_mse": "Bridge MSE ↓",
    "bridge_r2": "Bridge R² ↑",
    "hybrid_ppl": "Hybrid PPL ↓",
    "kl_to_backbone": "KL to backbone ↓",
    "skip_ppl": "Skip PPL",
}
#: Rank-correlation keys, as `dihal_builtin.metrics.rank_correlations` returns them.
CORRELATION_VALUES = ("spearman", "spearman_low", "spearman_high", "kendall", "kendall_low", "kendall_high")
#: The kinds of flat rows a record is read into.
ROW_KINDS = ("methods", "layers", "proxies", "z")

DIHAL_ROLES = {"chosen": ("DiHAL", "ℓ*"), "worst": ("DiHAL worst", "ℓ"), "oracle": ("DiHAL oracle", "ℓ")}

METHODS_NOTE = (
    "Gen.PPL is the corpus-level gen_ppl, exp(Σ NLL / Σ tokens) under the evaluator (MDLM's "
    "convention); the sample-mean column averages per-sample perplexities. MAUVE is optimistic "
    "with few samples, hence its sample count. Latency is wall-clock per generated token at "
    "batch 1, and its ratio to the backbone's own decode in the same run. Budget: matched = "
    "trained under the matched budget; reference = outside it (the backbone itself)."
)
LAYERS_NOTE = (
    "Proxy columns are each locate proxy's raw value at the layer and Score is the combined "
    "S(ℓ). Bridge MSE and R² compare the bridge's sampled ĥ_ℓ with h_ℓ (standardised, validation "
    "split); Hybrid PPL and KL are the hybrid's teacher-forced perplexity and KL to the backbone; "
    "Skip PPL feeds the embeddings straight to the layers above ℓ (no bridge). The ℓ* column "
    "lists the seeds whose locate step chose the layer."
)
PROXIES_NOTE = (
    "Spearman ρ and Kendall τ of each proxy (signed so that higher is better) and of S(ℓ) with "
    "−(bridge validation MSE) over the swept layers: the mean ± std over seeds of the per-seed "
    "point estimates. The 95% intervals are the means over seeds of each seed's bootstrap "
    "percentile bounds (resampling layers), not an interval of the pooled estimate."
)
CELL_NOTE = "Each cell: mean ± sample standard deviation (ddof=1) over n pooled (record, seed) pairs."


# --- reading records ------------------------------------------------------------------------


@dataclass
class Group:
    """The pooled (record, seed) pairs of one (suite, backbone, evaluator)."""

    suite: str
    backbone: str
    evaluator: str
    corpora: set[str] = field(default_factory=set)
    sources: dict[str, list[int]] = field(default_factory=dict)  # record file name -> its seeds
    rows: dict[str, list[dict]] = field(default_factory=lambda: {kind: [] for kind in ROW_KINDS})
    notes: list[str] = field(default_factory=list)

    @property
    def folder(self) -> str:
        return "-".join(_slug(part) for part in (self.suite, self.backbone, self.evaluator))

    @property
    def title(self) -> str:
        return f"{self.suite} · backbone {self.backbone} · evaluator {self.evaluator}"


def read_groups(results_dir: Path, warn: Callable[[str], None]) -> list[Group]:
    """Every run record in ``results_dir`` (``*.json``), grouped. A file that is not valid
    JSON, not a run record or malformed is skipped with a warning naming it."""
    if not results_dir.is_dir():
        raise DihalError(f"no run records in {results_dir}: the folder does not exist")
    groups: dict[tuple[str, str, str], Group] = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            warn(f"skipping {path}: not readable JSON ({exc})")
            continue
        found = record.get("format") if isinstance(record, dict) else None
        if found != RECORD_FORMAT:
            warn(f"skipping {path}: not a dihal-bench run record (format {found!r}, expected {RECORD_FORMAT!r})")
            continue
        try:
            key = (str(record["suite"]), str(record["backbone"]), str(record["evaluator"]))
            rows, seeds, notes = record_rows(record, path.name)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            warn(f"skipping {path}: malformed run record ({type(exc).__name__}: {exc})")
            continue
        group = groups.setdefault(key, Group(*key))
        group.corpora.add(str(record.get("corpus")))
        group.sources[path.name] = seeds
        for name, new in rows.items():
            group.rows[name] += new
        group.notes += [note for note in notes if note not in group.notes]
    if not groups:
        raise DihalError(f"no run records in {results_dir}")
    return [groups[key] for key in sorted(groups)]


def record_rows(record: dict, source: str) -> tuple[dict[str, list[dict]], list[int], list[str]]:
    """One record as flat rows, one per (seed, method), (seed, layer), (seed, proxy) and
    (seed, locate layer), each tagged with the record's file name and the seed; plus the
    record's seeds and its notes (why a seed has no rank correlations)."""
    if not record["per_seed"]:
        raise ValueError("per_seed is empty")
    rows: dict[str, list[dict]] = {kind: [] for kind in ROW_KINDS}
    seeds, notes = [], []
    for entry in record["per_seed"]:
        seed = int(entry["seed"])
        seeds.append(seed)
        tag = {"record": source, "seed": seed}
        rows["methods"] += [{**tag, "method": name, **method_values(method)}
                            for name, method in entry["methods"].items()]
        layers, z = layer_values(entry["locate"], entry["sweep"]["layers"])
        rows["layers"] += [{**tag, **row} for row in layers]
        rows["z"] += [{**tag, **row} for row in z]
        for name, values in entry["sweep"]["correlations"].items():
            if isinstance(values, dict):
                estimates = {key: _number(values.get(key)) for key in CORRELATION_VALUES}
                rows["proxies"].append({**tag, "proxy": name, **estimates, "swept_layers": _number(values.get("n"))})
            else:  # {"warning": why there are none}
                notes.append(f"No rank correlations for seed {seed} of {source}: {values}.")
    return rows, seeds, notes


def method_values(method: dict) -> dict:
    values = {"kind": method["kind"], "in_budget": bool(method["in_budget"]), "layer": method.get("layer")}
    for key, _, (section, name) in METHOD_VALUES:
        values[key] = _number((method.get(section) or {}).get(name))
    metrics = method.get("metrics") or {}
    # The record merges every metric's result into one dict, so `n` is the last metric's
    # count; the suites list MAUVE last, so when MAUVE ran `n` is its sample count.
    # "mauve_n" since records name side values after their metric; "n" in older records
    values["mauve_samples"] = _number(metrics.get("mauve_n", metrics.get("n"))) if "mauve" in metrics else math.nan
    values["trainable_params"] = float(sum(method["parameters"].values()))
    for task, results in (method.get("lm_eval") or {}).items():
        for metric, value in results.items():
            if not math.isnan(_number(value)):  # numbers only: lm-eval also reports aliases
                values[f"lm_eval/{task}/{metric}"] = _number(value)
    return values


def layer_values(locate: dict, sweep_rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """Rows of the layer table (swept layers and ℓ*) and of the z-score plot (every layer)."""
    index = {layer: i for i, layer in enumerate(locate["layers"])}
    proxies = locate["proxies"]
    swept = {row["layer"]: row for row in sweep_rows}
    chosen = locate["chosen_layer"]
    layers = []
    for layer in sorted(set(swept) | {chosen}):
        i = index.get(layer)
        row = {"layer": layer, "chosen": layer == chosen}
        for name, proxy in proxies.items():
            row[name] = _number(proxy["values"][i]) if i is not None else math.nan
        row["score"] = _number(locate["score"][i]) if i is not None else math.nan
        row.update({key: _number(swept.get(layer, {}).get(key)) for key in SWEEP_VALUES})
        layers.append(row)
    z = [{"layer": layer, "score": _number(locate["score"][i]),
          **{name: _number(proxy["z"][i]) for name, proxy in proxies.items()}}
         for layer, i in index.items()]
    return layers, z


def _number(value) -> float:
    """A record value as a float; NaN for anything that is not a number (None, text, bool)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


# --- aggregation ----------------------------------------------------------------------------


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


# --- formatting -----------------------------------------------------------------------------


def _exponent(x: float) -> int:
    return math.floor(math.log10(abs(x))) if x else 0


def format_number(x: float) -> str:
    """Four significant figures (whole numbers in full), scientific notation outside [1e-3, 1e6)."""
    if x == 0 or 1e-3 <= abs(x) < 1e6:
        return f"{x:.{max(0, 3 - _exponent(x))}f}"
    return f"{x:.3e}"


def format_mean_std(mean: float, std: float) -> str:
    """``mean ± std`` with the std to two significant figures and the mean to the same digit
    (capped at six decimals); a lone value (std undefined) to four significant figures."""
    if not (math.isfinite(std) and math.isfinite(mean)):
        return format_number(mean)
    if std == 0:
        return f"{format_number(mean)} ± 0"
    if mean == 0 or 1e-3 <= abs(mean) < 1e6:
        decimals = min(max(0, 1 - _exponent(std)), 6)
        return f"{mean:.{decimals}f} ± {std:.{decimals}f}"
    decimals = min(max(0, _exponent(mean) - _exponent(std) + 1), 5)
    return f"{mean:.{decimals}e} ± {std:.1e}"


def format_cell(mean: float, std: float, n: int, *, count: bool = False) -> str:
    """``mean ± std (n=k seeds)``; a count that does not vary is shown as the bare integer."""
    if n == 0:
        return "—"
    if count and (n == 1 or std == 0):
        return f"{mean:,.0f}"
    return f"{format_mean_std(mean, std)} (n={n} seed{'s' if n != 1 else ''})"


def cells(stats: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """The formatted cells of ``stats`` (from `summarise`) under display headers."""
    return pd.DataFrame({
        header: [format_cell(row[f"{key}_mean"], row[f"{key}_std"], int(row[f"{key}_n"]), count=key in COUNT_COLUMNS)
                 for _, row in stats.iterrows()]
        for key, header in columns.items()
    }, index=stats.index)


# --- tables ---------------------------------------------------------------------------------


@dataclass
class Table:
    """One leaderboard table: ``numbers`` for CSV (numeric mean/std/n columns) and
    ``cells`` for people (formatted text under display headers), row for row."""

    name: str
    title: str
    note: str
    numbers: pd.DataFrame
    cells: pd.DataFrame


def method_table(group: Group) -> Table:
    rows = group.rows["methods"]
    frame = pd.DataFrame(rows)
    headers = {key: header for key, header, _ in METHOD_VALUES} | dict(METHOD_DERIVED)
    keys = value_columns(rows, METHOD_ORDER, skip=("method", "kind", "in_budget", "layer"))
    headers |= {key: " ".join(key.split("/")[1:]) for key in keys if key.startswith("lm_eval/")}
    stats = summarise(frame, "method", keys)
    per_method = frame.groupby("method", sort=False)
    names = [method_name(name, method) for name, method in per_method]
    budget = ["matched" if method["in_budget"].all() else "reference (outside budget)" for _, method in per_method]
    numbers = stats.reset_index().assign(name=names, budget=budget)
    numbers = numbers[["method", "name", "budget", *stats.columns]]
    shown = cells(stats, {key: headers[key] for key in keys})
    shown.insert(0, "Budget", budget)
    shown.insert(0, "Method", names)
    return Table("methods", "Methods", METHODS_NOTE, numbers, shown.reset_index(drop=True))


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
    chosen_by = [" ".join(str(seed) for seed in frame.loc[(frame["layer"] == layer) & frame["chosen"], "seed"])
                 for layer in stats.index]
    numbers = stats.reset_index().assign(chosen_for_seeds=chosen_by)
    headers = {key: SWEEP_VALUES.get(key, "Score" if key == "score" else key) for key in keys}
    shown = cells(stats, headers)
    shown.insert(0, "ℓ* for seeds", [seeds.replace(" ", ", ") for seeds in chosen_by])
    shown.insert(0, "Layer", [str(layer) for layer in stats.index])
    return Table("layers", "Layers", LAYERS_NOTE, numbers, shown.reset_index(drop=True))


def proxy_table(group: Group) -> Table:
    columns = [*CORRELATION_VALUES, "swept_layers"]
    rows = group.rows["proxies"]
    frame = pd.DataFrame(rows, columns=["record", "seed", "proxy", *columns])
    stats = summarise(frame, "proxy", columns)
    names = ["score (combined S(ℓ))" if proxy == "score" else proxy for proxy in stats.index]
    shown = pd.DataFrame({"Proxy": names}, index=stats.index)
    for key, header, symbol in (("spearman", "Spearman ρ", "ρ"), ("kendall", "Kendall τ", "τ")):
        shown[header] = cells(stats, {key: header})[header]
        shown[f"{symbol} 95% CI (mean bounds)"] = [
            _interval(low, high) for low, high in zip(stats[f"{key}_low_mean"], stats[f"{key}_high_mean"])]
    shown["Swept layers"] = cells(stats, {"swept_layers": "Swept layers"})["Swept layers"]
    note = " ".join([PROXIES_NOTE, *group.notes])
    return Table("proxies", "Proxies", note, stats.reset_index(), shown.reset_index(drop=True))


def _interval(low: float, high: float) -> str:
    return "—" if math.isnan(low) or math.isnan(high) else f"[{low:.2f}, {high:.2f}]"


def tables(group: Group) -> list[Table]:
    return [method_table(group), layer_table(group), proxy_table(group)]


# --- rendering tables -----------------------------------------------------------------------


def provenance(sources: dict[str, list[int]]) -> str:
    """The line that traces a table's numbers back to their run records."""
    seeds = sum(len(s) for s in sources.values())
    listed = "; ".join(f"{name} (seed{'s' if len(s) != 1 else ''} {', '.join(map(str, s))})"
                       for name, s in sources.items())
    return (f"Built from {len(sources)} run record{'s' if len(sources) != 1 else ''} "
            f"({seeds} seed{'s' if seeds != 1 else ''}): {listed}.")


def render_markdown(table: Table, group: Group) -> str:
    body = table.cells.to_markdown(index=False, disable_numparse=True)
    return (f"{provenance(group.sources)}\n\n# {table.title}: {group.title}\n\n"
            f"{CELL_NOTE} {table.note}\n\n{body}\n")


def render_csv(table: Table, group: Group) -> str:
    return table.numbers.to_csv(index=False)


def table_html(table: Table, heading: str, title: str) -> str:
    return (f"<{heading}>{html.escape(title)}</{heading}>\n"
            f"<p class=\"note\">{html.escape(CELL_NOTE)} {html.escape(table.note)}</p>\n"
            f"{table.cells.to_html(index=False, border=0, classes='leaderboard')}\n")


def render_html(table: Table, group: Group) -> str:
    title = f"{table.title}: {group.title}"
    return html_page(title, f"<p>{html.escape(provenance(group.sources))}</p>\n{table_html(table, 'h1', title)}")


#: Unicode in cells and headers -> LaTeX (text mode).
LATEX_SYMBOLS = {"±": r"$\pm$", "ℓ": r"$\ell$", "∈": r"$\in$", "ρ": r"$\rho$", "τ": r"$\tau$",
                 "↓": r"$\downarrow$", "↑": r"$\uparrow$", "²": r"$^2$", "—": "---"}


def render_latex(table: Table, group: Group) -> str:
    body = table.cells.to_latex(index=False, escape=True)
    for symbol, latex in LATEX_SYMBOLS.items():
        body = body.replace(symbol, latex)
    return f"% {provenance(group.sources)}\n% {table.title}: {group.title}\n{body}"


#: Format -> renderer of one table.
TABLE_RENDERERS: dict[str, Callable[[Table, Group], str]] = {
    "md": render_markdown, "csv": render_csv, "html": render_html, "latex": render_latex,
}

PAGE_STYLE = """
body { font-family: sans-serif; max-width: 80rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table.leaderboard { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
table.leaderboard th, table.leaderboard td { border-bottom: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
table.leaderboard th:first-child, table.leaderboard td:first-child { text-align: left; }
p.note { color: #555; font-size: 0.9rem; }
figure { display: inline-block; margin: 0.5rem; }
img { max-width: 100%; }
"""


def html_page(title: str, body: str) -> str:
    """A self-contained page: inline style, no scripts, nothing fetched from elsewhere."""
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<title>{html.escape(title)}</title>\n<style>{PAGE_STYLE}</style>\n</head>\n<body>\n"
            f"{body}</body>\n</html>\n")


# --- plots ----------------------------------------------------------------------------------


def _figure():
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend

    figure = Figure(figsize=(7, 4.5), dpi=100, layout="constrained")
    return figure, figure.subplots()


def _title(axes, title: str, group: Group) -> None:
    axes.set_title(f"{title}\n{group.title}", fontsize="medium")


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def plot_proxies(group: Group) -> bytes | None:
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
        (line,) = axes.plot(stats.index, mean, label="S(ℓ) (score)" if score else key,
                            linewidth=2.5 if score else 1.2, color="black" if score else None)
        axes.fill_between(stats.index, mean - std, mean + std, alpha=0.15, color=line.get_color())
    for layer in sorted({row["layer"] for row in group.rows["layers"] if row["chosen"]}):
        axes.axvline(layer, linestyle=":", color="grey")
        axes.annotate(f"ℓ*={layer}", (layer, 0.98), xycoords=("data", "axes fraction"), xytext=(3, 0),
                      textcoords="offset points", va="top")
    axes.set(xlabel="layer ℓ", ylabel="z-score")
    _title(axes, "Locate proxies vs layer (mean ± std over seeds)", group)
    axes.legend(fontsize="small")
    return _png(figure)


def plot_score_vs_bridge(group: Group) -> bytes | None:
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
    return _png(figure)


def plot_ppl_vs_diversity(group: Group) -> bytes | None:
    """Gen.PPL (log scale) against diversity per method, with the Pareto frontier (lower
    Gen.PPL and higher diversity are better) as a step line."""
    table = method_table(group).numbers
    table = table[(table["gen_ppl_n"] > 0) & (table["diversity_n"] > 0)]
    if table.empty:
        return None
    figure, axes = _figure()
    labels: dict[tuple[float, float], list[str]] = {}  # methods at the same point share one label
    for _, row in table.iterrows():
        point = (row["diversity_mean"], row["gen_ppl_mean"])
        labels.setdefault(point, []).append(row["name"])
        reference = row["budget"] != "matched"
        axes.scatter(*point, marker="s" if reference else "o",
                     facecolors="none" if reference else None, edgecolors="black" if reference else None)
    for point, names in labels.items():
        axes.annotate(" / ".join(names), point, textcoords="offset points", xytext=(4, 4), fontsize="small")
    points = list(labels)
    front = sorted(points[i] for i in pareto_front(points))
    if len(front) > 1:
        axes.plot([d for d, _ in front], [p for _, p in front], color="grey", linestyle="--", label="Pareto frontier")
        axes.legend(fontsize="small")
    axes.set_yscale("log")
    axes.set(xlabel="diversity (∏ of distinct n-gram ratios, n=2, 3, 4)", ylabel="Gen.PPL (corpus-level, log scale)")
    _title(axes, "Gen.PPL vs diversity per method (□ = reference outside budget)", group)
    return _png(figure)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (diversity, Gen.PPL) points no other point beats on both (≥ diversity,
    ≤ Gen.PPL, and not equal)."""
    return [i for i, (d, p) in enumerate(points)
            if not any(d2 >= d and p2 <= p and (d2, p2) != (d, p) for d2, p2 in points)]


#: File stem -> (plot, caption).
PLOTS: dict[str, tuple[Callable[[Group], bytes | None], str]] = {
    "proxies_vs_layer": (plot_proxies, "Locate proxies' z-scores and S(ℓ) against layer"),
    "score_vs_bridge_mse": (plot_score_vs_bridge, "S(ℓ) against bridge validation MSE per swept layer"),
    "gen_ppl_vs_diversity": (plot_ppl_vs_diversity, "Gen.PPL against diversity per method"),
}


# --- building -------------------------------------------------------------------------------


def check_formats(formats: Iterable[str]) -> list[str]:
    formats = list(dict.fromkeys(formats))
    if not formats:
        raise DihalError("no leaderboard format given")
    for name in formats:
        if name not in FORMAT_SUFFIXES:
            raise unknown_name("leaderboard format", name, FORMAT_SUFFIXES)
    return formats


def render_group(group: Group, formats: list[str]) -> tuple[dict[str, bytes], list[Table], dict[str, bytes]]:
    """A group's files (relative path -> bytes), its tables and its plots."""
    files: dict[str, bytes] = {}
    built = tables(group)
    for table in built:
        for name in formats:
            text = TABLE_RENDERERS[name](table, group)
            files[f"{group.folder}/{table.name}{FORMAT_SUFFIXES[name]}"] = text.encode("utf-8")
    plots = {}
    for stem, (plot, _) in PLOTS.items():
        png = plot(group)
        if png is not None:
            plots[stem] = png
            files[f"{group.folder}/{stem}.png"] = png
    return files, built, plots


def render_index(groups: list[Group], files: dict[str, bytes]) -> str:
    lines = ["# dihal-bench leaderboards", "",
             "| Suite | Backbone | Evaluator | Corpus | Records | Seeds | Files |",
             "|---|---|---|---|---|---|---|"]
    for group in groups:
        links = ", ".join(f"[{Path(path).name}]({path})" for path in files
                          if path.startswith(f"{group.folder}/") and path.endswith((".md", ".png")))
        seeds = sum(len(s) for s in group.sources.values())
        lines.append(f"| {group.suite} | {group.backbone} | {group.evaluator} | {', '.join(sorted(group.corpora))} "
                     f"| {', '.join(group.sources)} | {seeds} | {links} |")
    return "\n".join(lines) + "\n"


def render_page(groups: list[Group], rendered: list[tuple[list[Table], dict[str, bytes]]]) -> str:
    """Every group in one page, plots embedded as base64 data URIs."""
    parts = []
    for group, (built, plots) in zip(groups, rendered):
        parts.append(f"<section>\n<h2>{html.escape(group.title)}</h2>\n"
                     f"<p>Corpus: {html.escape(', '.join(sorted(group.corpora)))}. "
                     f"{html.escape(provenance(group.sources))}</p>\n")
        parts += [table_html(table, "h3", table.title) for table in built]
        for stem, png in plots.items():
            caption = html.escape(PLOTS[stem][1])
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img src=\"data:image/png;base64,{data}\" alt=\"{caption}\">"
                         f"<figcaption>{caption}</figcaption></figure>\n")
        parts.append("</section>\n")
    return html_page("dihal-bench leaderboard", "<h1>dihal-bench leaderboard</h1>\n" + "".join(parts))


def build_leaderboards(results_dir: Path, out_dir: Path, formats: Iterable[str] = ("md", "csv", "html"), *,
                       warn: Callable[[str], None] = print) -> list[Path]:
    """Aggregate the run records in ``results_dir`` into leaderboards under ``out_dir``.

    Writes, per (suite, backbone, evaluator) group, ``<group>/methods|layers|proxies.<ext>``
    in each of ``formats`` (md, csv, html, latex) and the PNG plots; plus ``index.md`` (with
    md) and ``leaderboard.html``, every group in one self-contained page (with html).
    Everything is rendered before anything is written. Returns the written paths.
    """
    formats = check_formats(formats)
    groups = read_groups(Path(results_dir), warn)
    files: dict[str, bytes] = {}
    rendered = []
    for group in groups:
        group_files, built, plots = render_group(group, formats)
        files |= group_files
        rendered.append((built, plots))
    if "md" in formats:
        files["index.md"] = render_index(groups, files).encode("utf-8")
    if "html" in formats:
        files["leaderboard.html"] = render_page(groups, rendered).encode("utf-8")
    written = []
    for relative, data in files.items():
        write_bytes_atomic(Path(out_dir) / relative, data)
        written.append(Path(out_dir) / relative)
    return written


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
