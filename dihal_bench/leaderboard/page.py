"""``leaderboard.html``: every group on one self-contained page a reader prefers to the table
files — no request leaves the page (style, sort script and plots are inline).

Per group: the methods table cut to the columns a reader ranks by (method, budget, the metrics
that have a better direction, latency) with the rest one click away, the plots, the proxy and
layer tables, and a few samples of each method. Each table says its n (seeds) once; a cell
says its own only where it has fewer. Any column sorts by a click on its header. The page fits
a 1400-pixel-wide window: a name breaks inside a word only where the word is longer than
`render.LONGEST_UNBROKEN`, so no cell widens the page and no usual name is cut in two. The
records the page was built from are named in each group's section and, for a machine, in a
``<meta name="dihal-bench-records">`` element (`render.citation`), which the page's picture
(`plot.page_picture`) carries too.
"""

from __future__ import annotations

import base64
import html

from dihal_bench.leaderboard.aggregate import Table
from dihal_bench.leaderboard.plot import Plot
from dihal_bench.leaderboard.read import Group, one_line
from dihal_bench.leaderboard.render import (
    CITATION_KEY,
    citation,
    html_document,
    html_table,
    provenance,
    seeds_note,
)

TITLE = "dihal-bench leaderboard"
#: The columns one click away come in tables of at most this many (and the row's name), so
#: that any number of them fits the window.
DETAIL_COLUMNS = 8
#: At most this many samples per method (records keep five).
SAMPLES_SHOWN = 5

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
.samples pre { margin: .2rem 0; padding: .4rem .6rem; background: #f6f8fa; border-radius: 4px;
               white-space: pre-wrap; overflow-wrap: anywhere; font: .85rem/1.4 ui-monospace, monospace; }
"""

#: Click (or Enter on) a header: rows sort by that column, again to reverse. Cells sort by
#: their data-sort number where they have one, else by their text; a cell with no value
#: (data-sort="") goes last either way.
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
"""

INTRO = ("Run records pooled by suite, backbone and evaluator. ↑: higher is better, ↓: lower is better, "
         "as each metric declares; a column without an arrow has no better direction. "
         "Click a column header to sort by it.")


def seeds_line(table: Table) -> str:
    """The table's n, said once for all its cells."""
    return f'<p class="n">{html.escape(seeds_note(table))}</p>\n'


def table_block(table: Table) -> str:
    """A table's heading, n, the columns a reader ranks by, its note and the rest in <details>."""
    main = [column for column in table.columns if column.main]
    rest = [column for column in table.columns if not column.main]
    parts = [f"<h3>{html.escape(table.title)}</h3>\n", seeds_line(table),
             html_table(table, main, usual=table.seeds, sortable=True, whole_values=True),
             f'<p class="note">{html.escape(table.note)}</p>\n']
    if rest:
        listed = ", ".join(column.header for column in rest)
        chunks = [rest[start:start + DETAIL_COLUMNS] for start in range(0, len(rest), DETAIL_COLUMNS)]
        parts.append(f"<details><summary>More columns: {html.escape(listed)}</summary>\n"
                     + "".join(html_table(table, [table.columns[0], *chunk], usual=table.seeds, sortable=True)
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


def group_section(group: Group, tables: dict[str, Table], plots: dict[str, Plot]) -> str:
    return (f"<section>\n<h2>{html.escape(group.title)}</h2>\n"
            f'<p class="meta">Corpus: {html.escape(", ".join(sorted(group.corpora)))}. '
            f"{html.escape(provenance(group.sources, group.unverified))}</p>\n"
            + (table_block(tables["methods"]) + metrics_block(tables["metrics"]) if "methods" in tables else "")
            + plots_block(plots) + (samples_block(group, tables["methods"]) if "methods" in tables else "")
            + (table_block(tables["steps"]) if "steps" in tables else "")
            + table_block(tables["proxies"]) + table_block(tables["layers"]) + "</section>\n")


def render_page(built: list[tuple[Group, dict[str, Table], dict[str, Plot]]]) -> str:
    """Every group on one page."""
    body = f"<h1>{TITLE}</h1>\n<p class=\"meta\">{html.escape(INTRO)}</p>\n"
    body += "".join(group_section(group, tables, plots) for group, tables, plots in built)
    cited = citation([group for group, _, _ in built])
    return html_document(TITLE, body, PAGE_STYLE, SORT_SCRIPT, meta={CITATION_KEY: cited})
