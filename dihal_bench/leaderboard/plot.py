"""A group's plots as PNG bytes, drawn in one style (`STYLE`) with matplotlib's object API
(no pyplot: no global state, no GUI backend).

- the locate proxies' z-scores and S(ℓ) against depth, ℓ* marked;
- S(ℓ) against bridge validation MSE per swept layer;
- the methods' trade-off: the first lower-is-better metric of the records against their first
  higher-is-better one (Gen.PPL against entropy for the built-in metrics), with its Pareto front;
- where rows were trained at several budget scales (docs/method.md#budget-scales), Gen.PPL against
  training FLOPs, one line per row through its scales, with the Pareto front over every row and scale;

points are labelled where the labels can be read: placed by adjustText so that no label covers
another or a point, legends beside the axes (`overlapping_texts` finds any two that still overlap;
tests/test_plot_labels.py checks the committed records' plots with it);

and the page's picture (`page_picture`, ``leaderboard.png``): each group's ranked columns of
the methods and proxies tables, drawn from the very tables the page shows, with the records
they pool named on it and, for a machine, in a PNG text chunk (`render.citation`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd

from dihal_bench.leaderboard.aggregate import (
    MATCHED,
    Table,
    arrow,
    by_row_then_scale,
    pareto_front,
    scaled_rows,
    summarise,
    value_columns,
)
from dihal_bench.leaderboard.degenerate import degenerate_seeds
from dihal_bench.leaderboard.read import Group, one_line
from dihal_bench.leaderboard.render import (
    CITATION_KEY,
    cell,
    citation,
    provenance,
    seeds_note,
)

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


@dataclass(frozen=True)
class Drawing:
    """A plot before it is rendered: what `overlapping_texts` measures."""

    figure: object  # matplotlib.figure.Figure
    caption: str


#: adjustText's budget: its iterations stop when no label overlaps or after this many. A count,
#: not seconds: a time limit stopped a busy machine's placement early, so the same records drew
#: different plots under load. What it leaves overlapping, `separate_labels` parts.
LABEL_ITERATIONS = 300


def place_labels(axes, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str]) -> None:
    """Each point's label beside it, moved by adjustText away from the other labels and the points,
    then any pair it left overlapping parted (`separate_labels`), with a thin line joining a moved
    label to its point. The layout is settled first and the labels kept out of it, so that moving
    them cannot move the axes under them."""
    from adjustText import adjust_text

    texts = []
    for x, y, label in zip(xs, ys, labels):
        text = axes.text(x, y, plot_text(label), fontsize="small", parse_math=False)
        text.set_in_layout(False)
        texts.append(text)
    if not texts:
        return
    axes.figure.draw_without_rendering()
    adjust_text(texts, x=list(xs), y=list(ys), ax=axes, iter_lim=LABEL_ITERATIONS)
    separate_labels(axes, texts)
    to_display = axes.transData.transform
    for text, x, y in zip(texts, xs, ys):
        if abs(to_display(text.get_position()) - to_display((x, y))).max() > LEADER_MIN_PX:
            axes.annotate("", xy=(x, y), xytext=text.get_position(),
                          arrowprops={"arrowstyle": "-", "color": "grey", "linewidth": 0.5})


#: a label this many pixels or more from its point gets a line to it
LEADER_MIN_PX = 12


def separate_labels(axes, texts: list) -> None:
    """Part the labels adjustText left overlapping (its forces can settle into a cycle, and where
    depends on the font metrics of the matplotlib release): while two boxes overlap, the later
    label moves up until it clears the earlier one. Deterministic, and ends: each move lifts a
    label above another, at most a few moves per label."""
    renderer = axes.figure.canvas.get_renderer()
    for _ in range(4 * len(texts) ** 2):
        boxes = [text.get_window_extent(renderer) for text in texts]
        pair = next(((i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes))
                     if boxes[i].overlaps(boxes[j])), None)
        if pair is None:
            return
        below, above = pair
        x, y = axes.transData.transform(texts[above].get_position())
        lift = boxes[below].y1 + 2 - boxes[above].y0
        texts[above].set_position(axes.transData.inverted().transform((x, y + lift)))


def overlapping_texts(figure) -> list[tuple[str, str]]:
    """The pairs of texts drawn inside any axes of ``figure`` (point labels, annotations, legend
    entries) whose boxes, as the renderer lays them out, overlap by more than a pixel."""
    figure.draw_without_rendering()
    renderer = figure.canvas.get_renderer()
    boxes = []
    for axes in figure.axes:
        texts = [text for text in axes.texts if text.get_visible() and text.get_text()]
        legend = axes.get_legend()
        texts += legend.get_texts() if legend is not None else []
        boxes += [(text.get_text(), text.get_window_extent(renderer).expanded(1, 1).padded(-1)) for text in texts]
    return [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]


def plot_text(text) -> str:
    """``text`` for a matplotlib label: one line, at most PLOT_TEXT_MAX_CHARACTERS, and every
    ``$`` escaped (a pair would start mathtext, which fails on anything it cannot parse).
    Plots are drawn with usetex off (`STYLE`), so nothing else in a label is markup."""
    text = one_line(text)
    if len(text) > PLOT_TEXT_MAX_CHARACTERS:
        text = text[: PLOT_TEXT_MAX_CHARACTERS - 1] + "…"
    return text.replace("$", r"\$")


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(layout="constrained")
    FigureCanvasAgg(figure)  # a renderer to measure labels with, before the figure is saved
    return figure, figure.subplots()


def _title(axes, title: str, group: Group) -> None:
    axes.set_title(f"{plot_text(title)}\n{plot_text(group.title)}")


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()


def plot_proxies(group: Group, methods: Table | None) -> Drawing | None:
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
    axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the lines, never over them
    return Drawing(figure, "Locate proxies' z-scores and S(ℓ) against layer")


def plot_score_vs_bridge(group: Group, methods: Table | None) -> Drawing | None:
    """S(ℓ) against bridge validation MSE per swept layer (mean ± std over seeds)."""
    stats = summarise(pd.DataFrame(group.rows["layers"]), "layer", ["score", "bridge_mse"], sort=True)
    stats = stats[(stats["score_n"] > 0) & (stats["bridge_mse_n"] > 0)]
    if stats.empty:
        return None
    figure, axes = _figure()
    axes.errorbar(stats["score_mean"], stats["bridge_mse_mean"], xerr=stats["score_std"].fillna(0),
                  yerr=stats["bridge_mse_std"].fillna(0), fmt="o", capsize=3)
    axes.set(xlabel="locate score S(ℓ)", ylabel="bridge validation MSE (standardised)")
    _title(axes, "Score vs bridge loss per swept layer", group)
    place_labels(axes, stats["score_mean"], stats["bridge_mse_mean"], [f"ℓ={layer}" for layer in stats.index])
    return Drawing(figure, "S(ℓ) against bridge validation MSE per swept layer")


def plot_tradeoff(group: Group, methods: Table | None) -> Drawing | None:
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
        reference = not row["budget"].startswith(MATCHED)  # "matched ×4" at a budget scale
        axes.scatter(*point, marker="s" if reference else "o", color="C0",
                     facecolors="none" if reference else None)
    points = list(labels)
    front = sorted(points[i] for i in pareto_front(points))
    if len(front) > 1:
        axes.plot([p for p, _ in front], [q for _, q in front], color="grey", linestyle="--", label="Pareto front")
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the points, never over a label
    titles = {name: f"{group.metrics[name]['display_name']}{arrow(directions[name])}" for name in (x, y)}
    for name, values, set_scale in ((x, table[f"{x}_mean"], axes.set_xscale), (y, table[f"{y}_mean"], axes.set_yscale)):
        if (values > 0).all() and values.max() / values.min() > LOG_SCALE_SPAN:
            set_scale("log")
            titles[name] += " (log scale)"
    axes.set(xlabel=plot_text(titles[x]), ylabel=plot_text(titles[y]))
    names = f"{group.metrics[y]['display_name']} against {group.metrics[x]['display_name']}"
    _title(axes, f"{names} per method (□ = reference outside budget)", group)
    # after the scales are set: adjustText places labels in display space
    place_labels(axes, [p for p, _ in points], [q for _, q in points], [" / ".join(shared) for shared in labels.values()])
    return Drawing(figure, f"{names} per method, with the Pareto front")


#: the metric the budget-scale plot puts against training FLOPs
SCALED_METRIC = "gen_ppl"


def scale_points(group: Group) -> pd.DataFrame:
    """One point per (row, scale) that the compute plot can place: each trained row of a group with
    budget scales (`scaled_rows` says whether it has them), with positive training FLOPs and Gen.PPL
    on some seed, in the methods table's row order then by scale. Columns: row, scale, method, train
    PFLOP and Gen.PPL (mean, min and max over seeds), and whether any seed flags the label degenerate."""
    if SCALED_METRIC not in group.metrics or scaled_rows(group).empty:
        return pd.DataFrame()
    frame = pd.DataFrame(group.rows["methods"])
    frame = frame[(frame["train_pflop"] > 0) & (frame[SCALED_METRIC] > 0)]  # NaN compares False: left out
    points = (by_row_then_scale(frame).groupby("method", sort=False)
              .agg(row=("row", "first"), scale=("scale", "first"), train_pflop=("train_pflop", "mean"),
                   mean=(SCALED_METRIC, "mean"), low=(SCALED_METRIC, "min"), high=(SCALED_METRIC, "max"))
              .reset_index())
    points["degenerate"] = [bool(degenerate_seeds(group.entries, label)) for label in points["method"]]
    return points


#: the line style and marker of the compute plot's rows, one pair per ten rows (the colour cycle's length)
SCALE_STYLES = (("-", "o"), ("--", "s"), ("-.", "^"))


def untrained_levels(group: Group) -> dict[str, float]:
    """Each row that trains nothing (zero training FLOPs) -> its Gen.PPL, the mean over seeds; in the
    methods table's order, rows without a positive Gen.PPL left out."""
    frame = pd.DataFrame(group.rows["methods"])
    frame = frame[(frame["train_pflop"] == 0) & (frame[SCALED_METRIC] > 0)]
    return frame.groupby("row", sort=False)[SCALED_METRIC].mean().to_dict()


