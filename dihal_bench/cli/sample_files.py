"""``dihal-bench samples export``: every sample of a run record as JSON lines, from its job store."""

from __future__ import annotations

from pathlib import Path

import click

from dihal_bench.cli.app import CommandGroup, cli
from dihal_bench.errors import DihalError


@cli.group(cls=CommandGroup)
def samples():
    """A run's samples: the record keeps five texts per method, the job store all of them."""


@samples.command("export")
@click.argument("record_path", metavar="RECORD", type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False),
              help="Write the JSON lines here (default: beside the record, <record stem>.samples.jsonl).")
@click.option("--jobs", "jobs_dir", type=click.Path(file_okay=False),
              help="The run's job store, where the record's own path to it (relative to where the run was "
                   "started) does not lead to it from here.")
def export_cmd(record_path, out, jobs_dir):
    """Write every sample of RECORD, one JSON line each (method, seed, scale, index, text, token ids,
    and the per-sample NLL, token count and validity where the record's metrics carry them), as
    `dihal-bench run` does beside each record it writes (docs/method.md#records-and-leaderboards)."""
    from dihal_bench.study.jobs import JobStore
    from dihal_bench.study.records import load_record
    from dihal_bench.study.sample_export import export_samples

    record = load_record(Path(record_path))
    store = Path(jobs_dir) if jobs_dir is not None else Path(record["jobs"])
    if not store.is_dir():
        raise DihalError(f"the job store of {record_path}, {store}, is not here: the samples live only there "
                         f"(run this from the folder the run was started in, or give --jobs)")
    path = export_samples(Path(record_path), record, JobStore(store), Path(out) if out is not None else None)
    click.echo(f"wrote {path}")
