"""Tables as Markdown, CSV, HTML and LaTeX.

Names in a record (suite, backbone, evaluator, corpus, method, proxy and metric names, the
record's own file name) are data, not markup: every format escapes them (`markdown_text`,
`latex_text`, `html.escape`, CSV quoting), and folder names are built from them only
through `dihal_bench.study.records.slug`.
"""

from __future__ import annotations

import csv
import html
import json
import math
import re
from collections.abc import Callable, Sequence

import pandas as pd

from dihal_bench.leaderboard.aggregate import Column, Table
from dihal_bench.leaderboard.read import Group, one_line

#: Output format -> file suffix.
FORMAT_SUFFIXES = {"md": ".md", "csv": ".csv", "html": ".html", "latex": ".tex"}

# --- names as data --------------------------------------------------------------------------


#: Markdown's inline syntax: backslash-escaped wherever a name holds it (CommonMark lets any
#: ASCII punctuation be escaped, and an escaped character is plain text). Escaped in one pass
#: over the text, so that a name's own trailing backslash cannot un-escape the character after it.
MARKDOWN_SPECIALS = "\\`*[]!~|"
#: A run of ``_`` between two letters or digits (``gen_ppl``) can neither open nor close
#: emphasis (CommonMark's flanking rules), so it stays as it is; any other run is escaped.
_UNDERSCORES = re.compile(r"_+")
#: What GFM turns into a link without any syntax (``http://…``, ``www.…``, ``a@b.c``): its
#: trigger character as a numeric entity, which reads the same but triggers nothing.
_AUTOLINK_TRIGGERS = re.compile(r":(?=//)|(?<=www)\.|@", re.IGNORECASE)


def markdown_text(text) -> str:
    """``text`` inert in Markdown, table cells included (docs/method.md#records-and-leaderboards):
    one line; HTML's ``& < >`` as entities (Markdown passes raw HTML through); link, image,
    emphasis, code, strikethrough and table syntax (``[ ] ! * _ ` ~ |`` and ``\\``)
    backslash-escaped (``_`` only where it could mark emphasis); and the characters that start
    an autolink as entities."""
    escaped = html.escape(one_line(text), quote=False)
    escaped = "".join(f"\\{c}" if c in MARKDOWN_SPECIALS else c for c in escaped)
    escaped = _UNDERSCORES.sub(lambda run: run.group() if _intraword(run) else "\\_" * len(run.group()), escaped)
    return _AUTOLINK_TRIGGERS.sub(lambda match: f"&#{ord(match.group())};", escaped)


def _intraword(run: re.Match) -> bool:
    text, start, end = run.string, run.start(), run.end()
    return 0 < start and end < len(text) and text[start - 1].isalnum() and text[end].isalnum()


#: Unicode in cells and headers -> LaTeX (text mode).
LATEX_SYMBOLS = {"±": r"$\pm$", "ℓ": r"$\ell$", "∈": r"$\in$", "ρ": r"$\rho$", "τ": r"$\tau$",
                 "↓": r"$\downarrow$", "↑": r"$\uparrow$", "²": r"$^2$", "—": "---"}
#: LaTeX's special characters, as text; < > | too, which the default OT1 encoding would
#: typeset as other glyphs.
LATEX_SPECIALS = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#",
                  "^": r"\textasciicircum{}", "_": r"\_", "%": r"\%", "~": r"\textasciitilde{}",
                  "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}"}
# One translation table, applied in one pass: the replacements are never escaped again.
_LATEX_TRANSLATION = str.maketrans(LATEX_SPECIALS | LATEX_SYMBOLS)


def latex_text(text) -> str:
    """``text`` as inert LaTeX text: one line, every special character escaped."""
    return one_line(text).translate(_LATEX_TRANSLATION)


# --- numbers --------------------------------------------------------------------------------


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


def format_p(p: float) -> str:
    """A p-value to two significant figures (scientific below 0.001): more digits than the
    test's resolution (1/(permutations + 1)) would only suggest precision it does not have."""
    if math.isnan(p):
        return "—"
    return f"{p:.1e}" if 0 < p < 1e-3 else f"{p:.2g}"


