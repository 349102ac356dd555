"""A group's rows pooled into tables: each value's mean, sample standard deviation (ddof=1) and
count over the pooled seeds that have it, and the columns people see.

The methods table takes its metric columns, their order, titles and arrows from the records'
``metrics`` mapping, so a metric a plugin adds is ranked like a built-in one, even where that
plugin is not installed when the tables are built.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from dihal_bench.leaderboard.degenerate import flag_label
from dihal_bench.leaderboard.metric_warnings import warning_notes
from dihal_bench.leaderboard.read import CORRELATION_SETS, Group, rank_series
from dihal_bench.numerics.degenerate import ENTROPY_MARGIN
from dihal_bench.numerics.stats import Stratum, holm, stratified_rank_test
from dihal_bench.study.plan import scaled_label, split_scale

#: how a metric's interval was made, where its record says (``<metric>_interval``); an interval
#: whose record says nothing is MAUVE's with-replacement bootstrap of the records before 2026-12-05,
#: which shows spread but can sit below its own point (docs/method.md#metrics), marked with SPREAD_MARK
SPREAD_MARK = "†"


METHODS_NOTE = (
    "Latency is wall-clock per generated token at batch 1, and its ratio to the backbone's own "
    "decode in the same run. Valid samples: those Gen.PPL and MAUVE read (not empty, not one "
    "word repeated over half the text); a method with fewer than the suite's min_valid has no "
    "Gen.PPL or MAUVE. Budget: matched = trained under the matched budget; outside = "
    "the intact backbone, trained by no one here; nothing trained = the skip control (layers 1..ℓ* "
    "deleted, the rest the backbone's); no model = "
    "text drawn rather than generated (reference-unigram: i.i.d. tokens from the training "
    "split's unigram distribution, a floor; reference-human: held-out validation windows, a "
    "ceiling). control-regressor is DiHAL's bridge network trained to map h_0 to h_ℓ* in one "
    "step, without diffusion. MAUVE measures closeness to the corpus's held-out text, not "
    "fluency: at a few hundred samples its per-seed bootstrap "
    "intervals overlap for most rows, and no claim rests on it alone; an interval marked "
    f"{SPREAD_MARK} is the with-replacement bootstrap of records before 2026-12-05, spread rather than an "
    "interval (it can sit below its own point), the others are half-sample intervals. What each metric measures, "
    "and which direction is better: the metrics table. Degenerate: the seeds on which the row's "
    f"mean per-sample entropy lies more than ln(4/3) = {ENTROPY_MARGIN:.3f} nats below the held-out "
    "text's (collapsed samples, which lower Gen.PPL); the claims score such a row as the unigram "
    "reference (docs/method.md#metrics)."
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
BUDGET_NOTE = (
    "Each row trained at several scales s of the matched budget (s × the steps over s × the passes of the "
    "same windows, all else the same: docs/method.md#budget-scales), train PFLOP counted from each scale's "
    "own budget; a row trained at one scale only is in the methods table alone."
)
PROXIES_NOTE = (
    "Spearman ρ and Kendall τ of each proxy (signed so that higher is better), of S(ℓ) and of "
    "S(ℓ) under other preprocessings (score[…]) with −(bridge validation MSE) over the swept "
    "layers: mean ± std over seeds of the per-seed estimates. `depth` is the reference ranking "
    "\"shallower is better\": a proxy says something about bridgeability only where it beats depth, "
    "which the partial ρ given depth measures (rank correlation with the layer index held fixed). "
    "p (pooled): one two-sided permutation test over all seeds, permuting within each seed "
    "(for the partial ρ, the error's rank residuals given depth, Freedman–Lane), of the mean ρ "
    "over seeds; p-values and intervals are never averaged over seeds. Holm: the pooled p adjusted "
    "for every test of this table (each row's ρ and partial ρ), family-wise error ≤ 0.05 where it is "
    "≤ 0.05. Power: |ρ| detectable is the 95% point of the pooled partial ρ's permutation null, the "
    "smallest |partial ρ| these layers and seeds could call significant at α = 0.05 (before Holm); "
    "residual share is how much of the rank variance depth leaves to the series and to the error "
    "(mean over seeds): with a few per cent left, a partial ρ has almost nothing to rank. Rows "
    "marked · trace-metric MSE use the bridge error in the metric of trace preprocessing, where "
    "dimensions weigh as they do for the proxies. Per-seed bootstrap intervals over layers are in "
    "the records; they are not shown, since a dozen designed layers are no sample to resample."
)
STEPS_NOTE = (
    "DiHAL at ℓ* with one trained bridge sampled in K steps: the bridge's error on the validation "
    "windows (standardised, and in the metric of trace preprocessing), the hybrid's teacher-forced "
    "perplexity and KL to the backbone on the seeded windows, and the Gen.PPL of samples drawn with "
    "that K, under the evaluator. The row marked \"the suite’s\" is the K of every DiHAL row of the "
    "methods table (the same samples). A K chosen on the data is chosen on a selection seed that the "
    "pooled seeds leave out (the suite's file says which)."
)
#: permutations per pooled rank test, and their seed: fixed, so that the tables are reproducible
RANK_TEST_PERMUTATIONS = 10_000
RANK_TEST_SEED = 0

#: Sweep row key -> layer table header.
SWEEP_HEADERS = {
    "bridge_mse": "Bridge MSE ↓",
    "bridge_r2": "Bridge R² ↑",
    "hybrid_ppl": "Hybrid PPL ↓",
    "kl_to_backbone": "KL to backbone ↓",
    "skip_ppl": "Skip PPL",
}
#: Steps-axis point key -> steps table header.
STEPS_HEADERS = {
    "gen_ppl": "Gen.PPL ↓",
    "bridge_mse": "Bridge MSE ↓",
    "bridge_mse_trace": "Bridge MSE, trace metric ↓",
    "bridge_r2": "Bridge R² ↑",
    "hybrid_ppl": "Hybrid PPL ↓",
    "kl_to_backbone": "KL to backbone ↓",
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
    ``_n`` of the table's numbers; ``p`` (a p-value, to two significant figures) from ``<key>_mean``. No kind averages interval bounds or p-values over seeds: a
    per-seed interval is text, and a pooled p-value is one number of the pooled test.
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
    #: what a cell is, where it is not a value pooled over seeds (said instead of the seeds)
    per_cell: str = ""


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


#: the precision of the built-in token draws: every autoregressive decoder's through
#: dihal_bench/api/sampling.py, MDLM's reverse chain through its own (plugins/.../mdlm.py)
DRAW_PRECISION = "the built-in decoders draw tokens from float32 probabilities (MDLM's reverse chain: float64)"


def protocol_note(group: Group) -> str:
    """How the group's samples were made and scored, in one sentence: the scorer (and whether it
    is the backbone itself), samples per seed, their length, the models' dtype and the precision
    of the token draws; a setting the records disagree on lists each value."""
    def said(key: str) -> str | None:
        values = group.protocol.get(key) or []
        return " / ".join(str(value) for value in values) if values else None

    parts = []
    if said("scorer"):
        own = group.protocol.get("scorer_is_backbone") or []
        parts.append(f"Scored by {said('scorer')}" + (" (the backbone itself)"
                                                      if True in own else " (not the backbone)"))
    if said("samples") and said("seq_len"):
        parts.append(f"{said('samples')} samples of {said('seq_len')} tokens per seed")
    if said("dtype"):
        parts.append(f"models in {said('dtype')}; {DRAW_PRECISION}")
    return "; ".join(parts) + "." if parts else ""


def method_table(group: Group) -> Table:
    frame = pd.DataFrame(group.rows["methods"])
    metrics = group.metrics
    counted = [metric for metric in metrics if f"{metric}_samples" in frame]
    bounded = [metric for metric in metrics if f"{metric}_low" in frame and f"{metric}_high" in frame]
    lm_eval = [key for key in frame.columns if key.startswith("lm_eval/")]
    ranked = [name for name, metric in metrics.items() if metric["higher_is_better"] is not None][:RANKED_METRICS]
    columns = [
        Column("name", "Method", "text"), Column("budget", "Budget", "text"),
        Column("degenerate", "Degenerate", "text"),
        *(Column(name, f"{metric_header(name, metric)}{arrow(metric['higher_is_better'])}", main=name in ranked,
                 description=metric["description"]) for name, metric in metrics.items()),
        *(Column(f"{name}_intervals", f"{metrics[name]['display_name']} 95% CI per seed", "text", main=False)
          for name in bounded),
        # on the page one click away, as are the inference FLOPs and the absolute latency (the Degenerate column
        # says what a low count would, the latency ratio what inference costs): the main table fits 1400 px
        *([Column("valid_samples", "Valid samples", "count", main=False)] if "valid_samples" in frame else []),
        *([Column("draw_precision", "Draws", "text", main=False)] if said(frame, "draw_precision") else []),
        *test_nll_columns(frame),
        Column("train_pflop", "Train PFLOP", description="training FLOPs in all, frozen passes and target "
               "extraction included, ÷ 10¹⁵ (docs/method.md#counting-compute)"),
        Column("gflop_per_token", "GFLOP/token", main=False, description="inference FLOPs per generated token, "
               "steps × denoiser, caches counted, ÷ 10⁹"),
        Column("latency_ms_per_token", "ms/token, batch 1", main=False),  # the ratio beside it is what compares
        Column("latency_ratio", "× backbone, batch 1"),
        *(Column(f"{name}_samples", f"{metrics[name]['display_name']} samples", "count", main=False)
          for name in counted),
        Column("trainable_params", "Trainable params", "count", main=False),
        Column("steps", "Steps", "count", main=False),
        Column("tokens_seen", "Tokens seen", "count", main=False),
        *(Column(key, " ".join(key.split("/")[1:]), main=False) for key in lm_eval),
    ]
    numeric = [column.key for column in columns if column.kind != "text"]
    stats = summarise(frame, "method", numeric)
    per_method = frame.groupby("method", sort=False)
    labels = {"name": [method_name(name, rows) for name, rows in per_method],
              "budget": [budget_label(rows) for _, rows in per_method],
              "degenerate": [flag_label(group.entries, name) for name, _ in per_method],
              **({"test_nll_kind": [seed_values(rows, "test_nll_kind") for _, rows in per_method]}
                 if has_test_nll(frame) else {}),
              **({"draw_precision": [seed_values(rows, "draw_precision") for _, rows in per_method]}
                 if said(frame, "draw_precision") else {}),
              **{f"{name}_intervals": [seed_intervals(rows, name, interval_kinds(group, method, name))
                                       for method, rows in per_method] for name in bounded}}
    numbers = stats.reset_index().assign(**labels)[["method", *labels, *stats.columns]]
    note = " ".join([protocol_note(group), METHODS_NOTE, *metric_notes(group)]).strip()
    return Table("methods", "Methods", note, numbers, labels, columns, group.seeds)


TEST_NLL = Column("test_nll", "Test NLL ↓", description="nats per token of the held-out test windows, every token "
                  "scored: exact for the autoregressive rows and the hybrids whose bridge draws no noise, an upper "
                  "bound for the rest (MDLM's ELBO; NLL column), none for rows without a likelihood "
                  "(docs/method.md#test-nll)")


def has_test_nll(frame: pd.DataFrame) -> bool:
    return "test_nll" in frame and bool(frame["test_nll"].astype(float).notna().any())


def test_nll_columns(frame: pd.DataFrame) -> list[Column]:
    """The held-out likelihood and whether it is exact or a bound, where some row has one."""
    if not has_test_nll(frame):
        return []
    return [TEST_NLL, Column("test_nll_kind", "NLL", "text", main=False)]


def said(frame: pd.DataFrame, key: str) -> bool:
    """Whether some row of ``frame`` has a value of the text label ``key`` (records before it have none)."""
    return key in frame and bool((frame[key].fillna("") != "").any())


def seed_values(rows: pd.DataFrame, key: str) -> str:
    """A text label of a row over its seeds ("exact", "float32"), each value where seeds differ, "—" for none."""
    values = sorted({value for value in rows[key] if value and value != "none"})
    return " / ".join(values) or "—"


#: Metrics whose value says how close the samples are to the corpus's held-out text, not how good
#: they are as language: their column says so (docs/method.md#claims-and-decision-rules).
CORPUS_CLOSENESS = {"mauve"}


def metric_header(name: str, metric: dict) -> str:
    if name in CORPUS_CLOSENESS:
        return f"{metric['display_name']} (closeness to the corpus)"
    return metric["display_name"]


def interval_kinds(group: Group, method: str, metric: str) -> dict[int, str | None]:
    """Seed -> how ``method``'s ``metric`` interval was made on that seed (None: not said)."""
    return {entry["seed"]: ((entry["methods"].get(method) or {}).get("metrics") or {}).get(f"{metric}_interval")
            for _, entry in group.entries}


