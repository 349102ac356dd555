"""The page's sample viewer (issue 41): per group, up to `VIEWER_SAMPLES` samples per method, from each
record's samples file where it is beside the record, else the texts the record keeps, with the record's
own per-sample NLLs; embedded as JSON that no sample can break out of; the page the same for the same
files; and, in headless chromium (skipped where none is found, as tests/test_leaderboard_page.py does),
a viewer that renders, shows the method chosen in each column and sorts by NLL per token."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from test_leaderboard import seed_entry, write_record
from test_leaderboard_page import HEIGHT, WIDTH, chromium, needs_chromium

from dihal_bench.errors import DihalError
from dihal_bench.leaderboard import build_leaderboards
from dihal_bench.leaderboard.page import VIEWER_SAMPLES

HOSTILE = "</script><script>alert(1)</script> it's <b>\"x\"</b> &amp;"
COUNT = 100  # samples per method and seed in a samples file: more than the viewer shows


def nll_of(seed: int, index: int) -> tuple[float | None, int]:
    """A sample's summed NLL (None every seventh: invalid) and scored tokens."""
    return (None if index % 7 == 3 else 2.0 * ((index * 37 + seed) % 11) + 1.0), 4 + index % 5


def entries(count: int, seeds=(0, 1)) -> list[dict]:
    """Seeds whose DiHAL row has ``count`` samples with per-sample NLLs and five kept texts; the backbone
    keeps texts but no NLLs."""
    made = []
    for seed in seeds:
        entry = seed_entry(seed, 10.0 + seed, 2, {1: 1.0, 2: 0.5, 3: 0.8}, 0.5)
        chosen = entry["methods"]["dihal-chosen"]
        chosen["samples"] = {"path": "s.jsonl", "count": count, "examples": [text(seed, i) for i in range(5)]}
        chosen["metrics"]["gen_ppl_nll_per_sample"] = [nll_of(seed, i)[0] for i in range(count)]
        chosen["metrics"]["gen_ppl_tokens_per_sample"] = [nll_of(seed, i)[1] for i in range(count)]
        entry["methods"]["ar-backbone"]["samples"]["examples"] = [f"backbone {seed} " + "word " * i for i in range(3)]
        made.append(entry)
    return made


def text(seed: int, index: int) -> str:
    return HOSTILE if index == 1 else f"seed {seed} sample {index} " + "w " * (index % 13)


def samples_file(path: Path, made: list[dict]) -> None:
    """The record's samples file (as `dihal-bench samples export` writes it), DiHAL's texts only."""
    lines = [{"method": "dihal-chosen", "seed": entry["seed"], "scale": 1, "index": i,
              "text": f"file {text(entry['seed'], i)}"}
             for entry in made for i in range(entry["methods"]["dihal-chosen"]["samples"]["count"])]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def viewer_data(page: str) -> list[dict]:
    """The viewer's embedded samples of the page's one group."""
    [blob] = re.findall(r"<div class=\"viewer\" data-samples='([^']*)'>", page)
    return json.loads(html.unescape(blob))


def build(results: Path, out: Path) -> str:
    build_leaderboards(results, out, ("html",), warn=lambda message: None)
    return (out / "leaderboard.html").read_text()


@pytest.fixture
def results(tmp_path) -> Path:
    folder = tmp_path / "results"
    folder.mkdir()
    return folder


def test_the_viewer_shows_the_kept_texts_with_the_records_nlls_where_no_samples_file_is(results, tmp_path):
    write_record(results, "a.json", entries(COUNT))
    page = build(results, tmp_path / "out")
    assert "<h3>Samples</h3>" in page and "<h3>Sample viewer</h3>" in page  # the static few stay, for no script
    assert f"Up to {VIEWER_SAMPLES} samples per method" in page
    dihal, backbone = viewer_data(page)
    assert (dihal["method"], dihal["name"], backbone["method"]) == ("dihal-chosen", "DiHAL (ℓ*=2)", "ar-backbone")
    assert [(s["seed"], s["index"]) for s in dihal["samples"]] == [(seed, i) for seed in (0, 1) for i in range(5)]
    for sample in dihal["samples"]:
        nll, tokens = nll_of(sample["seed"], sample["index"])
        assert sample["text"] == text(sample["seed"], sample["index"])
        assert sample["nll"] == (None if nll is None else nll / tokens) and sample["tokens"] == tokens
        assert sample["valid"] is (nll is not None) and sample["words"] == len(sample["text"].split())
    assert dihal["origin"] == ("10 of the 10 samples at hand (the texts the record keeps: seed 0 of a.json, "
                               "seed 1 of a.json)")
    assert all(s["nll"] is None and s["valid"] is None for s in backbone["samples"])  # no NLLs in its records


def test_a_samples_file_gives_its_texts_capped_evenly_across_the_seeds(results, tmp_path):
    made = entries(COUNT)
    write_record(results, "a.json", made)
    samples_file(results / "a.samples.jsonl", made)
    dihal, backbone = viewer_data(build(results, tmp_path / "out"))
    half = VIEWER_SAMPLES // 2
    assert [(s["seed"], s["index"]) for s in dihal["samples"]] == [(seed, i) for seed in (0, 1) for i in range(half)]
    assert all(s["text"] == f"file {text(s['seed'], s['index'])}" for s in dihal["samples"])
    for sample in dihal["samples"]:  # the record's NLLs, not the file's (it has none)
        nll, tokens = nll_of(sample["seed"], sample["index"])
        assert sample["nll"] == (None if nll is None else nll / tokens)
    assert dihal["origin"].startswith(f"{VIEWER_SAMPLES} of the {2 * COUNT} samples at hand (its samples file: seed 0")
    assert backbone["origin"].startswith("6 of the 6 samples at hand (the texts the record keeps")  # not in the file


