"""The single page in a real browser: headless chromium renders ``leaderboard.html`` in a
1400×900 window, where the page must not scroll sideways (every <details> opened, long names
and many columns included) and a click on a column header must sort the rows.

Skipped where no chromium binary is found (on Debian: ``apt-get install chromium``).
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
from test_leaderboard import METRICS, metric, seed_entry, write_record

from dihal_bench.leaderboard import build_leaderboards

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome-stable",
                                                 "google-chrome"))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary found")

WIDTH, HEIGHT = 1400, 900
COMMITTED_RESULTS = Path(__file__).parents[1] / "results"

#: Appended to the page under test: measures it with every <details> open, clicks the header
#: that starts with HEADER twice, and writes what it saw into the DOM for --dump-dom.
PROBE = """<script>
addEventListener("load", () => {
  const page = document.documentElement;
  const report = {width: innerWidth, closedHeight: page.scrollHeight};
  for (const details of document.querySelectorAll("details")) details.open = true;
  report.scrollWidth = page.scrollWidth;
  report.right = Math.max(...[...document.body.querySelectorAll("*")].map(e => e.getBoundingClientRect().right));
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


@pytest.mark.skipif(not any(COMMITTED_RESULTS.glob("*.json")), reason="no committed run record")
def test_the_committed_records_page_fits_and_sorts(tmp_path):
    out = tmp_path / "out"
    build_leaderboards(COMMITTED_RESULTS, out, ("html",), warn=lambda message: None)
    report = probe(out / "leaderboard.html", "Gen.PPL ↓", tmp_path)
    assert_fits(report)
    assert_sorts(report)
    png = tmp_path / "leaderboard.png"
    screenshot(out / "leaderboard.html", png, report["closedHeight"], tmp_path / "profile")
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert int.from_bytes(png.read_bytes()[16:20], "big") == WIDTH  # the IHDR chunk's width