def seed_intervals(rows: pd.DataFrame, metric: str, kinds: dict[int, str | None] | None = None) -> str:
    """Each seed's own interval of a metric (``s0 0.12–0.39; s1 …``): intervals of different
    seeds are shown side by side, never averaged into bounds that belong to no interval. An
    interval whose record does not say how it was made carries `SPREAD_MARK`."""
    kinds = kinds or {}
    cells = [f"s{int(row['seed'])} {row[f'{metric}_low']:.2f}–{row[f'{metric}_high']:.2f}"
             f"{'' if kinds.get(int(row['seed'])) else SPREAD_MARK}"
             for _, row in rows.sort_values("seed").iterrows()
             if math.isfinite(row[f"{metric}_low"]) and math.isfinite(row[f"{metric}_high"])]
    return "; ".join(cells) or "—"


#: the budget cell of a row trained under the matched budget; at a budget scale s ≠ 1, "matched ×s"
MATCHED = "matched"


def budget_label(rows: pd.DataFrame) -> str:
    if rows["in_budget"].all():
        scale = int(rows["scale"].iat[0]) if "scale" in rows else 1
        return MATCHED if scale == 1 else f"{MATCHED} ×{scale}"
    if (rows["kind"] == "reference").all():
        return "no model"
    return "nothing trained" if (rows["kind"] == "control").all() else "outside"