def test_no_sample_breaks_out_of_the_embedded_json_and_the_page_is_the_same_each_build(results, tmp_path):
    made = entries(COUNT)
    write_record(results, "a.json", made)
    samples_file(results / "a.samples.jsonl", made)
    page = build(results, tmp_path / "one")
    assert page == build(results, tmp_path / "two")
    [attribute] = re.findall(r"data-samples='([^']*)'", page)
    assert "<" not in attribute and ">" not in attribute  # no </script>, no tag of any kind
    assert f"file {HOSTILE}" in {s["text"] for s in viewer_data(page)[0]["samples"]}  # and read back exactly
    assert page.count("<script") == 1  # the page's one script, the sample viewer included


def test_a_samples_file_that_does_not_fit_its_record_is_refused_naming_it(results, tmp_path):
    made = entries(COUNT)
    write_record(results, "a.json", made)
    samples_file(results / "a.samples.jsonl", made)
    lines = (results / "a.samples.jsonl").read_text().splitlines(keepends=True)
    (results / "a.samples.jsonl").write_text("".join(lines[1:]))
    with pytest.raises(DihalError, match=r"a\.samples\.jsonl: the samples of dihal-chosen \(seed 0\) are not "
                                         r"numbered 0 to 98"):
        build(results, tmp_path / "out")
    (results / "a.samples.jsonl").write_text("".join(lines[:-1]))
    with pytest.raises(DihalError, match=r"the samples file of a\.json holds 99 samples of dihal-chosen \(seed 1\), "
                                         r"the record 100"):
        build(results, tmp_path / "out")
    (results / "a.samples.jsonl").write_text("".join(lines[:3]) + "{not json\n")
    with pytest.raises(DihalError, match=r"a\.samples\.jsonl is not a readable samples file \(line 4"):
        build(results, tmp_path / "out")


#: Appended to the page under test: reads what the viewer shows, chooses the backbone in the first
#: column and each order in turn, and writes what it saw into the DOM for --dump-dom.
PROBE = """<script>
addEventListener("load", () => {
  const viewer = document.querySelector("div.viewer");
  const [first, second] = viewer.querySelectorAll(".column");
  const shown = column => [...column.querySelectorAll("li")].map(item =>
    ({method: item.dataset.method, nll: item.dataset.nll, words: Number(item.dataset.words),
      pre: item.querySelector("pre") ? item.querySelector("pre").textContent : null}));
  const choose = (select, value) => { select.value = value; select.dispatchEvent(new Event("change")); };
  const report = {first: shown(first), second: shown(second),
                  origin: first.querySelector(".origin").textContent};
  const sort = viewer.querySelector("select.viewer-sort");
  for (const order of ["nll-asc", "nll-desc", "words-asc"]) {
    choose(sort, order);
    report[order] = shown(first);
  }
  choose(first.querySelector("select"), "1");
  report.filtered = shown(first);
  choose(second.querySelector("select"), "");
  report.none = shown(second);
  for (const details of document.querySelectorAll("details")) details.open = true;
  report.scrollWidth = document.documentElement.scrollWidth;
  report.scripts = document.querySelectorAll("script").length;
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(report);
  document.body.append(out);
});
</script>
"""


@needs_chromium
def test_in_chromium_the_viewer_renders_filters_by_method_and_sorts_by_nll(results, tmp_path):
    made = entries(COUNT)
    made[0]["methods"]["ar-backbone"]["samples"]["examples"][2] = "z" * 3000  # a long unbroken sample
    write_record(results, "a.json", made)
    samples_file(results / "a.samples.jsonl", made)
    page = tmp_path / "probed.html"
    page.write_text(build(results, tmp_path / "out").replace("</body>", PROBE + "</body>"))
    dom = chromium(page.as_uri(), tmp_path / "profile", f"--window-size={WIDTH},{HEIGHT}",
                   "--virtual-time-budget=10000", "--dump-dom")
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.DOTALL)
    assert found, dom[-2000:]
    report = json.loads(html.unescape(found.group(1)))

    # rendered: DiHAL beside the backbone, every sample as text (a hostile one included, not as HTML)
    assert len(report["first"]) == VIEWER_SAMPLES and {s["method"] for s in report["first"]} == {"dihal-chosen"}
    assert {s["method"] for s in report["second"]} == {"ar-backbone"} and len(report["second"]) == 6
    assert f"file {HOSTILE}" in [s["pre"] for s in report["first"]]
    assert report["scripts"] == 2  # the page's own and the probe: no sample became a script
    assert report["origin"].startswith(f"{VIEWER_SAMPLES} of the {2 * COUNT} samples at hand")

    # sorted by NLL per token, both ways, a sample without one last either way
    for order, reverse in (("nll-asc", False), ("nll-desc", True)):
        keys = [s["nll"] for s in report[order]]
        values = [float(key) for key in keys if key != ""]
        assert values == sorted(values, reverse=reverse) and len(set(values)) > 1, order
        assert keys[len(values):] == [""] * (len(keys) - len(values)) and len(values) < len(keys), order
    words = [s["words"] for s in report["words-asc"]]
    assert words == sorted(words) and len(set(words)) > 1

    # filtered: the first column now shows the backbone alone; "(none)" empties the second
    assert {s["method"] for s in report["filtered"]} == {"ar-backbone"} and len(report["filtered"]) == 6
    assert report["none"] == []
    assert report["scrollWidth"] <= WIDTH  # two columns of long samples still fit the window