def plot_budget_scales(group: Group, methods: Table | None) -> Drawing | None:
    """Gen.PPL against training FLOPs (both log), one line per row through its budget scales with the
    seeds' min–max shaded, and the Pareto front over every row and scale (the lowest Gen.PPL at no more
    training FLOPs) as a dashed step; a degenerate label hollow. The rows that train nothing (the intact
    backbone, the references, the skip control) are dotted levels across, labelled at the left: what a
    trained row has to get below. Only for a group with budget scales: at one scale per row, compute is
    the methods table's column, not an axis."""
    points = scale_points(group)
    if points.empty:
        return None
    from matplotlib.ticker import LogFormatter

    points["flops"] = points["train_pflop"] * 1e15
    figure, axes = _figure()
    ends = []  # each row's largest scale, where its one label goes
    for index, (row, line) in enumerate(points.groupby("row", sort=False)):
        # ten colours, then the same ten dashed with square markers: no two rows look alike
        colour, (dashes, marker) = f"C{index % 10}", SCALE_STYLES[index // 10 % len(SCALE_STYLES)]
        axes.plot(line["flops"], line["mean"], color=colour, linewidth=1.2, linestyle=dashes)
        axes.fill_between(line["flops"], line["low"], line["high"], color=colour, alpha=0.15, linewidth=0)
        for degenerate, kind in line.groupby("degenerate", sort=True):
            axes.scatter(kind["flops"], kind["mean"], color=colour, zorder=3, marker=marker,
                         facecolors="none" if degenerate else None)
        ends.append((line["flops"].iat[-1], line["mean"].iat[-1], row))
    left = points["flops"].min()
    for row, level in untrained_levels(group).items():
        axes.axhline(level, color="grey", linestyle=":", linewidth=0.9)
        ends.append((left, level, f"{row} (no training here)"))
    front = sorted((points.loc[i, "flops"], points.loc[i, "mean"])
                   for i in pareto_front(list(zip(-points["flops"], points["mean"]))))
    if len(front) > 1:
        axes.step([x for x, _ in front], [y for _, y in front], where="post", color="grey", linestyle="--",
                  label="Pareto front")
        axes.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside the lines, never over a label
    axes.set_xscale("log")
    axes.set_yscale("log")
    # perplexities as plain numbers (60, not 6×10¹); FLOPs keep powers of ten
    axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axes.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    name = group.metrics[SCALED_METRIC]["display_name"]
    axes.set(xlabel="training FLOPs (log scale)",
             ylabel=plot_text(f"{name}{arrow(group.metrics[SCALED_METRIC]['higher_is_better'])} (log scale)"))
    _title(axes, f"{name} against training compute per budget scale (○ = degenerate)", group)
    place_labels(axes, [x for x, _, _ in ends], [y for _, y, _ in ends], [row for _, _, row in ends])
    return Drawing(figure, f"{name} against training FLOPs, each row through its budget scales (band: "
                           "min–max over seeds), with the Pareto front; dotted: the rows that train nothing")


def frontier_settings(group: Group, axis: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    """One point per (row, setting) of the group's frontiers along ``axis`` (docs/method.md#frontiers), the
    row's own setting among them, with a positive Gen.PPL and every one of ``metrics``: the means over
    seeds, each row's settings ascending."""
    if not group.rows["frontier"] or not {"gen_ppl", *metrics} <= set(group.metrics):
        return pd.DataFrame()
    frame = pd.DataFrame(group.rows["frontier"])
    frame = frame[(frame["axis"] == axis) & (frame["gen_ppl"] > 0) & frame[list(metrics)].notna().all(axis=1)]
    return (frame.groupby(["method", "setting"], sort=False).agg(**{name: (name, "mean") for name in metrics})
            .reset_index().sort_values(["method", "setting"], kind="stable"))


def frontier_lines(points: pd.DataFrame, x: str) -> tuple:
    """A figure with one line of Gen.PPL against ``x`` per row of ``points``; with each row's last point,
    where its label goes once the axes are set."""
    figure, axes = _figure()
    ends = []
    for index, (method, line) in enumerate(points.groupby("method", sort=False)):
        axes.plot(line[x], line["gen_ppl"], marker="o", color=f"C{index % 10}", linewidth=1.2)
        ends.append((line[x].iat[-1], line["gen_ppl"].iat[-1], method))
    return figure, axes, ends


def plot_temperature_frontier(group: Group, methods: Table | None) -> Drawing | None:
    """Gen.PPL (log) against entropy, one line per row through its temperatures, labelled at its
    highest: where two lines pass the same entropy, the lower one writes the better text at it."""
    points = frontier_settings(group, "temperature", ("gen_ppl", "entropy"))
    if points.empty:
        return None
    figure, axes, ends = frontier_lines(points, "entropy")
    from matplotlib.ticker import LogFormatter

    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))  # 40, not 4×10¹
    axes.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    names = {key: group.metrics[key]["display_name"] for key in ("gen_ppl", "entropy")}
    axes.set(xlabel=plot_text(f"{names['entropy']} ↑"), ylabel=plot_text(f"{names['gen_ppl']} ↓ (log scale)"))
    _title(axes, f"{names['gen_ppl']} against {names['entropy']} along temperature", group)
    place_labels(axes, [x for x, _, _ in ends], [y for _, y, _ in ends], [method for _, _, method in ends])
    return Drawing(figure, f"{names['gen_ppl']} against {names['entropy']}, each row through its temperatures "
                           "(means over seeds; the label at its highest): compare rows at matched entropy")


