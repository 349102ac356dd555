"""``dihal-bench store prune``: a job store made small enough to keep beside its record."""

from __future__ import annotations

from pathlib import Path

import click

from dihal_bench.cli.app import CommandGroup, cli


@cli.group(cls=CommandGroup)
def store():
    """A run's job store (--out/<suite>/jobs): every job's result and artifacts."""


@store.command("prune")
@click.argument("jobs_dir", metavar="STORE", type=click.Path(exists=True, file_okay=False))
@click.option("--min-bytes", type=click.IntRange(min=1), default=None,
              help="Take out safetensors files of this size or more (default: 1 MiB: checkpoints and stored "
                   "hidden states).")
@click.option("--keep", multiple=True, metavar="JOB[/PATH]",
              help="A job folder (e.g. baseline-train-3f2a...) to leave whole, or JOB/PATH to leave what is at or "
                   "under PATH in it (e.g. baseline-train-3f2a.../model: the trained weights without the "
                   "optimizer state), for weights that are dear to make again; repeatable.")
def prune_cmd(jobs_dir, min_bytes, keep):
    """Take the large tensors (safetensors files) out of every finished job in STORE (their sha256 kept in the job's
    pruned.json) and remove jobs that never finished. The run that made the store, run again, finds
    every job done; a job that needs a pruned artifact has it made again, bit for bit, or stops
    (docs/method.md#pruned-job-stores)."""
    from dihal_bench.study.pruning import DEFAULT_MIN_BYTES, prune

    done = prune(Path(jobs_dir), min_bytes or DEFAULT_MIN_BYTES, frozenset(keep))
    click.echo(f"pruned {done.files} file(s), {done.bytes / 2**20:,.1f} MiB, from {done.jobs} job(s); "
               f"removed {done.unfinished} unfinished job(s)"
               + (f"; left {done.damaged} damaged job(s) for a run to redo" if done.damaged else ""))