def metric_notes(group: Group) -> list[str]:
    """What the metrics warned about, one note per kind of warning naming its rows once, and where
    the records disagree on a metric."""
    return warning_notes(group) + group.metric_notes


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
    differs across seeds), ``DiHAL@4x (ℓ*=3)`` at a budget scale; a baseline keeps its plugin name."""
    if not (rows["kind"] == "dihal").all():
        return name
    row, scale = split_scale(name)
    role = row.removeprefix("dihal-")
    label, symbol = DIHAL_ROLES.get(role, (f"DiHAL {role}", "ℓ"))
    label = scaled_label(label, scale)
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


def steps_table(group: Group) -> Table:
    """One row per (sampler, K) of the sampling-steps axis, each value pooled over the seeds."""
    frame = pd.DataFrame(group.rows["steps"]).sort_values(["sampler", "steps"], kind="stable")
    frame["point"] = frame["sampler"] + " " + frame["steps"].astype(str)
    stats = summarise(frame, "point", list(STEPS_HEADERS))
    points = frame.groupby("point", sort=False)
    labels = {"steps": [f"{rows['steps'].iat[0]}{' (the suite’s)' if rows['suite_k'].any() else ''}"
                        for _, rows in points],
              "sampler": [rows["sampler"].iat[0] for _, rows in points],
              "layer": [", ".join(map(str, sorted(set(rows["layer"])))) for _, rows in points]}
    numbers = stats.reset_index().assign(**labels)[["point", *labels, *stats.columns]]
    samplers = [Column("sampler", "Sampler", "text")] if frame["sampler"].nunique() > 1 else []
    columns = [Column("steps", "K", "text"), *samplers, Column("layer", "ℓ*", "text"),
               *(Column(key, header) for key, header in STEPS_HEADERS.items())]
    return Table("steps", "Sampling steps K", STEPS_NOTE, numbers, labels, columns, group.seeds)


FRONTIER_NOTE = ("Each row resampled at other sampling settings with the same weights (docs/method.md#frontiers): "
                 "temperature for the rows that draw tokens from a next-token distribution, denoising steps for "
                 "the diffusion baselines; the other settings are the suite's. Compare rows at matched entropy, "
                 "not at one temperature: a lower temperature buys Gen.PPL with entropy.")
#: what a frontier line is read by, in this order: quality, its trade-off, closeness to the corpus
FRONTIER_METRICS = ("gen_ppl", "entropy", "mauve")


def frontier_table(group: Group) -> Table:
    """One line per (row, axis, setting), each metric pooled over the seeds; a row's own setting marked."""
    frame = pd.DataFrame(group.rows["frontier"])
    frame["point"] = frame["method"] + " " + frame["axis"] + " " + frame["setting"].astype(str)
    metrics = [name for name in FRONTIER_METRICS if name in group.metrics]
    stats = summarise(frame, "point", metrics)
    points = frame.groupby("point", sort=False)
    axis_names = {"temperature": "temperature", "diffusion_steps": "steps"}
    labels = {"method": [rows["method"].iat[0] for _, rows in points],
              "axis": [axis_names[rows["axis"].iat[0]] for _, rows in points],
              "setting": [f"{rows['setting'].iat[0]:g}{' (the suite’s)' if rows['suite_setting'].any() else ''}"
                          for _, rows in points]}
    numbers = stats.reset_index().assign(**labels)[["point", *labels, *stats.columns]]
    columns = [Column("method", "Method", "text"), Column("axis", "Axis", "text"), Column("setting", "Setting", "text"),
               *(metric_column(name, group.metrics[name]) for name in metrics)]
    return Table("frontier", "Frontiers", FRONTIER_NOTE, numbers, labels, columns, group.seeds)


