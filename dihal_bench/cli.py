"""The ``dihal-bench`` command line."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from dihal_bench import __version__
from dihal_bench.errors import DihalError


class _Group(click.Group):
    """Turns user errors into one line and a non-zero exit (``--debug`` shows the traceback)."""

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


def _write_json(path: str | Path, payload: dict) -> None:
    from dihal_bench.records import write_json_atomic

    write_json_atomic(Path(path), payload)


@click.group(cls=_Group)
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
@click.version_option(__version__, prog_name="dihal-bench")
def cli(debug):
    """dihal-bench: where should diffusion enter a pretrained language model?

    Locate the diffusion-friendly layer of a backbone, replace the layers below it with a
    diffusion bridge, and compare against continuous-diffusion baselines.
    """


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json):
    """List every registered plugin object with its kind and distribution."""
    from tabulate import tabulate

    from dihal_bench.plugins import get_registry

    registry = get_registry()
    rows = [
        {"kind": r.kind, "name": r.name, "plugin": r.plugin, "distribution": r.distribution, "version": r.version,
         "description": r.meta.get("description", "")}
        for r in registry.all()
    ]
    failures = [{"plugin": f.plugin, "distribution": f.distribution, "reason": f.reason} for f in registry.failures]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "failures": failures}, indent=2))
    else:
        table = [[r["kind"], r["name"], f"{r['distribution']} {r['version']}" if r["distribution"] else r["plugin"],
                  r["description"]] for r in rows]
        click.echo(tabulate(table, headers=["kind", "name", "from", "description"]))
    for f in failures:
        click.echo(f"Warning: plugin {f['plugin']!r} ({f['distribution'] or 'no distribution'}) failed to load: "
                   f"{f['reason']}", err=True)


@cli.group(cls=_Group)
def check():
    """Conformance checks for backbone and corpus plugins."""


def _backbone_options(f):
    f = click.option("--dtype", default="float32", show_default=True, help="float32, bfloat16 or float16.")(f)
    f = click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")(f)
    return f


@check.command("backbone")
@click.argument("name")
@_backbone_options
@click.option("--tolerance", type=float, default=None, help="Max |Δlogit| relative to max |logit| (default 1e-4).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the report as JSON here.")
def check_backbone_cmd(name, device, dtype, tolerance, json_path):
    """Check that backbone NAME can be resumed from every layer's hidden state."""
    from tabulate import tabulate

    from dihal_bench.backbone import load_backbone
    from dihal_bench.conformance import DEFAULT_TOLERANCE, check_backbone

    backbone = load_backbone(name, device=device, dtype=dtype)
    report = check_backbone(backbone, DEFAULT_TOLERANCE if tolerance is None else tolerance)
    click.echo(f"{report['name']}: {report['layers']} layers, width {report['width']}, vocabulary {report['vocab']}, "
               f"{report['parameters']:,} parameters ({report['dtype']}, {report['device']})")
    rows = [[layer, f"{d:.3g}", f"{d / report['logit_scale']:.2e}"] for layer, d in enumerate(report["max_abs_diff"])]
    click.echo(tabulate(rows, headers=["resume from ℓ", "max |Δlogit|", "relative"]))
    verdict = "PASS" if report["passed"] else "FAIL"
    click.echo(f"{verdict}: worst relative difference {report['worst_relative']:.2e} "
               f"(tolerance {report['tolerance']:.0e}, logit scale {report['logit_scale']:.2f}, "
               f"{report['probe_tokens']} probe tokens)")
    if json_path:
        _write_json(json_path, report)
    if not report["passed"]:
        sys.exit(1)


@check.command("corpus")
@click.argument("name")
@click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True, help="Tokenizer to use.")
@click.option("--seq-len", type=int, default=64, show_default=True, help="Packed sequence length T.")
def check_corpus_cmd(name, backbone_name, seq_len):
    """Print document and token counts per split of corpus NAME."""
    from tabulate import tabulate

    from dihal_bench.backbone import load_backbone
    from dihal_bench.corpus import load_corpus, split_stats

    corpus = load_corpus(name)
    backbone = load_backbone(backbone_name)
    stats = split_stats(corpus, backbone.tokenizer, seq_len)
    rows = [[split, *s.values()] for split, s in stats.items()]
    headers = ["split", *next(iter(stats.values())).keys()]
    click.echo(f"{corpus.name}: {corpus.description}  (tokenizer: {backbone.name}, T={seq_len})")
    click.echo(tabulate(rows, headers=headers, intfmt=","))


def main():
    cli(prog_name="dihal-bench")


if __name__ == "__main__":
    main()