def format_cell(mean: float, std: float, n: int, *, count: bool = False, usual: int | None = None) -> str:
    """``mean ± std (n=k seeds)``; a count that does not vary is shown as the bare integer.
    With ``usual`` (the n the table states once), n is shown only where it differs."""
    if n == 0:
        return "—"
    if count and (n == 1 or std == 0):
        return f"{mean:,.0f}"
    if n == usual:
        return format_mean_std(mean, std)
    return f"{format_mean_std(mean, std)} (n={n} seed{'s' if n != 1 else ''})"


def cell(table: Table, column: Column, row: int, *, usual: int | None = None) -> str:
    """The text of one cell; with ``usual``, n only where it differs from it."""
    if column.kind == "text":
        return table.labels[column.key][row]
    values = table.numbers.iloc[row]
    if column.kind == "p":
        return format_p(values[f"{column.key}_mean"]) if int(values[f"{column.key}_n"]) else "—"
    return format_cell(values[f"{column.key}_mean"], values[f"{column.key}_std"], int(values[f"{column.key}_n"]),
                       count=column.kind == "count", usual=usual)


def sort_key(table: Table, column: Column, row: int) -> str | None:
    """What a click on the column's header sorts the row by: its mean; "" when it has none;
    None for text, which sorts by what it shows."""
    if column.kind == "text":
        return None
    value = table.numbers.iloc[row][f"{column.key}_mean"]
    return "" if math.isnan(value) else repr(float(value))


def cells(table: Table, columns: Sequence[Column] | None = None, *, usual: int | None = None) -> pd.DataFrame:
    """The table as text cells under display headers."""
    columns = table.columns if columns is None else columns
    return pd.DataFrame([[cell(table, column, row, usual=usual) for column in columns]
                         for row in range(len(table.numbers))], columns=[column.header for column in columns])


def _escaped(frame: pd.DataFrame, escape: Callable[[object], str]) -> pd.DataFrame:
    """A copy of a table of text cells with every cell and header passed through ``escape``."""
    return pd.DataFrame([[escape(value) for value in row] for row in frame.itertuples(index=False, name=None)],
                        columns=[escape(column) for column in frame.columns])


# --- formats --------------------------------------------------------------------------------


def provenance(sources: dict[str, list[int]], unverified: Sequence[str] = ()) -> str:
    """The line that traces a table's numbers back to their run records, saying which of them
    carry no seal (docs/method.md#records-and-leaderboards)."""
    seeds = sum(len(s) for s in sources.values())
    listed = "; ".join(f"{name} (seed{'s' if len(s) != 1 else ''} {', '.join(map(str, s))}"
                       f"{', unverified: no seal' if name in unverified else ''})"
                       for name, s in sources.items())
    return (f"Built from {len(sources)} run record{'s' if len(sources) != 1 else ''} "
            f"({seeds} seed{'s' if seeds != 1 else ''}): {listed}.")


#: The name under which the page (a ``<meta>`` element) and its picture (a PNG text chunk)
#: carry `citation`, for a reader or a test to compare with ``results/``.
CITATION_KEY = "dihal-bench-records"


def citation(groups: Sequence[Group]) -> str:
    """Every run record the outputs were built from, with the seeds pooled from it, as JSON
    ``{"<record file>": [seeds]}`` in ASCII (a PNG text chunk is Latin-1); keys sorted, so the
    same records always give the same text."""
    cited = {name: list(seeds) for group in groups for name, seeds in group.sources.items()}
    return json.dumps(cited, sort_keys=True, ensure_ascii=True)


def pooled(table: Table) -> bool:
    """Whether the table has cells pooled over seeds (the metrics table has none)."""
    return any(column.kind != "text" for column in table.columns)


def seeds_note(table: Table) -> str:
    """The table's n, said once for all its cells (a cell over fewer seeds says its own)."""
    if table.per_cell:
        return table.per_cell
    if table.seeds == 1:
        return "Each cell: the value of the one seed pooled (no std over seeds)."
    return (f"Each cell: mean ± sample std (ddof=1) over n = {table.seeds} seeds "
            f"(each seed once, from its newest record); a cell over fewer says so.")


def note(table: Table) -> str:
    """The table's note, after what a cell means (and its n, said once) where it has numbers."""
    return f"{seeds_note(table)} {table.note}" if pooled(table) else table.note


