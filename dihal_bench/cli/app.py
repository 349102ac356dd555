"""The ``dihal-bench`` group: one-line errors, and what the command modules share."""

from __future__ import annotations

import math
import shlex
import sys
import traceback
from pathlib import Path

import click

from dihal_bench import __version__
from dihal_bench.base.values import INT64_MAX
from dihal_bench.config.suite import AUTO, DTYPES
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
        given = kwargs.get("args", args[0] if args else None)
        self.argv = list(sys.argv[1:] if given is None else given)
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
        except KeyboardInterrupt as exc:
            click.echo(f"Interrupted.{self.resume_hint(exc)}", err=True)
            ctx.exit(130)

    def resume_hint(self, exc: KeyboardInterrupt) -> str:
        """What a run that stops part-way (runner.RunInterrupted) has done and the command that
        resumes it: the same command line, since finished jobs are found again by their keys."""
        done, total = getattr(exc, "done", None), getattr(exc, "total", None)
        if done is None or total is None:
            return ""
        command = shlex.join(["dihal-bench", *getattr(self, "argv", [])])
        return f" {done} of {total} units done; run the same command again to resume: {command}"


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


def chosen_device(device: str, dtype: str) -> tuple[str, str]:
    """``--device`` and ``--dtype`` as this machine runs them: ``auto`` resolved (CUDA, else MPS,
    else CPU; bfloat16 on a GPU that computes in it, else float32), then checked."""
    from dihal_bench.config.suite import resolve_device, resolve_dtype
    from dihal_bench.study.preflight import check_device, check_dtype

    device = resolve_device(device)
    check_device(device, "--device")
    dtype = resolve_dtype(dtype, device)
    check_dtype(dtype, "--dtype")
    return device, dtype


def model_options(*, from_suite: bool):
    """``--device`` and ``--dtype``, the same on every command that loads a model: ``auto`` by
    default, or (``from_suite``) the device and dtype of the suite the command trains under."""
    default = None if from_suite else AUTO
    suffix = "; default: the suite's" if from_suite else ""

    def decorate(f):
        f = click.option("--dtype", type=click.Choice((AUTO, *DTYPES)), default=default, show_default=not from_suite,
                         help=f"auto: bfloat16 on a GPU that computes in it, else float32{suffix}.")(f)
        f = click.option("--device", default=default, show_default=not from_suite,
                         help=f"cpu, cuda, cuda:1, mps, or auto (CUDA, else MPS, else CPU){suffix}.")(f)
        return f

    return decorate


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
