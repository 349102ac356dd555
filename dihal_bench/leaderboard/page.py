"""``leaderboard.html``: every group on one self-contained page a reader prefers to the table
files — no request leaves the page (style, sort script and plots are inline).

Per group: the methods table cut to the columns a reader ranks by (method, budget, the metrics
that have a better direction, latency) with the rest one click away, the plots, the proxy and
layer tables, a few samples of each method and a sample viewer (`viewer_block`: two methods side
by side, sorted by NLL or length, from each record's samples file where it is beside the record).
Each table says its n (seeds) once; a cell says its own only where it has fewer. Any column
sorts by a click on its header. A number and its spread stay on one line; a number is a link to
where it comes from: hovering shows each seed's value and record, a click opens the group's
sources, the record files (linked) and, per method and seed, the sample file the record names
(linked where the job store is at hand), the commit and the machine. The page fits a
1400-pixel-wide window: a name breaks inside a word only where the word is longer than
`render.LONGEST_UNBROKEN`, so no cell widens the page and no usual name is cut in two. The
records the page was built from are named in each group's section and, for a machine, in a
``<meta name="dihal-bench-records">`` element (`render.citation`), which the page's picture
(`plot.page_picture`) carries too.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dihal_bench.api.metrics import invalid_reason
from dihal_bench.errors import DihalError
from dihal_bench.leaderboard.aggregate import Column, Table
from dihal_bench.leaderboard.plot import Plot
from dihal_bench.leaderboard.read import Group, one_line
from dihal_bench.leaderboard.render import (
    CITATION_KEY,
    breakable,
    cell,
    citation,
    format_number,
    html_document,
    html_table,
    provenance,
    seeds_note,
    sort_key,
)

TITLE = "dihal-bench leaderboard"
#: The columns one click away come in tables of at most this many (and the row's name), so
#: that any number of them fits the window.
DETAIL_COLUMNS = 8
#: At most this many samples per method (records keep five).
SAMPLES_SHOWN = 5
#: At most this many samples per method in the sample viewer, taken evenly across the pooled seeds:
#: a samples file holds every sample of a run, and the page must stay a page.
VIEWER_SAMPLES = 64

PAGE_STYLE = """
*, *::before, *::after { box-sizing: border-box; }
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #1f2328; max-width: 1360px;
       margin: 1.5rem auto 4rem; padding: 0 1.25rem; overflow-wrap: anywhere; }