def markdown_body(table: Table, columns: Sequence[Column] | None = None) -> str:
    """The table's ``columns`` (all by default) as a Markdown pipe table, n said where it differs
    from the table's. Names are escaped; number cells are this module's own text, whose brackets
    (an interval) stay readable in the file."""
    columns = table.columns if columns is None else columns
    names = [column.kind == "text" for column in columns]
    frame = cells(table, columns, usual=table.seeds)
    body = pd.DataFrame([[markdown_text(value) if is_name else value for value, is_name in zip(row, names)]
                         for row in frame.itertuples(index=False, name=None)],
                        columns=[markdown_text(header) for header in frame.columns])
    return body.to_markdown(index=False, disable_numparse=True)


def render_markdown(table: Table, group: Group) -> str:
    body = markdown_body(table)
    source = provenance(group.sources, group.unverified)
    return (f"{markdown_text(source)}\n\n# {markdown_text(f'{table.title}: {group.title}')}\n\n"
            f"{markdown_text(note(table))}\n\n{body}\n")


#: What a spreadsheet reads as the start of a formula (``=HYPERLINK(…)``, ``@SUM(…)``, and a
#: tab or carriage return before one), in a text cell.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_text(value):
    """A CSV cell that no spreadsheet runs: text starting like a formula gets a leading ``'``
    (the usual rule against CSV injection, docs/method.md#records-and-leaderboards); numbers,
    negative ones included, stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def render_csv(table: Table, group: Group) -> str:
    # Every text field quoted: pandas' default (minimal) quoting leaves a bare \r unquoted
    # when lines end in \n, and a CSV reader then splits the row there.
    frame = table.numbers.copy()
    for column in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = [csv_text(value) for value in frame[column]]
    frame.columns = [csv_text(str(column)) for column in frame.columns]
    return frame.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC)


#: A word (a run without spaces) breaks inside only where it is longer than this: after ``_``,
#: ``/`` and ``-``, and every this many characters of a piece still longer. A table column is
#: as narrow as its longest unbreakable piece, so a long name must not be one.
LONGEST_UNBROKEN = 12
#: In a cell, a name up to this long stays whole ("reference-unigram", "control-regressor",
#: "global_monotonicity"): a row's label is one column, where a few such names cannot widen
#: the page, unlike a header on each of a dozen columns.
WHOLE_NAME = 24
#: A character after which a browser may break a line (a hyphen, a slash, …): anything but a
#: letter or a digit. One before a word's last character would cut the word.
_BREAK_AFTER = re.compile(r"[^\w]|_")


def breakable(text: str, *, names: bool = False) -> str:
    """``text`` as HTML that wraps at spaces and, inside a word longer than LONGEST_UNBROKEN
    (WHOLE_NAME for ``names``, a cell's text), at ``<wbr>`` marks; in ``names``, a shorter word
    that holds a hyphen or another break point is kept whole (``<span class="word">``, which
    the styles set ``white-space: nowrap``)."""
    limit = WHOLE_NAME if names else LONGEST_UNBROKEN
    words = []
    for word in re.split(r"(\s+)", text):
        if len(word) <= limit:
            words.append(_whole(word) if names else html.escape(word))
            continue
        pieces = re.findall(r"[^_/-]*[_/-]|[^_/-]+", word)
        chunks = [piece[i:i + LONGEST_UNBROKEN] for piece in pieces for i in range(0, len(piece), LONGEST_UNBROKEN)]
        words.append("<wbr>".join(html.escape(chunk) for chunk in chunks))
    return "".join(words)


def _whole(word: str) -> str:
    """``word`` escaped, in one piece however narrow the column."""
    escaped = html.escape(word)
    return f'<span class="word">{escaped}</span>' if _BREAK_AFTER.search(word[:-1]) and not word.isspace() else escaped


def html_table(table: Table, columns: Sequence[Column], *, usual: int | None = None, sortable: bool = False,
               whole_values: bool = False) -> str:
    """``columns`` of ``table`` as an HTML table; sortable ones carry each cell's sort key, and
    with ``whole_values`` a ``mean ± std`` breaks, if the window is narrow, only after its ``±``."""
    kinds = [' class="text"' if column.kind == "text" else "" for column in columns]
    head = "".join(f'<th scope="col"{kind}{_title(column.description)}>{breakable(column.header)}</th>'
                   for column, kind in zip(columns, kinds))
    rows = []
    for row in range(len(table.numbers)):
        tds = []
        for column, kind in zip(columns, kinds):
            key = sort_key(table, column, row) if sortable else None
            attributes = kind + (f' data-sort="{key}"' if key is not None else "")
            text = cell(table, column, row, usual=usual)
            shown = breakable(text, names=True) if kind else html.escape(text)
            if whole_values and not kind:
                shown = shown.replace(" ± ", "&nbsp;± ")
            tds.append(f"<td{attributes}>{shown}</td>")
        rows.append(f"<tr>{''.join(tds)}</tr>")
    classes = "leaderboard sortable" if sortable else "leaderboard"
    return (f'<table class="{classes}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n' + "\n".join(rows)
            + "\n</tbody>\n</table>\n")


def _title(text: str) -> str:
    return f' title="{html.escape(one_line(text))}"' if text else ""


TABLE_STYLE = """
body { font-family: sans-serif; max-width: 80rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table.leaderboard { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
table.leaderboard th, table.leaderboard td { border-bottom: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; }
table.leaderboard .text { text-align: left; }
p.note { color: #555; font-size: 0.9rem; }
.word { white-space: nowrap; }
"""


def html_document(title: str, body: str, style: str, script: str = "", *, meta: dict[str, str] | None = None) -> str:
    """A self-contained page: inline style (and the inline ``script``, if any), nothing
    fetched from elsewhere; ``meta``: name -> content of ``<meta>`` elements."""
    script = f"<script>{script}</script>\n" if script else ""
    tags = "".join(f'<meta name="{html.escape(name)}" content="{html.escape(content)}">\n'
                   for name, content in (meta or {}).items())
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n{tags}"
            f"<title>{html.escape(title)}</title>\n<style>{style}</style>\n</head>\n<body>\n"
            f"{body}{script}</body>\n</html>\n")


def render_html(table: Table, group: Group) -> str:
    title = f"{table.title}: {group.title}"
    source = provenance(group.sources, group.unverified)
    body = (f"<p>{html.escape(source)}</p>\n<h1>{html.escape(title)}</h1>\n"
            f"<p class=\"note\">{html.escape(note(table))}</p>\n"
            f"{html_table(table, table.columns, usual=table.seeds)}")
    return html_document(title, body, TABLE_STYLE)


def render_latex(table: Table, group: Group) -> str:
    # n is said once, under the tabular, and in a cell only where it differs
    body = _escaped(cells(table, usual=table.seeds), latex_text).to_latex(index=False, escape=False)
    # A comment runs to the end of its line, so it only needs to stay on one line.
    source = provenance(group.sources, group.unverified)
    stated = f"\\par\\smallskip{{\\footnotesize {latex_text(seeds_note(table))}}}\n" if pooled(table) else ""
    return f"% {one_line(source)}\n% {one_line(f'{table.title}: {group.title}')}\n{body}{stated}"


#: Format -> renderer of one table.
TABLE_RENDERERS: dict[str, Callable[[Table, Group], str]] = {
    "md": render_markdown, "csv": render_csv, "html": render_html, "latex": render_latex,
}


def render_index(groups: list[Group], files: dict[str, bytes]) -> str:
    """``index.md``: one row per group with links to its Markdown tables and plots."""
    lines = ["# dihal-bench leaderboards", "",
             "| Suite | Backbone | Evaluator | Corpus | Records | Seeds | Files |",
             "|---|---|---|---|---|---|---|"]
    for group in groups:
        links = ", ".join(f"[{path.rsplit('/', 1)[1]}]({path})" for path in files
                          if path.startswith(f"{group.folder}/") and path.endswith((".md", ".png")))
        row = (group.suite, group.backbone, group.evaluator, ", ".join(sorted(group.corpora)),
               ", ".join(group.sources), group.seeds)
        lines.append(f"| {' | '.join(markdown_text(value) for value in row)} | {links} |")
    return "\n".join(lines) + "\n"