def one_two_five(value: float, _position=None) -> str:
    """A log axis's tick label: the plain number (20000, not 2e+04) at 1, 2 and 5 times a power of ten,
    none between, so an axis spanning decades stays readable."""
    if value <= 0:
        return ""
    leading = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if min(abs(leading - mark) for mark in (1, 2, 5)) < 1e-6 else ""


def plot_steps_frontier(group: Group, methods: Table | None) -> Drawing | None:
    """Gen.PPL against the number of denoising steps (NFE), both log, one line per diffusion row through
    its steps, labelled at its most: what a row's quality costs in sampling passes."""
    points = frontier_settings(group, "diffusion_steps", ("gen_ppl",))
    if points.empty:
        return None
    figure, axes, ends = frontier_lines(points, "setting")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    axes.set_xscale("log")
    axes.set_yscale("log")
    # a tick at each step count drawn, as the count (25, not 2.5×10¹); perplexities as plain numbers
    axes.set_xticks(sorted(set(points["setting"])))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axes.xaxis.set_minor_formatter(NullFormatter())
    for formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
        formatter(FuncFormatter(one_two_five))
    name = group.metrics["gen_ppl"]["display_name"]
    axes.set(xlabel="denoising steps (NFE, log scale)", ylabel=plot_text(f"{name} ↓ (log scale)"))
    _title(axes, f"{name} against denoising steps", group)
    place_labels(axes, [x for x, _, _ in ends], [y for _, y, _ in ends], [method for _, _, method in ends])
    return Drawing(figure, f"{name} against the number of denoising steps, each diffusion row through its steps "
                           "(means over seeds; the label at its most): what its quality costs in sampling passes")