def proxy_table(group: Group) -> Table:
    keys = ["spearman", "kendall", "partial_spearman_given_depth", "swept_layers"]
    frame = pd.DataFrame(group.rows["proxies"], columns=["record", "seed", "proxy", *keys])
    stats = summarise(frame, "proxy", keys)
    tests = pooled_rank_tests(group, list(stats.index))
    numbers = stats.reset_index()
    for key in POOLED_KEYS:
        numbers[f"{key}_mean"] = [tests[proxy].get(key, math.nan) for proxy in stats.index]
        numbers[f"{key}_std"] = math.nan  # one pooled value, no spread over seeds
        numbers[f"{key}_n"] = [tests[proxy].get("seeds", 0) if key in tests[proxy] else 0 for proxy in stats.index]
    labels = {"proxy": ["score (combined S(ℓ))" if proxy == "score" else proxy for proxy in stats.index]}
    columns = [Column("proxy", "Proxy", "text"),
               Column("spearman", "Spearman ρ"), Column("spearman_p", "ρ p (pooled)", "p"),
               Column("spearman_p_holm", "ρ p Holm", "p"),
               Column("partial_spearman_given_depth", "partial ρ given depth"),
               Column("partial_p", "partial p (pooled)", "p"), Column("partial_p_holm", "partial p Holm", "p"),
               Column("partial_detectable", "partial |ρ| detectable, α = 0.05"),
               Column("residual_share_x", "residual share, series", main=False),
               Column("residual_share_y", "residual share, error", main=False),
               Column("kendall", "Kendall τ", main=False),
               Column("swept_layers", "Swept layers", "count")]
    note = " ".join([PROXIES_NOTE, *group.notes])
    return Table("proxies", "Proxies", note, numbers, labels, columns, group.seeds)


