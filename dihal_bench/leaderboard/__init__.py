"""Leaderboards: run records aggregated into tables and plots (docs/method.md#records-and-leaderboards).

Records are grouped by (suite, backbone, evaluator), and each (configuration, seed) of a group
is pooled once, from its newest record: each table cell is the mean ± sample standard
deviation (ddof=1) over the seeds that have the value, with n, the number of those seeds. A
group gets three tables:

- methods: one row per method (DiHAL at ℓ*, worst and oracle layers, the baselines and the
  backbone itself) with each metric the records declare (their ``metrics`` mapping gives the
  columns, titles, arrows and order), latency and training budget;
- layers: one row per swept layer with each locate proxy's raw value, the combined score
  S(ℓ) and the sweep's bridgeability and hybrid measurements;
- proxies: the rank correlation of each proxy and of S(ℓ) with −(bridge validation MSE).

and PNG plots (`plot`). The modules follow the data: `read` (records to rows), `aggregate`
(rows to tables), `render` (tables as md, csv, html, latex), `plot`, and `page` (the single
page). Every output is rendered in memory before the first file is written, and each file is
written atomically, so a failure never leaves half a leaderboard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from dihal_bench.base.files import write_bytes_atomic
from dihal_bench.errors import DihalError, unknown_name
from dihal_bench.leaderboard import render
from dihal_bench.leaderboard.aggregate import tables
from dihal_bench.leaderboard.page import render_page
from dihal_bench.leaderboard.plot import plots
from dihal_bench.leaderboard.read import read_groups

__all__ = ["build_leaderboards"]


def check_formats(formats: Iterable[str]) -> list[str]:
    formats = list(dict.fromkeys(formats))
    if not formats:
        raise DihalError("no leaderboard format given")
    for name in formats:
        if name not in render.FORMAT_SUFFIXES:
            raise unknown_name("leaderboard format", name, render.FORMAT_SUFFIXES)
    return formats


def build_leaderboards(results_dir: Path, out_dir: Path, formats: Iterable[str] = ("md", "csv", "html"), *,
                       warn: Callable[[str], None] = print) -> list[Path]:
    """Aggregate the run records in ``results_dir`` into leaderboards under ``out_dir``.

    Writes, per (suite, backbone, evaluator) group, ``<group>/methods|layers|proxies.<ext>``
    in each of ``formats`` (md, csv, html, latex) and the PNG plots; plus ``index.md`` (with
    md) and ``leaderboard.html``, every group on one self-contained page (with html).
    Everything is rendered before anything is written. Returns the written paths.
    """
    formats = check_formats(formats)
    groups = read_groups(Path(results_dir), warn)
    files: dict[str, bytes] = {}
    built = []
    for group in groups:
        group_tables = {table.name: table for table in tables(group)}
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
        files["leaderboard.html"] = render_page(built).encode("utf-8")
    written = []
    for relative, data in files.items():
        write_bytes_atomic(Path(out_dir) / relative, data)
        written.append(Path(out_dir) / relative)
    return written