#: File stem -> plot. Stems are fixed, not built from metric names, so links to them hold.
PLOTS: dict[str, Callable[[Group, Table | None], Drawing | None]] = {
    "proxies_vs_layer": plot_proxies,
    "score_vs_bridge_mse": plot_score_vs_bridge,
    "methods_tradeoff": plot_tradeoff,
    "gen_ppl_vs_train_flops": plot_budget_scales,
    "gen_ppl_vs_entropy": plot_temperature_frontier,
    "gen_ppl_vs_steps": plot_steps_frontier,
}


def drawings(group: Group, methods: Table | None) -> dict[str, Drawing]:
    """The group's plots that have something to show, by file stem, not yet rendered."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        drawn = {stem: plot(group, methods) for stem, plot in PLOTS.items()}
    return {stem: drawing for stem, drawing in drawn.items() if drawing is not None}


def plots(group: Group, methods: Table | None) -> dict[str, Plot]:
    """The group's plots that have something to show, by file stem, as PNG."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return {stem: Plot(_png(drawing.figure), drawing.caption) for stem, drawing in drawings(group, methods).items()}


# --- the page's picture ---------------------------------------------------------------------

#: The picture's width: the window the page is checked in (tests/test_leaderboard_page.py). A
#: table that does not fit at MIN_TABLE_PT widens it.
PICTURE_WIDTH = 1400
PICTURE_DPI = 100
MARGIN = 30  # pixels
#: Type sizes in points.
TITLE_PT, HEADING_PT, SUBHEADING_PT, PROSE_PT, TABLE_PT, MIN_TABLE_PT = 16, 13, 11, 9, 10, 7
#: Line height as a multiple of the type size.
LINE_SPACING = 1.4
CELL_PADDING = 8  # pixels either side of a cell's text
#: A name longer than this is cut (with "…") in the picture; the page and the tables keep it.
PICTURE_NAME_MAX = 40
#: The tables the picture shows of each group, their ranked (``main``) columns only.
PICTURE_TABLES = ("methods", "proxies")
PICTURE_INTRO = ("The columns a reader ranks by, drawn from the same tables, in the same build, as "
                 "leaderboard.html, where the other columns, the plots and samples are. "
                 "↑: higher is better, ↓: lower is better.")