h1 { font-size: 1.6rem; margin: 0 0 .4rem; }
h2 { font-size: 1.3rem; margin: 2.2rem 0 .3rem; padding-bottom: .3rem; border-bottom: 1px solid #d0d7de; }
h3 { font-size: 1.1rem; margin: 1.8rem 0 .2rem; }
p { margin: .3rem 0; }
p.meta, p.n { color: #424a53; font-size: .9rem; }
p.note { color: #59636e; font-size: .85rem; max-width: 110ch; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .875rem; font-variant-numeric: tabular-nums; }
th, td { padding: .3rem .55rem; text-align: right; vertical-align: top; border-bottom: 1px solid #e6e8eb; }
th { vertical-align: bottom; font-weight: 600; border-bottom: 2px solid #8c959f; }
th.text, td.text { text-align: left; }
/* names break only where `breakable` marks them */
th, td { overflow-wrap: break-word; }
.word { white-space: nowrap; }
/* a number and its "± spread" never part; the spread in smaller type, the cells compact, so that a
   methods table of a dozen such columns fits the window; one still wider scrolls in its own box */
td.num { white-space: nowrap; }
td.num .sd { font-size: .8em; color: #424a53; }
table.sortable { font-size: .8125rem; }
table.sortable th, table.sortable td { padding: .3rem .35rem; }
div.wide { max-width: 100%; overflow-x: auto; }
td.num a { color: inherit; text-decoration: none; border-bottom: 1px dotted #8c959f; }
td.num a:hover { color: #0b57d0; border-bottom-color: #0b57d0; }
table.sources td { text-align: left; }
tbody tr:hover { background: #f3f6f9; }
table.sortable th { cursor: pointer; }
table.sortable th:hover { background: #eef1f4; }
th[aria-sort="ascending"]::after { content: " \\25B2"; font-size: .7em; }
th[aria-sort="descending"]::after { content: " \\25BC"; font-size: .7em; }
details { margin: .4rem 0; }
summary { cursor: pointer; color: #0b57d0; }
.plots { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(100%, 560px), 1fr)); gap: 1rem 2rem; }
figure { margin: 0; }
figure img { width: 100%; height: auto; }
figcaption { font-size: .85rem; color: #59636e; }
.samples summary { display: flex; gap: .6rem; }
.samples .method { flex: 0 1 auto; max-width: 40%; font-weight: 600; color: #1f2328; }
.samples .preview { flex: 1; min-width: 0; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; color: #59636e; }
.samples ol { margin: .3rem 0 .8rem; }
.samples pre, .viewer pre { margin: .2rem 0; padding: .4rem .6rem; background: #f6f8fa; border-radius: 4px;
                            white-space: pre-wrap; overflow-wrap: anywhere; font: .85rem/1.4 ui-monospace, monospace; }
.viewer .controls { margin: .4rem 0; font-size: .875rem; }
.viewer .columns { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 1rem; }
.viewer select { max-width: 100%; font: inherit; }
.viewer .column select { width: 100%; }
.viewer ol { list-style: none; margin: .3rem 0; padding: 0; max-height: 36rem; overflow-y: auto; }
.viewer li { margin: 0 0 .5rem; }
.viewer .head, .viewer .origin { font-size: .8rem; color: #59636e; }
"""

#: The page's one script (the name is older than the sample viewer, its second part). Click (or
#: Enter on) a header: rows sort by that column, again to reverse. Cells sort by their data-sort
#: number where they have one, else by their text; a cell with no value (data-sort="") goes last
#: either way. A click on a number's link opens the <details> that holds its sources (a closed one
#: would hide its target). Each sample viewer (`viewer_block`) reads its samples from its
#: data-samples attribute and shows, in each of its two columns, the method chosen there, in the
#: order chosen above them (NLL per token or length in words, a sample without a value last); it
#: writes the samples as text nodes, so that no sample is ever read as HTML.
SORT_SCRIPT = """
function compareKeys(a, b, ascending) {
  if (a === "" || b === "") return (a === "") - (b === "");
  const x = Number(a), y = Number(b);
  const order = Number.isNaN(x) || Number.isNaN(y) ? a.localeCompare(b) : x - y;
  return ascending ? order : -order;
}
for (const table of document.querySelectorAll("table.sortable")) {
  const headers = [...table.tHead.rows[0].cells];
  headers.forEach((header, column) => {
    const sort = () => {
      const ascending = header.getAttribute("aria-sort") !== "ascending";
      headers.forEach(other => other.removeAttribute("aria-sort"));
      header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const key = row => row.cells[column].dataset.sort ?? row.cells[column].textContent;
      const body = table.tBodies[0];
      body.append(...[...body.rows].sort((a, b) => compareKeys(key(a), key(b), ascending)));
    };
    header.tabIndex = 0;
    header.title = (header.title ? header.title + ". " : "") + "Click to sort (again to reverse).";
    header.addEventListener("click", sort);
    header.addEventListener("keydown", event => {
      if (event.key === "Enter" || event.key === " ") { event.preventDefault(); sort(); }
    });
  });
}
function openTarget() {
  const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  for (let node = target; node; node = node.parentElement) if (node.tagName === "DETAILS") node.open = true;
  if (target) target.scrollIntoView();
}
addEventListener("hashchange", openTarget);
openTarget();
""" + """
function sampleOrder(order) {
  if (!order) return () => 0;  // as listed: seed by seed, in sample order (the sort is stable)
  const [key, direction] = order.split("-");
  return (a, b) => {
    const x = a[key], y = b[key];
    if (x === null || y === null) return (x === null) - (y === null);  // no value: last either way
    return direction === "asc" ? x - y : y - x;
  };
}
function showSamples(viewer, methods, column) {
  const method = methods[column.querySelector("select").value];
  const list = column.querySelector("ol");
  column.querySelector(".origin").textContent = method ? method.origin : "";
  list.replaceChildren();
  if (!method) return;
  const number = (value, digits) => value === null ? "\u2014" : value.toFixed(digits);
  const rows = [...method.samples].sort(sampleOrder(viewer.querySelector("select.viewer-sort").value));
  for (const sample of rows) {
    const item = document.createElement("li");
    item.dataset.method = method.method;
    item.dataset.nll = sample.nll === null ? "" : sample.nll;
    item.dataset.words = sample.words;
    const head = document.createElement("div");
    head.className = "head";
    head.textContent = `seed ${sample.seed}, #${sample.index}: NLL/token ${number(sample.nll, 3)}`
      + (sample.tokens === null ? "" : ` over ${sample.tokens} tokens`) + `, ${sample.words} words`
      + (sample.valid === false ? ", invalid" + (sample.reason ? ` (${sample.reason})` : "") : "");
    const text = document.createElement(sample.text.trim() ? "pre" : "em");
    text.textContent = sample.text.trim() ? sample.text : "(empty)";
    item.append(head, text);
    list.append(item);
  }
}
for (const viewer of document.querySelectorAll("div.viewer")) {
  const methods = JSON.parse(viewer.dataset.samples);
  const columns = [...viewer.querySelectorAll(".column")];
  const refresh = () => columns.forEach(column => showSamples(viewer, methods, column));
  for (const select of viewer.querySelectorAll("select")) select.addEventListener("change", refresh);
  refresh();
}
"""

INTRO = ("Run records pooled by suite, backbone and evaluator. ↑: higher is better, ↓: lower is better, "
         "as each metric declares; a column without an arrow has no better direction. "
         "Click a column header to sort by it; hover over a number for each seed's value and record, "
         "click it for its records and sample files.")


@dataclass
class Sources:
    """Where the page links a number to: the record files (``results_dir``) and the sample files
    their job stores hold, as paths relative to the page's folder (``out_dir``)."""

    results_dir: Path | None = None
    out_dir: Path | None = None
    _records: dict[str, dict] = field(default_factory=dict)
    _samples: dict[str, dict | None] = field(default_factory=dict)

    def record(self, name: str) -> dict:
        """The record file's top level as stored (its job store and environment), {} where unreadable."""
        if name not in self._records:
            try:
                self._records[name] = json.loads((self.results_dir / name).read_text(encoding="utf-8"))
            except (OSError, ValueError, TypeError):
                self._records[name] = {}
        return self._records[name]

    def sample_file(self, name: str) -> dict[tuple[int, str], list[str]] | None:
        """The texts of the record's samples file (``<stem>.samples.jsonl`` beside it, as `dihal-bench run`
        and `dihal-bench samples export` write it) by (seed, method), in sample order; None where there
        is none. DihalError naming the file where it cannot be read as one."""
        from dihal_bench.study.sample_export import samples_path

        if self.results_dir is None:
            return None
        if name not in self._samples:
            path = samples_path(self.results_dir / name)
            self._samples[name] = read_sample_file(path) if path.is_file() else None
        return self._samples[name]

    def href(self, path: Path) -> str:
        return Path(os.path.relpath(path.resolve(), self.out_dir.resolve())).as_posix()

    def record_link(self, name: str) -> str:
        if self.results_dir is None or self.out_dir is None:
            return html.escape(name)
        return f'<a href="{html.escape(self.href(self.results_dir / name))}">{html.escape(name)}</a>'

    def samples_link(self, name: str, path: str) -> str:
        """The sample file a record names: linked where its job store is at hand in the records' project
        (``runs/`` beside ``runs/results``), else its path and why. A store elsewhere (a temporary
        folder) is not linked: a published page must not point into one machine's file system."""
        jobs = self.record(name).get("jobs") if self.results_dir is not None and self.out_dir is not None else None
        store = Path(jobs) if isinstance(jobs, str) and jobs else None
        project = self.results_dir.resolve().parent if self.results_dir is not None else None
        if store is not None and (store / path).is_file() and (store / path).resolve().is_relative_to(project):
            return f'<a href="{html.escape(self.href(store / path))}">{html.escape(path)}</a>'
        return (f'<span title="in the job store of the run that made the record, not at hand here">'
                f"{html.escape(path)}</span>")


def read_sample_file(path: Path) -> dict[tuple[int, str], list[str]]:
    """A samples file's texts by (seed, method), each list in sample order (its lines' ``index``)."""
    found: dict[tuple[int, str], dict[int, str]] = {}
    number = 0
    try:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                row = json.loads(line)
                found.setdefault((int(row["seed"]), str(row["method"])), {})[int(row["index"])] = str(row["text"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise DihalError(f"{path} is not a readable samples file (line {number}: {exc}); delete it, or write "
                         f"it again with `dihal-bench samples export`") from None
    for (seed, method), texts in found.items():
        if sorted(texts) != list(range(len(texts))):
            raise DihalError(f"{path}: the samples of {method} (seed {seed}) are not numbered 0 to "
                             f"{len(texts) - 1}; write it again with `dihal-bench samples export`")
    return {key: [texts[i] for i in range(len(texts))] for key, texts in found.items()}


#: table name -> the kind of the group's rows it is made of, and the columns that name a row in both
ROW_KEYS = {"methods": ("methods", ("method",)), "budget": ("methods", ("method",)),
            "steps": ("steps", ("steps", "sampler")),
            "layers": ("layers", ("layer",)), "proxies": ("proxies", ("proxy",))}


def anchor(group: Group, row: int | None = None) -> str:
    """The id of the group's sources, or of one methods-table row's."""
    return f"{group.folder}-sources" if row is None else f"{group.folder}-sources-{row}"


def per_seed(group: Group, table: Table, row: int) -> list[dict]:
    """The group's rows (one per seed) that the table's ``row`` pools."""
    kind, keys = ROW_KEYS.get(table.name, (None, ()))
    if kind is None or not all(key in table.numbers.columns for key in keys):
        return []
    wanted = [table.numbers.iloc[row][key] for key in keys]
    return [raw for raw in group.rows[kind] if [raw.get(key) for key in keys] == wanted]


def seeds_title(rows: list[dict], key: str) -> str:
    """Each seed's own value of ``key`` and the record it is from, for a number's tooltip."""
    lines = [f"seed {raw['seed']}: {format_number(raw[key])} ({raw['record']})" for raw in rows
             if isinstance(raw.get(key), (int, float)) and not isinstance(raw.get(key), bool)
             and math.isfinite(raw[key])]
    return "\n".join(lines) or "pooled over the records in this group's sources"


def value_html(text: str) -> str:
    """A cell's ``mean ± spread``: the spread in smaller type (the mean is what a reader ranks by,
    and the cell stays narrow enough for a wide table to fit the window without breaking it), joined
    by a no-break space too, for a reader that drops the style."""
    mean, sign, spread = text.partition(" ± ")
    if not sign:
        return html.escape(text)
    return f'{html.escape(mean)}<span class="sd">&nbsp;± {html.escape(spread)}</span>'


def page_table(group: Group, table: Table, columns: Sequence[Column], *, usual: int | None) -> str:
    """``columns`` of ``table`` as a sortable HTML table whose every number is a link to its sources,
    with each seed's value in its tooltip, and never breaks inside a number and its spread."""
    kinds = [' class="text"' if column.kind == "text" else "" for column in columns]
    head = "".join(f'<th scope="col"{kind}{_title(column.description)}>{breakable(column.header)}</th>'
                   for column, kind in zip(columns, kinds))
    rows = []
    for row in range(len(table.numbers)):
        seeds = per_seed(group, table, row)
        target = anchor(group, row if table.name == "methods" else None)
        tds = []
        for column in columns:
            text = cell(table, column, row, usual=usual)
            if column.kind == "text":
                tds.append(f'<td class="text">{breakable(text, names=True)}</td>')
                continue
            key = sort_key(table, column, row)
            shown = value_html(text)
            if text != "—":
                shown = (f'<a href="#{html.escape(target)}" title="{html.escape(seeds_title(seeds, column.key))}">'
                         f"{shown}</a>")
            tds.append(f'<td class="num" data-sort="{key}">{shown}</td>')
        rows.append(f"<tr>{''.join(tds)}</tr>")
    return ('<div class="wide"><table class="leaderboard sortable">\n<thead><tr>' + head + "</tr></thead>\n<tbody>\n"
            + "\n".join(rows) + "\n</tbody>\n</table></div>\n")


def _title(text: str) -> str:
    return f' title="{html.escape(one_line(text))}"' if text else ""


def sources_block(group: Group, methods: Table | None, sources: Sources) -> str:
    """Where the group's numbers come from: each record (linked) with its seeds, commit and machine,
    and per method and seed the record and the sample file it names."""
    items = []
    for name, seeds in group.sources.items():
        environment = sources.record(name).get("environment") or {} if sources.results_dir else {}
        commit = str(environment.get("git_revision") or "not recorded")[:12]
        machine = (f"{environment['platform']}, {environment.get('cpu_count')} CPUs"
                   + (f", CUDA {environment['cuda']}" if environment.get("cuda") else "")
                   if environment.get("platform") else "not recorded")
        items.append(f"<li>{sources.record_link(name)}: seed{'s' if len(seeds) != 1 else ''} "
                     f"{', '.join(map(str, seeds))}; commit {html.escape(commit)}; machine {html.escape(machine)}"
                     f"{' (unverified: no seal)' if name in group.unverified else ''}</li>")
    table = ""
    if methods is not None and not methods.numbers.empty:
        body = []
        for row, method in enumerate(methods.numbers["method"]):
            runs = [(source, entry) for source, entry in group.entries if method in entry["methods"]]
            for i, (source, entry) in enumerate(runs):
                path = (entry["methods"][method].get("samples") or {}).get("path")
                samples = sources.samples_link(source, path) if isinstance(path, str) and path else "none"
                first = f' id="{html.escape(anchor(group, row))}"' if i == 0 else ""
                body.append(f"<tr{first}><td>{html.escape(methods.labels['name'][row]) if i == 0 else ''}</td>"
                            f"<td>{entry['seed']}</td><td>{sources.record_link(source)}</td><td>{samples}</td></tr>")
        table = ('<table class="sources">\n<thead><tr><th class="text">Method</th><th class="text">Seed</th>'
                 '<th class="text">Record</th><th class="text">Samples</th></tr></thead>\n<tbody>\n'
                 + "\n".join(body) + "\n</tbody>\n</table>\n")
    return (f'<details id="{html.escape(anchor(group))}"><summary>Where the numbers come from</summary>\n'
            f'<ul>{"".join(items)}</ul>\n{table}</details>\n')


def seeds_line(table: Table) -> str:
    """The table's n, said once for all its cells."""
    return f'<p class="n">{html.escape(seeds_note(table))}</p>\n'


def table_block(group: Group, table: Table) -> str:
    """A table's heading, n, the columns a reader ranks by, its note and the rest in <details>."""
    main = [column for column in table.columns if column.main]
    rest = [column for column in table.columns if not column.main]
    parts = [f"<h3>{html.escape(table.title)}</h3>\n", seeds_line(table),
             page_table(group, table, main, usual=table.seeds),
             f'<p class="note">{html.escape(table.note)}</p>\n']
    if rest:
        listed = ", ".join(column.header for column in rest)
        chunks = [rest[start:start + DETAIL_COLUMNS] for start in range(0, len(rest), DETAIL_COLUMNS)]
        parts.append(f"<details><summary>More columns: {html.escape(listed)}</summary>\n"
                     + "".join(page_table(group, table, [table.columns[0], *chunk], usual=table.seeds)
                               for chunk in chunks) + "</details>\n")
    return "".join(parts)


def metrics_block(table: Table) -> str:
    """The metrics' descriptions, one click away."""
    return (f"<details><summary>What the metrics measure</summary>\n{html_table(table, table.columns)}"
            f'<p class="note">{html.escape(table.note)}</p>\n</details>\n')


def plots_block(plots: dict[str, Plot]) -> str:
    if not plots:
        return ""
    figures = []
    for plot in plots.values():
        caption = html.escape(plot.caption)
        data = base64.b64encode(plot.png).decode("ascii")
        figures.append(f'<figure><img src="data:image/png;base64,{data}" alt="{caption}">'
                       f"<figcaption>{caption}</figcaption></figure>\n")
    return f'<h3>Plots</h3>\n<div class="plots">\n{"".join(figures)}</div>\n'


def _sample(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>" if text.strip() else "<em>(empty)</em>"


def samples_block(group: Group, methods: Table) -> str:
    """The first samples of each method that has them in its records, one <details> each."""
    if not group.samples:
        return ""
    names = dict(zip(methods.numbers["method"], methods.labels["name"]))
    items = []
    for method, (texts, origin) in group.samples.items():
        shown = texts[:SAMPLES_SHOWN]
        preview = one_line(shown[0]).strip() or "(empty)"
        samples = "".join(f"<li>{_sample(text)}</li>" for text in shown)
        items.append(f'<details><summary><span class="method">{html.escape(names.get(method, method))}</span>'
                     f'<span class="preview">{html.escape(preview)}</span></summary>\n'
                     f'<p class="note">The first {len(shown)} samples of {html.escape(origin)}.</p>\n'
                     f"<ol>{samples}</ol></details>\n")
    return ('<h3>Samples</h3>\n<p class="note">Unedited generations, as the run record keeps them; '
            f'click a method to read its samples.</p>\n<div class="samples">\n{"".join(items)}</div>\n')


def viewer_samples(source: str, entry: dict, name: str, sources: Sources) -> tuple[list[dict], str]:
    """A method's samples on one pooled seed for the viewer, each with its NLL per token, scored
    tokens, words and validity where the record keeps them (the NLLs always the record's own), and
    where they come from: the record's samples file, else the texts the record keeps."""
    from dihal_bench.study.sample_export import per_sample_values

    method = entry["methods"][name]
    stored = method.get("samples") or {}
    count = stored.get("count") if isinstance(stored.get("count"), int) else None
    texts = (sources.sample_file(source) or {}).get((entry["seed"], name))
    if texts is not None:
        if count is not None and len(texts) != count:
            raise DihalError(f"the samples file of {source} holds {len(texts)} samples of {name} (seed "
                             f"{entry['seed']}), the record {count}: write it again with "
                             f"`dihal-bench samples export`")
        origin = "its samples file"
    else:
        texts, origin = [str(text) for text in stored.get("examples") or []], "the texts the record keeps"
    values = per_sample_values(method, count if count is not None else -1)
    samples = []
    for index, text in enumerate(texts):
        nll, tokens = (values["nll"][index], values["nll_tokens"][index]) if values else (None, None)
        sample = {"seed": entry["seed"], "index": index, "text": text,
                  "nll": nll / tokens if isinstance(nll, (int, float)) and tokens else None,
                  "tokens": tokens if isinstance(tokens, int) else None, "words": len(text.split()),
                  "valid": (nll is not None) if values else None}
        reason = invalid_reason(text, tokens) if values and nll is None else None
        if reason is not None:  # the validity rule again, on the text and its count: why Gen.PPL left it out
            sample["reason"] = reason
        samples.append(sample)
    return samples, origin


def viewer_methods(group: Group, methods: Table, sources: Sources) -> list[dict]:
    """Each method of the methods table with its samples for the viewer: at most `VIEWER_SAMPLES`,
    taken evenly across the pooled seeds (each seed's first ones), listed seed by seed."""
    names = dict(zip(methods.numbers["method"], methods.labels["name"]))
    shown = []
    for name in names:
        per_seed, origins = [], {}
        for position, (source, entry) in enumerate(group.entries):
            if name in entry["methods"]:
                samples, origin = viewer_samples(source, entry, name, sources)
                per_seed.append([(sample["index"], position, sample) for sample in samples])
                origins.setdefault(origin, []).append(f"seed {entry['seed']} of {source}")
        everything = sorted((item for items in per_seed for item in items), key=lambda item: item[:2])
        taken = sorted(everything[:VIEWER_SAMPLES], key=lambda item: (item[1], item[0]))
        if not taken:
            continue
        said = "; ".join(f"{origin}: {', '.join(seeds)}" for origin, seeds in origins.items())
        shown.append({"method": name, "name": str(names[name]), "samples": [item[2] for item in taken],
                      "origin": f"{len(taken)} of the {len(everything)} samples at hand ({said})"})
    return shown


def attribute(text: str) -> str:
    """``text`` as the value of a single-quoted HTML attribute: ``& < > '`` escaped (so ``</`` too)."""
    return html.escape(text, quote=False).replace("'", "&#x27;")


def viewer_block(group: Group, methods: Table, sources: Sources) -> str:
    """Every method's samples (up to `VIEWER_SAMPLES` each) as data for the page's script: pick a
    method in each of two columns, sort both by NLL per token or by length."""
    shown = viewer_methods(group, methods, sources)
    if not shown:
        return ""
    # in a single-quoted attribute: JSON's many double quotes stay one character each
    data = json.dumps(shown, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    options = "".join(f'<option value="{i}">{html.escape(method["name"])}</option>' for i, method in enumerate(shown))

    def column(first: int | None) -> str:
        chosen = options if first is None else options.replace(f'<option value="{first}">',
                                                                  f'<option value="{first}" selected>', 1)
        none = '<option value="">(none)</option>' if first is None or first > 0 else ""
        return (f'<div class="column"><select aria-label="method">{none}{chosen}</select>'
                f'<p class="origin"></p><ol></ol></div>')

    orders = [("", "seed, then sample order"), ("nll-asc", "NLL/token, lowest first"),
              ("nll-desc", "NLL/token, highest first"), ("words-asc", "length, shortest first"),
              ("words-desc", "length, longest first")]
    sort = "".join(f'<option value="{value}">{html.escape(label)}</option>' for value, label in orders)
    note = (f"Up to {VIEWER_SAMPLES} samples per method, taken evenly across the pooled seeds: from each "
            "record's samples file (<record>.samples.jsonl, every sample of the run) where it is beside the record, "
            "else the texts the record keeps. NLL/token: the sample's mean token NLL under the evaluator (nats), as "
            "Gen.PPL counts it, where the record keeps it per sample; a sample Gen.PPL leaves out as invalid has "
            "none. Choose a method in each column to compare two side by side (needs JavaScript).")
    return (f'<h3>Sample viewer</h3>\n<p class="note">{html.escape(note)}</p>\n'
            f"<div class=\"viewer\" data-samples='{attribute(data)}'>\n<p class=\"controls\"><label>Order: "
            f'<select class="viewer-sort">{sort}</select></label></p>\n<div class="columns">'
            f"{column(0)}{column(1 if len(shown) > 1 else None)}</div>\n</div>\n")


def group_section(group: Group, tables: dict[str, Table], plots: dict[str, Plot], sources: Sources) -> str:
    return (f"<section>\n<h2>{html.escape(group.title)}</h2>\n"
            f'<p class="meta">Corpus: {html.escape(", ".join(sorted(group.corpora)))}. '
            f"{html.escape(provenance(group.sources, group.unverified))}</p>\n"
            + sources_block(group, tables.get("methods"), sources)
            + (table_block(group, tables["methods"]) + metrics_block(tables["metrics"]) if "methods" in tables else "")
            + (table_block(group, tables["budget"]) if "budget" in tables else "")
            + plots_block(plots) + (samples_block(group, tables["methods"]) if "methods" in tables else "")
            + (viewer_block(group, tables["methods"], sources) if "methods" in tables else "")
            + (table_block(group, tables["steps"]) if "steps" in tables else "")
            + (table_block(group, tables["frontier"]) if "frontier" in tables else "")
            + table_block(group, tables["proxies"]) + table_block(group, tables["layers"])
            + (table_block(group, tables["stages"]) if "stages" in tables else "") + "</section>\n")


def render_page(built: list[tuple[Group, dict[str, Table], dict[str, Plot]]], sources: Sources | None = None) -> str:
    """Every group on one page; ``sources`` says where the records (and their samples) are from the
    page's folder, so that each number links to them (without it, their names are shown unlinked)."""
    sources = sources or Sources()
    body = f"<h1>{TITLE}</h1>\n<p class=\"meta\">{html.escape(INTRO)}</p>\n"
    body += "".join(group_section(group, tables, plots, sources) for group, tables, plots in built)
    cited = citation([group for group, _, _ in built])
    return html_document(TITLE, body, PAGE_STYLE, SORT_SCRIPT, meta={CITATION_KEY: cited})
