"""Leaderboards: run records aggregated into tables and plots (docs/method.md#records-and-leaderboards).

Records are grouped by (suite, backbone, evaluator), and each (configuration, seed) of a group
is pooled once, from its newest record: each table cell is the mean ± sample standard
deviation (ddof=1) over the seeds that have the value, with n, the number of those seeds. A
group gets these tables:

- methods: one row per method (DiHAL at ℓ*, worst and oracle layers, the baselines and the
  backbone itself) with each metric the records declare (their ``metrics`` mapping gives the
  columns, titles, arrows and order), latency and training budget;
- layers: one row per swept layer with each locate proxy's raw value, the combined score
  S(ℓ) and the sweep's bridgeability and hybrid measurements;
- proxies: the rank correlation of each proxy and of S(ℓ) with −(bridge validation MSE);
- budget, where rows were trained at several budget scales (docs/method.md#budget-scales): one
  row per (row, scale) with its training FLOPs and metrics;
- steps and frontier, where the suite has those axes; and stages (`stages`): each record's stages
  against the estimate it printed before it started, one row per (record, stage), never pooled.

and PNG plots (`plot`). The modules follow the data: `read` (records to rows), `aggregate`
(rows to tables), `render` (tables as md, csv, html, latex), `plot`, and `page` (the single
page). Every output is rendered in memory before the first file is written, and each file is
written atomically, so a failure never leaves half a leaderboard.

One call writes every artifact from one reading of the records: the tables, the plots, the
page and its picture (``leaderboard.png``), so none of them can show other records than the
rest; the page and the picture name those records (`render.citation`). A leaderboard file
already in the output folder that this call would have written but did not (its group has no
record any more) is named in a warning: it is stale.

`publish` is the publish step (``dihal-bench leaderboard ... --readme FILE``), atomic in this
sense (docs/faults.md): a reader of the output folder or of a README, at any moment, finds each
file whole, its old content or its new, never a mix within a file; the READMEs are written
after every table, page and plot, so a README never cites a table older than itself; one
publisher at a time holds the output folder (`dihal_bench.base.locks.folder_lock`), so two never
interleave their files; and the hidden temporary files a kill left behind are removed by the
next publish. A publish cut short leaves some files new and the rest old; running it again
completes it. The files are not swapped in as one set: a reader between two of them may see one
new and one old.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from dihal_bench.base.files import TEMPORARY_SUFFIX, is_temporary, remove_temporaries, write_bytes_atomic
from dihal_bench.base.locks import folder_lock
from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.leaderboard import render
from dihal_bench.leaderboard.aggregate import tables
from dihal_bench.leaderboard.stages import stage_table
from dihal_bench.leaderboard.page import Sources, render_page
from dihal_bench.leaderboard.plot import PLOTS, page_picture, plots
from dihal_bench.leaderboard.read import Group, read_groups

__all__ = ["PUBLISHED_FORMATS", "build_leaderboards", "publish"]

#: What the publish step (``dihal-bench leaderboard --results results --out leaderboards --readme ...``)
#: writes: every format, so that no committed table is older than the page.
PUBLISHED_FORMATS = ("md", "csv", "html", "latex")
#: The files outside the group folders, and the format whose build writes each.
TOP_LEVEL = {"index.md": "md", "leaderboard.html": "html", "leaderboard.png": "html"}
#: The tables a group can have (`aggregate.tables`).
TABLE_NAMES = ("methods", "metrics", "budget", "steps", "frontier", "layers", "proxies", "stages")


def check_formats(formats: Iterable[str]) -> list[str]:
    formats = list(dict.fromkeys(formats))
    if not formats:
        raise DihalError("no leaderboard format given")
    for name in formats:
        if name not in render.FORMAT_SUFFIXES:
            raise unknown_name("leaderboard format", name, render.FORMAT_SUFFIXES)
    return formats


def build_leaderboards(results_dir: Path, out_dir: Path, formats: Iterable[str] = ("md", "csv", "html"), *,
                       warn: Callable[[str], None] = print, groups: list[Group] | None = None) -> list[Path]:
    """Aggregate the run records in ``results_dir`` into leaderboards under ``out_dir``
    (``groups``: those records as ``read_groups`` gave them, for a caller that reads them itself).

    Writes, per (suite, backbone, evaluator) group, ``<group>/<table>.<ext>`` for each of its tables (TABLE_NAMES)
    in each of ``formats`` (md, csv, html, latex) and the PNG plots; plus ``index.md`` (with
    md) and, with html, ``leaderboard.html``, every group on one self-contained page, and
    ``leaderboard.png``, its picture. Everything is rendered before anything is written.
    Warns about stale files (`stale_files`). Returns the written paths.
    """
    formats = check_formats(formats)
    groups = read_groups(Path(results_dir), warn) if groups is None else groups
    files: dict[str, bytes] = {}
    built = []
    for group in groups:
        stages = stage_table(group)
        group_tables = {table.name: table for table in (*tables(group), *([stages] if stages else []))}
        for table in group_tables.values():
            for name in formats:
                text = render.TABLE_RENDERERS[name](table, group)
                files[f"{group.folder}/{table.name}{render.FORMAT_SUFFIXES[name]}"] = text.encode("utf-8")
        group_plots = plots(group, group_tables.get("methods"))
        files |= {f"{group.folder}/{stem}.png": plot.png for stem, plot in group_plots.items()}
        built.append((group, group_tables, group_plots))
    if "md" in formats:
        files["index.md"] = render.render_index(groups, files).encode("utf-8")
    if "html" in formats:
        files["leaderboard.html"] = render_page(built, Sources(Path(results_dir), Path(out_dir))).encode("utf-8")
        files["leaderboard.png"] = page_picture(built)
    written = []
    for relative, data in files.items():
        write_bytes_atomic(Path(out_dir) / relative, data)
        written.append(Path(out_dir) / relative)
    for path in stale_files(Path(out_dir), set(files), formats):
        warn(f"{path} is stale: no record in {results_dir} makes it any more (delete it)")
    return written


def publish(results_dir: Path, out_dir: Path, formats: Iterable[str], readmes: Sequence[Path] = (), *,
            warn: Callable[[str], None] = print) -> tuple[list[Path], list[Path]]:
    """The publish step: ``build_leaderboards`` from ``results_dir`` into ``out_dir``, then each
    of ``readmes`` with its generated blocks rewritten from the same records, last; all of it
    while holding ``out_dir`` (a second publish into it is refused at once). Every README block
    is filled before any file is written, so a block naming no group fails with nothing written.
    Returns (the leaderboard files, the READMEs) written."""
    from dihal_bench.leaderboard.readme import embed_texts

    out_dir, readmes = Path(out_dir), [Path(readme) for readme in dict.fromkeys(readmes)]
    with folder_lock(out_dir, "leaderboard folder --out"):
        # what an earlier publish cut short by a kill left: no writer is under way while we hold the folder
        for readme in readmes:
            for left in readme.parent.glob(f".{readme.name}.*{TEMPORARY_SUFFIX}"):
                if is_temporary(left):
                    left.unlink(missing_ok=True)
        remove_temporaries(out_dir)
        groups = read_groups(Path(results_dir), warn)
        try:
            texts = {readme: readme.read_text(encoding="utf-8") for readme in readmes}
        except (OSError, UnicodeDecodeError) as exc:
            raise DihalError(f"cannot read --readme: {exc}") from None
        texts = embed_texts(texts, groups)
        written = build_leaderboards(Path(results_dir), out_dir, formats, warn=warn, groups=groups)
        for readme, text in texts.items():
            write_bytes_atomic(readme, text.encode("utf-8"))
    return written, list(texts)


def stale_files(out_dir: Path, written: set[str], formats: Sequence[str]) -> list[Path]:
    """The files under ``out_dir`` that a build in ``formats`` writes when a group has them, and
    that this build, which wrote ``written`` (paths relative to ``out_dir``), did not: what a
    group that no longer has records left behind. Files of other formats, and folders that
    hold no leaderboard (``leaderboards/locate``), are left out of it."""
    suffixes = {render.FORMAT_SUFFIXES[name] for name in formats} | {".png"}
    names = {f"{table}{suffix}" for table in TABLE_NAMES for suffix in suffixes} | {f"{stem}.png" for stem in PLOTS}
    found = [name for name, writer in TOP_LEVEL.items() if writer in formats and (out_dir / name).is_file()]
    for folder in sorted(path for path in out_dir.iterdir() if path.is_dir()) if out_dir.is_dir() else []:
        found += [f"{folder.name}/{path.name}" for path in sorted(folder.iterdir()) if path.name in names]
    return [out_dir / name for name in found if name not in written]