INK, MUTED, RULE, BAND = "#1f2328", "#59636e", "#8c959f", "#f3f6f9"


@dataclass
class _Sheet:
    """The picture's layout, top to bottom in pixels: what to draw where, measured with the
    renderer that then draws it, so that no text overlaps another."""

    renderer: object
    width: float = PICTURE_WIDTH
    y: float = MARGIN  # the top of the next line
    texts: list[tuple[float, float, str, dict]] = field(default_factory=list)  # x, baseline, text, style
    bands: list[tuple[float, float, float, float]] = field(default_factory=list)  # x, top, width, height
    rules: list[tuple[float, float, float]] = field(default_factory=list)  # x0, x1, y

    @property
    def inner(self) -> float:
        return PICTURE_WIDTH - 2 * MARGIN

    def measure(self, text: str, size: float, bold: bool = False) -> float:
        from matplotlib.font_manager import FontProperties

        prop = FontProperties(size=size, weight="bold" if bold else "normal")
        return self.renderer.get_text_width_height_descent(text, prop, ismath=False)[0]

    def put(self, x: float, top: float, text: str, size: float, *, bold=False, color=INK, right=False) -> None:
        pixels = size * PICTURE_DPI / 72
        baseline = top + (LINE_SPACING - 1) * pixels / 2 + 0.8 * pixels  # DejaVu's ascent is ~0.76 em
        self.texts.append((x, baseline, text, {"fontsize": size, "fontweight": "bold" if bold else "normal",
                                               "color": color, "ha": "right" if right else "left"}))

    def line(self, text: str, size: float, *, bold=False, color=INK, gap: float = 0) -> None:
        """``text`` wrapped at spaces to the picture's width, below what is there."""
        self.y += gap
        for piece in wrap(one_line(text), self.inner, lambda t: self.measure(t, size, bold)):
            self.put(MARGIN, self.y, piece, size, bold=bold, color=color)
            self.y += size * PICTURE_DPI / 72 * LINE_SPACING

    def table(self, table: Table) -> None:
        columns = [column for column in table.columns if column.main]
        rows = [[picture_text(cell(table, column, row, usual=table.seeds), PICTURE_NAME_MAX)
                 for column in columns] for row in range(len(table.numbers))]
        # an arrow stays with the word it follows when a header wraps
        headers = [picture_text(column.header, PICTURE_NAME_MAX).replace(" ↑", "\xa0↑").replace(" ↓", "\xa0↓")
                   for column in columns]
        size = TABLE_PT
        widths, wrapped = self.columns(headers, rows, size)
        while sum(widths) > self.inner and size > MIN_TABLE_PT:
            size = max(MIN_TABLE_PT, size - 0.5)
            widths, wrapped = self.columns(headers, rows, size)
        self.width = max(self.width, sum(widths) + 2 * MARGIN)
        height = size * PICTURE_DPI / 72 * LINE_SPACING
        edges = [MARGIN + sum(widths[:i]) for i in range(len(widths) + 1)]
        lines = max(len(header) for header in wrapped)
        texts = [column.kind == "text" for column in columns]
        for i, header in enumerate(wrapped):  # headers sit on the rule, as on the page
            for j, piece in enumerate(header):
                self.put_cell(edges, i, self.y + (lines - len(header) + j) * height, piece, size, texts[i], bold=True)
        self.y += lines * height + 2
        self.rules.append((edges[0], edges[-1], self.y))
        for number, row in enumerate(rows):
            if number % 2:
                self.bands.append((edges[0], self.y, edges[-1] - edges[0], height))
            for i, text in enumerate(row):
                self.put_cell(edges, i, self.y, text, size, texts[i])
            self.y += height
        self.rules.append((edges[0], edges[-1], self.y))

    def put_cell(self, edges, i, top, text, size, is_text, *, bold=False) -> None:
        """Names left-aligned, numbers right-aligned, as on the page."""
        x = edges[i] + CELL_PADDING if is_text else edges[i + 1] - CELL_PADDING
        self.put(x, top, text, size, bold=bold, right=not is_text)

    def columns(self, headers: list[str], rows: list[list[str]], size: float) -> tuple[list[float], list[list[str]]]:
        """Each column's width at ``size`` and its header wrapped at spaces to that width. A
        column is as wide as its widest cell and header word, and wider, up to its header's
        width on one line, as far as the picture's width leaves room: the same cap for all, the
        largest that fits. A cell never wraps."""
        least = [max([self.measure(row[i], size) for row in rows]
                     + [self.measure(word, size, True) for word in header.split(" ")])
                 for i, header in enumerate(headers)]
        whole = [self.measure(header, size, True) for header in headers]
        room = self.inner - 2 * CELL_PADDING * len(headers)

        def widths(cap: float) -> list[float]:
            return [max(low, min(one_line, cap)) for low, one_line in zip(least, whole)]

        low, high = 0.0, max(whole)
        for _ in range(20):  # bisection to well under a pixel
            middle = (low + high) / 2
            low, high = (middle, high) if sum(widths(middle)) <= room else (low, middle)
        chosen = widths(low if sum(widths(high)) > room else high)
        wrapped = [wrap(header, width + 0.5, lambda t: self.measure(t, size, True))
                   for header, width in zip(headers, chosen)]
        return [width + 2 * CELL_PADDING for width in chosen], wrapped

    def png(self, metadata: dict[str, str]) -> bytes:
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Rectangle

        height = self.y + MARGIN
        figure = Figure(figsize=(self.width / PICTURE_DPI, height / PICTURE_DPI), dpi=PICTURE_DPI)

        def at(x, y):  # pixels from the top left -> figure fraction
            return x / self.width, 1 - y / height

        for x, top, width, tall in self.bands:
            figure.add_artist(Rectangle(at(x, top + tall), width / self.width, tall / height, color=BAND,
                                        transform=figure.transFigure, zorder=0))
        for x0, x1, y in self.rules:
            (u0, v), (u1, _) = at(x0, y), at(x1, y)
            figure.add_artist(Line2D([u0, u1], [v, v], color=RULE, linewidth=1, transform=figure.transFigure))
        for x, baseline, text, style in self.texts:
            # usetex and mathtext off: every text here is literal, names from records included
            figure.text(*at(x, baseline), text, va="baseline", usetex=False, parse_math=False, **style)
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=PICTURE_DPI, facecolor="white",
                       metadata={"Software": None, **metadata})
        return buffer.getvalue()


