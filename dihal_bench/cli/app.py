"""The ``dihal-bench`` group: one-line errors, and what the command modules share."""

from __future__ import annotations

import math
import sys
import traceback
from pathlib import Path

import click

from dihal_bench import __version__
from dihal_bench.base.values import INT64_MAX
from dihal_bench.config.suite import DTYPES
from dihal_bench.errors import DihalError

#: a seed: torch's generators take at most a signed 64-bit integer
SEED = click.IntRange(min=0, max=INT64_MAX)


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange without nan and inf: nan passes every bound check (each comparison
    with it is false), and then fails deep inside sampling or a conformance test."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


class CommandGroup(click.Group):
    """Turns user errors into one line and a non-zero exit (``--debug`` shows the traceback)."""

    def main(self, *args, **kwargs):
        # click's own usage errors (a bad option value) get the same single ``Error:`` line as
        # ours instead of click's three-line usage block
        kwargs.pop("standalone_mode", None)
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except click.ClickException as exc:
            click.echo(f"Error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DihalError as exc:
            if ctx.find_root().params.get("debug"):
                traceback.print_exc()
            click.echo(f"Error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)


def write_json(path: str | Path, payload: dict) -> None:
    from dihal_bench.base.files import write_json_atomic

    write_json_atomic(Path(path), payload)


@click.group(cls=CommandGroup)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="dihal-bench")
def cli(debug):
    """dihal-bench: where should diffusion enter a pretrained language model?

    Locate the diffusion-friendly layer of a backbone, replace the layers below it with a
    diffusion bridge, and compare against continuous-diffusion baselines.
    """


def backbone_options(f):
    f = click.option("--dtype", type=click.Choice(DTYPES), default="float32", show_default=True)(f)
    f = click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")(f)
    return f


def parse_assignments(items, what: str) -> dict[str, str]:
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DihalError(f"{what} {item!r} is not of the form key=value")
        parsed[key.strip()] = value.strip()
    return parsed


def parse_number(text: str, what: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise DihalError(f"{what}: {text!r} is not a number") from None


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DihalError(f"{what} {text!r} is not a comma-separated list of integers") from None


def _silence_libraries(ctx: click.Context, param: click.Parameter, quiet: bool) -> bool:
    """``--quiet`` also turns off the progress bars of the libraries that load models and data."""
    if quiet:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    return quiet


#: the ``--quiet`` flag of every command that does long work
quiet_option = click.option("--quiet", is_flag=True, help="No progress bars.", callback=_silence_libraries)