#: What `pooled_rank_tests` gives each proxy row, as columns of the proxies table.
POOLED_KEYS = ("spearman_p", "spearman_p_holm", "partial_p", "partial_p_holm", "partial_detectable",
               "residual_share_x", "residual_share_y")


def pooled_rank_tests(group: Group, proxies: list[str]) -> dict[str, dict]:
    """Per proxy row (``name`` + a `CORRELATION_SETS` suffix): the pooled permutation p of ρ and of
    the partial ρ given depth, over the group's seeds that have the series, Holm-adjusted over every
    p of the table, with the power statement (`dihal_bench.numerics.stats.stratified_rank_test`)."""
    per_seed = [series for series in (rank_series(entry) for _, entry in group.entries) if series is not None]
    tests: dict[str, dict] = {}
    for proxy in proxies:
        name, target = split_proxy_row(proxy)
        strata = [(s.series[name], s.targets[target], s.layers) for s in per_seed
                  if name in s.series and target in s.targets and all(map(math.isfinite, s.series[name]))]
        tests[proxy] = rank_tests(strata, partial=name != "depth") if strata else {}
    order = [(proxy, key) for proxy in proxies for key in ("spearman_p", "partial_p") if tests[proxy].get(key) is not None]
    for (proxy, key), adjusted in zip(order, holm([tests[proxy][key] for proxy, key in order])):
        tests[proxy][f"{key}_holm"] = adjusted
    return tests