def picture_text(text, limit: int) -> str:
    """``text`` on one line and at most ``limit`` characters (cut with "…")."""
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def wrap(text: str, width: float, measure: Callable[[str], float]) -> list[str]:
    """``text`` in lines no wider than ``width`` (by ``measure``), broken at spaces; a word
    wider than a line is cut (with "…") to fit."""
    lines: list[str] = []
    for word in text.split(" "):
        word = picture_text(word, 200)  # so that cutting it to fit takes few measurements
        while measure(word) > width and len(word) > 1:
            word = word[:-2] + "…"
        if lines and measure(f"{lines[-1]} {word}") <= width:
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    return lines


def page_picture(built: Sequence[tuple[Group, dict[str, Table], dict[str, Plot]]]) -> bytes:
    """``leaderboard.png``: per group, its title, the records it pools (file names and seeds),
    the n of its tables and their ranked columns, each cell the text the page shows."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context(STYLE):
        sheet = _Sheet(FigureCanvasAgg(Figure(dpi=PICTURE_DPI)).get_renderer())
        sheet.line("dihal-bench leaderboard", TITLE_PT, bold=True)
        sheet.line(PICTURE_INTRO, PROSE_PT, color=MUTED)
        for group, tables, _ in built:
            sheet.line(picture_text(group.title, 200), HEADING_PT, bold=True, gap=18)
            records = provenance(group.sources, group.unverified)
            sheet.line(f"Corpus: {', '.join(sorted(group.corpora))}. {records}", PROSE_PT, color=MUTED)
            for name in PICTURE_TABLES:
                table = tables.get(name)
                if table is None or table.numbers.empty:
                    continue
                sheet.line(table.title, SUBHEADING_PT, bold=True, gap=8)
                sheet.line(seeds_note(table), PROSE_PT, color=MUTED)
                sheet.table(table)
        return sheet.png({CITATION_KEY: citation([group for group, _, _ in built])})
