"""The published page, its picture and its tables.

Everywhere: the page (``leaderboard.html``) and its picture (``leaderboard.png``) name the
same records, those the tables were built from, and change together; a file the build no
longer makes is named as stale; LaTeX states n once per table; a name breaks inside a word
only when it is long; and the committed ``leaderboards/`` are what the publish step makes of
the committed ``results/``.

In a real browser (skipped where no chromium binary is found; on Debian ``apt-get install
chromium``): headless chromium renders the page in a 1400×900 window, where it must not scroll
sideways (every <details> opened, long names and many columns included), no method name may
be cut across lines, and a click on a column header must sort the rows.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image
from test_leaderboard import METRICS, POOLED, metric, seed_entry, write_record

from dihal_bench.leaderboard import PUBLISHED_FORMATS, build_leaderboards
from dihal_bench.leaderboard.render import (
    CITATION_KEY,
    LONGEST_UNBROKEN,
    WHOLE_NAME,
    breakable,
)

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome-stable",
                                                 "google-chrome"))), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found")

WIDTH, HEIGHT = 1400, 900
ROOT = Path(__file__).parents[1]
COMMITTED_RESULTS = ROOT / "results"
COMMITTED_LEADERBOARDS = ROOT / "leaderboards"
#: What `dihal-bench locate` writes into the leaderboards folder: not built from run records.
NOT_FROM_RECORDS = "locate"

#: Appended to the page under test: measures it with every <details> open, clicks the header
#: that starts with HEADER twice, and writes what it saw into the DOM for --dump-dom.
PROBE = """<script>
addEventListener("load", () => {
  const page = document.documentElement;
  const report = {width: innerWidth, closedHeight: page.scrollHeight};
  for (const details of document.querySelectorAll("details")) details.open = true;
  report.scrollWidth = page.scrollWidth;
  report.right = Math.max(...[...document.body.querySelectorAll("*")].map(e => e.getBoundingClientRect().right));
  // a name kept whole (span.word) that the layout still cut across lines has two boxes
  report.cutWords = [...document.querySelectorAll("td span.word, th span.word")]
    .filter(word => word.getClientRects().length !== 1).map(word => word.textContent);
  const table = document.querySelector("table.sortable");
  const headers = [...table.tHead.rows[0].cells];
  const column = headers.findIndex(header => header.textContent.startsWith(HEADER));
  const read = () => [...table.tBodies[0].rows].map(row => row.cells[column].dataset.sort);
  headers[column].click();
  report.ascending = read();
  report.ascendingMark = headers[column].getAttribute("aria-sort");
  headers[column].click();
  report.descending = read();
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(report);
  document.body.append(out);
});
</script>
"""


def chromium(url: str, profile: Path, *arguments: str) -> str:
    """Headless chromium on ``url``; its stdout."""
    sandbox = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses to run as root with one
    command = [CHROMIUM, "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               f"--user-data-dir={profile}", *sandbox, *arguments, url]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def probe(page: Path, header: str, tmp_path: Path) -> dict:
    """What PROBE reports about ``page`` in a WIDTH×HEIGHT window."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE.replace("HEADER", json.dumps(header)) + "</body>"))
    # the virtual time budget lets the load event and the probe run before the DOM is dumped
    dom = chromium(probed.as_uri(), tmp_path / "profile", f"--window-size={WIDTH},{HEIGHT}",
                   "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found, dom[-2000:]
    return json.loads(html.unescape(found.group(1)))


def screenshot(page: Path, png: Path, height: int, profile: Path) -> None:
    """The whole page (``height`` pixels, as first opened) at WIDTH pixels as a PNG."""
    chromium(page.as_uri(), profile, f"--window-size={WIDTH},{height}", f"--screenshot={png}")


def assert_fits(report: dict) -> None:
    assert report["width"] == WIDTH  # the window is the one asked for: the width check means something
    assert report["scrollWidth"] <= WIDTH, f"the page scrolls sideways: {report['scrollWidth']} px wide"
    assert report["right"] <= WIDTH + 0.5, f"an element ends at {report['right']} px"  # sub-pixel layout
    assert report["cutWords"] == [], "names cut across lines"


def assert_sorts(report: dict) -> None:
    """The column's values in row order after one click (ascending) and a second (descending);
    rows with no value last both times."""
    for order, reverse in (("ascending", False), ("descending", True)):
        keys = report[order]
        values = [float(key) for key in keys if key != ""]
        assert values == sorted(values, reverse=reverse), order
        assert keys[len(values):] == [""] * (len(keys) - len(values)), order
        assert len(set(values)) > 1, order  # else any order would pass
    assert report["ascendingMark"] == "ascending"


def wide_record(results: Path) -> None:
    """Everything that widens a page at once: twelve metrics with a direction (one without),
    long unbroken method and metric names, lm-eval columns, long samples."""
    entries = [seed_entry(seed, 10.0 + 7 * seed, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5) for seed in (0, 1)]
    extra = {f"plugin_metric_{i}": metric(f"Plugin metric number {i}", i % 2 == 0) for i in range(6)}
    extra["unbroken"] = metric("Averyveryverylongmetricdisplaynamewithoutanyspaceatall" * 2, False)
    for entry in entries:
        methods = entry["methods"]
        methods["dihal-chosen"]["metrics"]["gen_ppl"] = None  # a missing value to sort last
        methods["baseline-" + "x" * 120] = json.loads(json.dumps(methods["ar-backbone"]))
        methods["baseline-" + "x" * 120]["metrics"]["gen_ppl"] = 70.0 + entry["seed"]
        for i, method in enumerate(methods.values()):
            method["metrics"] |= {name: 1234.5678 * (i + 1) + entry["seed"] for name in extra}
            method["lm_eval"] = {"task-" + "y" * 40: {f"metric_{j}": 1.2345 * j for j in range(6)}}
            method["samples"]["examples"] = ["z" * 3000, "word " * 400, ""]
    write_record(results, "wide.json", entries, metrics={**METRICS, **extra})


@needs_chromium
def test_a_wide_page_fits_1400_pixels_and_sorts_by_a_click(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    wide_record(results)
    out = tmp_path / "out"
    build_leaderboards(results, out, ("html",), warn=lambda message: None)
    report = probe(out / "leaderboard.html", "Gen.PPL ↓", tmp_path)
    assert_fits(report)
    assert_sorts(report)
    assert report["ascending"][-1] == ""  # DiHAL's Gen.PPL is missing in every seed


@needs_chromium
@pytest.mark.skipif(not any(COMMITTED_RESULTS.glob("*.json")), reason="no committed run record")
def test_the_committed_records_page_fits_and_sorts(tmp_path):
    out = tmp_path / "out"
    build_leaderboards(COMMITTED_RESULTS, out, ("html",), warn=lambda message: None)
    page = (out / "leaderboard.html").read_text()
    assert '<span class="word">reference-unigram</span>' in page  # what the check below measures
    report = probe(out / "leaderboard.html", "Gen.PPL ↓", tmp_path)
    assert_fits(report)
    assert_sorts(report)
    png = tmp_path / "leaderboard.png"
    screenshot(out / "leaderboard.html", png, report["closedHeight"], tmp_path / "profile")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(png.read_bytes()[16:20], "big") == WIDTH  # the IHDR chunk's width


# --- the page, its picture and the tables: one build, the same records ---------------------------


def page_citation(page: Path) -> dict:
    """The records ``leaderboard.html`` says (in its <meta>) it was built from."""
    found = re.search(rf'<meta name="{CITATION_KEY}" content="([^"]*)">', page.read_text())
    assert found, "the page names no records"
    return json.loads(html.unescape(found.group(1)))


def picture_citation(png: Path) -> dict:
    """The records ``leaderboard.png`` says (in its text chunk) it was drawn from."""
    with Image.open(png) as image:
        assert image.format == "PNG" and image.width >= WIDTH
        text = image.text.get(CITATION_KEY)
    assert text is not None, f"{png.name} names no records"
    return json.loads(text)


def pooled_entry(seed: int) -> dict:
    """Seed ``seed`` of a record, its numbers from POOLED."""
    ppl, chosen, mse, rho = POOLED[seed % len(POOLED)]
    return seed_entry(seed, ppl, chosen, {1: 1.0, 2: mse, 3: 0.8}, rho)


def records(folder: Path, entries: dict[str, list[int]], *, created: str = "2026-12-01T00:00:00Z", **names) -> None:
    """Sealed records named as keys, each with the seeds given."""
    for name, seeds in entries.items():
        write_record(folder, name, [pooled_entry(seed) for seed in seeds], created=created, **names)


def test_the_page_and_its_picture_name_the_records_they_come_from_and_change_together(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    records(results, {"a.json": [0, 1], "b.json": [2]})
    records(results, {"g.json": [0]}, suite="other")  # a second group: the citation covers every group
    written = build_leaderboards(results, out, PUBLISHED_FORMATS, warn=lambda message: None)
    assert {out / "leaderboard.html", out / "leaderboard.png"} <= set(written)
    cited = {"a.json": [0, 1], "b.json": [2], "g.json": [0]}
    assert page_citation(out / "leaderboard.html") == picture_citation(out / "leaderboard.png") == cited
    page = (out / "leaderboard.html").read_text()
    assert "Built from 2 run records (3 seeds): a.json (seeds 0, 1); b.json (seed 2)." in page  # for a reader
    assert {path.suffix for path in written} == {".md", ".csv", ".html", ".tex", ".png"}

    # seed 1 run again, newer: both say so after the next build
    records(results, {"c.json": [1]}, created="2026-12-09T00:00:00Z")
    build_leaderboards(results, out, PUBLISHED_FORMATS, warn=lambda message: None)
    cited = {"a.json": [0], "b.json": [2], "c.json": [1], "g.json": [0]}
    assert page_citation(out / "leaderboard.html") == picture_citation(out / "leaderboard.png") == cited


def test_the_picture_is_the_same_for_the_same_records(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    records(results, {"a.json": [0, 1]})
    for out in ("one", "two"):
        build_leaderboards(results, tmp_path / out, ("html",), warn=lambda message: None)
    assert (tmp_path / "one/leaderboard.png").read_bytes() == (tmp_path / "two/leaderboard.png").read_bytes()


def test_a_file_no_record_makes_any_more_is_named_stale(tmp_path):
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    records(results, {"a.json": [0, 1]})
    records(results, {"g.json": [0]}, suite="gone")
    build_leaderboards(results, out, PUBLISHED_FORMATS, warn=lambda message: None)
    (out / "locate").mkdir()
    (out / "locate" / "locate.png").write_bytes(b"not from a record")  # `dihal-bench locate` writes here
    (results / "g.json").unlink()
    warnings: list[str] = []
    build_leaderboards(results, out, ("md", "html"), warn=warnings.append)
    stale = sorted(re.match(r"(\S+) is stale", warning).group(1) for warning in warnings)
    gone = sorted(str(path) for path in (out / "gone-tiny-tiny").iterdir() if path.suffix in (".md", ".html", ".png"))
    assert stale == gone and gone  # the CSV and LaTeX files were not asked for: not judged
    assert picture_citation(out / "leaderboard.png") == {"a.json": [0, 1]}


@pytest.mark.parametrize("suffix", [".tex", ".md", ".html"])
def test_each_table_file_states_n_once_and_marks_only_the_cells_over_fewer_seeds(tmp_path, suffix):
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    entries = [pooled_entry(seed) for seed in range(3)]
    entries[2]["methods"]["ar-backbone"]["metrics"]["entropy"] = None  # its entropy: 2 of the 3 seeds
    write_record(results, "a.json", entries)
    build_leaderboards(results, out, ("latex", "md", "html"), warn=lambda message: None)
    text = (out / "diag-tiny-tiny" / f"methods{suffix}").read_text()
    assert text.count("over n = 3 seeds") == 1
    assert re.findall(r"\(n=\d+ seeds?\)", text) == ["(n=2 seeds)"]
    if suffix == ".tex":
        assert r"2.600 $\pm$ 0 (n=2 seeds)" in text
        assert "±" not in text  # the note is LaTeX too
    else:
        assert "2.600 ± 0 (n=2 seeds)" in text


def test_a_name_breaks_inside_a_word_only_when_the_word_is_long():
    assert breakable("reference-unigram", names=True) == '<span class="word">reference-unigram</span>'
    assert breakable("DiHAL worst (ℓ=29)", names=True) == 'DiHAL worst <span class="word">(ℓ=29)</span>'
    assert breakable("My metric ↓", names=True) == "My metric ↓"  # no break point inside a word
    assert breakable("<script>-x", names=True) == '<span class="word">&lt;script&gt;-x</span>'
    assert "<span" not in breakable("ms/token, batch 1")  # headers: a short word as it is
    for text in ("baseline-" + "x" * 120, "global_monotonicity"):  # long for a header
        for names in (True, False):
            pieces = [html.unescape(re.sub("<[^>]+>", "", piece)) for piece in breakable(text, names=names).split("<wbr>")]
            assert "".join(pieces) == text
            assert max(map(len, pieces)) <= LONGEST_UNBROKEN or (names and len(text) <= WHOLE_NAME)


# --- the committed leaderboards ------------------------------------------------------------------


def built_from(path: Path) -> list[str]:
    """The lines of a text artifact that say which records it was built from."""
    return [line for line in path.read_text().splitlines() if "Built from" in line]


@pytest.mark.skipif(not any(COMMITTED_RESULTS.glob("*.json")), reason="no committed run record")
def test_the_committed_leaderboards_are_what_publishing_the_committed_records_makes(tmp_path):
    """`dihal-bench leaderboard --results results --out leaderboards` writes every file below, and
    nothing else is there: no artifact is left from a record no longer in results/, none is
    missing, and each names the records a fresh build names (the tables' provenance lines, the
    page's and the picture's citations)."""
    fresh = tmp_path / "fresh"
    build_leaderboards(COMMITTED_RESULTS, fresh, PUBLISHED_FORMATS, warn=lambda message: None)

    def listed(root: Path) -> set[str]:
        return {path.relative_to(root).as_posix() for path in root.rglob("*")
                if path.is_file() and path.relative_to(root).parts[0] != NOT_FROM_RECORDS}

    committed = listed(COMMITTED_LEADERBOARDS)
    assert sorted(committed - listed(fresh)) == [], "stale: delete these, or publish again"
    assert sorted(listed(fresh) - committed) == [], "missing: publish again"
    for name in sorted(committed):
        if name.endswith((".md", ".html", ".tex")):
            assert built_from(COMMITTED_LEADERBOARDS / name) == built_from(fresh / name), name
    cited = page_citation(fresh / "leaderboard.html")
    assert set(cited) == {path.name for path in COMMITTED_RESULTS.glob("*.json")}
    assert page_citation(COMMITTED_LEADERBOARDS / "leaderboard.html") == cited
    assert picture_citation(COMMITTED_LEADERBOARDS / "leaderboard.png") == cited


# --- each number linked to where it comes from ---------------------------------------------------


def test_every_number_on_the_page_links_to_its_records_and_sample_files(tmp_path, monkeypatch):
    """A number never breaks from its spread (its cell is td.num, which the page's style keeps on one
    line), links to an anchor on the page, and names each seed's value and record on hover; the anchor's
    sources link the record files and, where the job store is at hand in the project, the sample files."""
    monkeypatch.chdir(tmp_path)  # the records name their job store relative to where the run ran
    results, out = tmp_path / "results", tmp_path / "leaderboards"
    results.mkdir()
    records(results, {"a.json": [0, 1]})
    (tmp_path / "runs" / "jobs").mkdir(parents=True)
    (tmp_path / "runs" / "jobs" / "s.jsonl").write_text("{}\n")
    build_leaderboards(results, out, ("html",), warn=lambda message: None)
    page = (out / "leaderboard.html").read_text()
    assert re.search(r"td\.num \{[^}]*white-space: nowrap", page)

    numbers = re.findall(r'<td class="num" data-sort="[^"]*">(.*?)</td>', page, re.S)
    assert numbers and not re.findall(r"<td data-sort", page)  # every numeric cell is a td.num
    ids = set(re.findall(r' id="([^"]+)"', page))
    linked = [re.match(r'<a href="#([^"]+)" title="([^"]*)">', number) for number in numbers if number != "—"]
    assert linked and all(linked)
    assert {link[1] for link in linked} <= ids  # every link lands on the page
    titles = [html.unescape(link[2]) for link in linked]
    assert "seed 0: 10.00 (a.json)\nseed 1: 12.00 (a.json)" in titles  # DiHAL's Gen.PPL, seed by seed (POOLED)

    hrefs = {html.unescape(href) for href in re.findall(r'<a href="([^"#][^"]*)">', page)}
    assert (out / "../results/a.json").resolve() == (results / "a.json").resolve() and "../results/a.json" in hrefs
    assert "../runs/jobs/s.jsonl" in hrefs and all((out / href).resolve().is_file() for href in hrefs)


def test_a_sample_file_outside_the_project_is_named_not_linked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "project"
    (project / "results").mkdir(parents=True)
    records(project / "results", {"a.json": [0]})
    (tmp_path / "runs" / "jobs").mkdir(parents=True)  # the store the record names, outside the project
    (tmp_path / "runs" / "jobs" / "s.jsonl").write_text("{}\n")
    build_leaderboards(project / "results", project / "leaderboards", ("html",), warn=lambda message: None)
    page = (project / "leaderboards" / "leaderboard.html").read_text()
    assert "s.jsonl</span>" in page and 's.jsonl">' not in page