def rank_tests(strata: list[tuple[list[float], list[float], list[int]]], *, partial: bool) -> dict:
    """The pooled tests of one proxy row over its seeds' (series, −error, layers)."""
    options = {"n_perm": RANK_TEST_PERMUTATIONS, "seed": RANK_TEST_SEED}
    plain = stratified_rank_test([Stratum(x, y) for x, y, _ in strata], **options)
    result = {"seeds": len(strata), "spearman_p": plain["p"]}
    if partial and all(len(layers) >= 4 for _, _, layers in strata):
        given = stratified_rank_test([Stratum(x, y, layers) for x, y, layers in strata], **options)
        result |= {"partial_p": given["p"], "partial_detectable": given["critical_rho"],
                   "residual_share_x": given["residual_share_x"], "residual_share_y": given["residual_share_y"]}
    return {key: value for key, value in result.items() if value is not None}


def split_proxy_row(proxy: str) -> tuple[str, str]:
    """A proxies-table row name as (series name, target suffix)."""
    for suffix in sorted(CORRELATION_SETS.values(), key=len, reverse=True):
        if suffix and proxy.endswith(suffix):
            return proxy[:-len(suffix)], suffix
    return proxy, ""


def scaled_rows(group: Group) -> pd.DataFrame:
    """The group's method rows (one per seed) of every row trained at two scales or more, ordered by
    row (as the methods table lists them) then scale: what the budget table and the compute plot
    read. Empty where no row has a scale other than 1 (every record before scales)."""
    frame = pd.DataFrame(group.rows["methods"])
    if frame.empty or "scale" not in frame or (frame["scale"] == 1).all():
        return frame.iloc[0:0]
    scales = frame.groupby("row", sort=False)["scale"].nunique()
    return by_row_then_scale(frame[frame["row"].isin(scales.index[scales >= 2])])


def by_row_then_scale(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (with ``row`` and ``scale`` columns) with each row's scales together and ascending, the
    rows in first-seen order: the methods table's (the runner's) order, not the alphabet's."""
    order = {row: i for i, row in enumerate(dict.fromkeys(frame["row"]))}
    ranked = frame.assign(row_order=frame["row"].map(order))
    return ranked.sort_values(["row_order", "scale"], kind="stable").drop(columns="row_order")


def nll_metric(group: Group) -> str | None:
    """The group's first metric that is an NLL (its key holds "nll", as the chain's markov_nll), if any."""
    return next((name for name in group.metrics if "nll" in name.lower()), None)


#: the metrics the budget table shows, where the group's records carry them: Gen.PPL, entropy, MAUVE,
#: an NLL metric (`nll_metric`), then (after the held-out likelihood, where rows have one) the share of
#: sample 8-grams copied from the training split
BUDGET_METRICS = ("gen_ppl", "entropy", "mauve")
COPIED_METRIC = "copied_8grams"


def budget_table(group: Group) -> Table | None:
    """One line per (row, scale) of each row trained at two scales or more (`scaled_rows`): the seeds
    it pools, its training PFLOP and its metrics, mean ± std over seeds as in the methods table; so
    that a row's quality reads as a curve against compute. None where no row has two scales."""
    frame = scaled_rows(group)
    if frame.empty:
        return None
    metrics = [name for name in (*BUDGET_METRICS, nll_metric(group), COPIED_METRIC) if name in group.metrics]
    likelihood = [TEST_NLL] if has_test_nll(frame) else []
    columns = [Column("row", "Row", "text"), Column("scale", "Scale", "text"), Column("seeds", "Seeds", "count"),
               Column("degenerate", "Degenerate", "text"),
               Column("train_pflop", "Train PFLOP", description="training FLOPs in all ÷ 10¹⁵, counted from "
                      "the scale's own budget (docs/method.md#counting-compute)"),
               *(metric_column(name, group.metrics[name]) for name in metrics if name != COPIED_METRIC),
               *likelihood,
               *(metric_column(name, group.metrics[name]) for name in metrics if name == COPIED_METRIC)]
    stats = summarise(frame, "method", ["train_pflop", *metrics, *(column.key for column in likelihood)])
    per_label = frame.groupby("method", sort=False)
    seeds = per_label.size().to_numpy()  # one method row per pooled seed that has the label
    labels = {"row": [rows["row"].iat[0] for _, rows in per_label],
              "scale": [f"{int(rows['scale'].iat[0])}×" for _, rows in per_label],
              "degenerate": [flag_label(group.entries, label) for label, _ in per_label]}
    counts = {"seeds_mean": seeds.astype(float), "seeds_std": 0.0, "seeds_n": seeds}  # a count, shown bare
    numbers = stats.reset_index().assign(**labels, **counts)[["method", *labels, *counts, *stats.columns]]
    return Table("budget", "Budget scales", BUDGET_NOTE, numbers, labels, columns, group.seeds)


def metric_column(name: str, metric: dict) -> Column:
    """A metric's column as the methods table heads it: its title, arrow and description."""
    return Column(name, f"{metric_header(name, metric)}{arrow(metric['higher_is_better'])}",
                  description=metric["description"])


def tables(group: Group) -> list[Table]:
    """The group's tables; a geometry-only group (records without methods) has no methods table, a
    suite without a sampling-steps axis no steps table, a suite without budget scales no budget table."""
    methods = [method_table(group), metric_table(group)] if group.rows["methods"] else []
    budget = budget_table(group) if group.rows["methods"] else None
    steps = [steps_table(group)] if group.rows["steps"] else []
    frontier = [frontier_table(group)] if group.rows["frontier"] else []
    return [*methods, *([budget] if budget is not None else []), *steps, *frontier, layer_table(group),
            proxy_table(group)]


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (x, y) points, x higher-is-better and y lower-is-better, that no other
    point beats on both (≥ x, ≤ y, and not equal)."""
    return [i for i, (x, y) in enumerate(points)
            if not any(x2 >= x and y2 <= y and (x2, y2) != (x, y) for x2, y2 in points)]
