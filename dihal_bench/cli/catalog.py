"""What is installed: ``plugins``, ``suites``, and the conformance ``check`` commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from dihal_bench.cli.app import (
    CommandGroup,
    FiniteFloatRange,
    chosen_device,
    cli,
    model_options,
    quiet_option,
    write_json,
)


def _describe(registration) -> str:
    """The registration's description, with its direction where it has one (a proxy, a metric)."""
    meta = registration.meta
    direction = {True: "higher is better", False: "lower is better"}.get(meta.get("higher_is_better"))
    described = meta.get("description", "")
    return "; ".join(part for part in (described, direction) if part)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json):
    """List every registered plugin object with its kind and distribution."""
    from tabulate import tabulate

    from dihal_bench.registry.plugins import get_registry

    registry = get_registry()
    rows = [
        {"kind": r.kind, "name": r.name, "plugin": r.plugin, "distribution": r.distribution, "version": r.version,
         "description": _describe(r)}
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


@cli.group(cls=CommandGroup)
def check():
    """Conformance checks for backbone and corpus plugins."""


@check.command("backbone")
@click.argument("name")
@model_options(from_suite=False)
@click.option("--tolerance", type=FiniteFloatRange(min=0, min_open=True), default=None,
              help="Max |Δlogit| relative to max |logit| (default 1e-4).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Also write the report as JSON here.")
@quiet_option
def check_backbone_cmd(name, device, dtype, tolerance, json_path, quiet):
    """Check that backbone NAME can be resumed from every layer's hidden state."""
    from tabulate import tabulate

    from dihal_bench.api.conformance import DEFAULT_TOLERANCE, check_backbone
    from dihal_bench.registry.resolve import load_backbone
    from dihal_bench.study.preflight import check_backbone_name, check_writable

    check_backbone_name(name)
    device, dtype = chosen_device(device, dtype)
    if json_path:
        check_writable(Path(json_path).parent, "--json folder")
    backbone = load_backbone(name, device=device, dtype=dtype)
    report = check_backbone(backbone, DEFAULT_TOLERANCE if tolerance is None else tolerance)
    click.echo(f"{report['name']}: {report['layers']} layers, width {report['width']}, vocabulary {report['vocab']}, "
               f"{report['parameters']:,} parameters ({report['dtype']}, {report['device']})")
    rows = [[layer, f"{d:.3g}", f"{d / report['logit_scale']:.2e}", f"{t:.2e}"]
            for layer, (d, t) in enumerate(zip(report["max_abs_diff"], report["truncated_relative_diff"]))]
    click.echo(tabulate(rows, headers=["resume from ℓ", "max |Δlogit|", "relative", "truncated pass |Δh_ℓ| (rel.)"]))
    verdict = "PASS" if report["passed"] else "FAIL"
    click.echo(f"{verdict}: worst relative difference {report['worst_relative']:.2e} "
               f"(tolerance {report['tolerance']:.0e}, logit scale {report['logit_scale']:.2f}, "
               f"{report['probe_tokens']} probe tokens)")
    if json_path:
        write_json(json_path, report)
    if not report["passed"]:
        sys.exit(1)


@check.command("corpus")
@click.argument("name")
@click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True, help="Tokenizer to use.")
@click.option("--seq-len", type=click.IntRange(min=2), default=64, show_default=True, help="Packed sequence length T.")
@quiet_option
def check_corpus_cmd(name, backbone_name, seq_len, quiet):
    """Print document and token counts per split of corpus NAME."""
    from tabulate import tabulate

    from dihal_bench.api.corpus import split_stats
    from dihal_bench.registry.plugins import build_named
    from dihal_bench.registry.resolve import backbone_tokenizer, load_backbone
    from dihal_bench.study.preflight import check_backbone_name, check_corpus_name

    check_corpus_name(name)
    check_backbone_name(backbone_name, "--backbone")
    corpus = build_named("corpus", name)
    # the counts need only the tokenizer: the model loads only for a plugin that cannot give it alone
    tokenizer = backbone_tokenizer(backbone_name)
    if tokenizer is None:
        tokenizer = load_backbone(backbone_name).tokenizer
    stats = split_stats(corpus, tokenizer, seq_len)
    rows = [[split, *s.values()] for split, s in stats.items()]
    headers = ["split", *next(iter(stats.values())).keys()]
    click.echo(f"{corpus.name}: {corpus.description}  (tokenizer: {backbone_name}, T={seq_len})")
    click.echo(tabulate(rows, headers=headers, intfmt=","))


@cli.command()
def suites():
    """List the registered suites."""
    from tabulate import tabulate

    from dihal_bench.registry.plugins import get_registry

    registry = get_registry()
    rows = [[r.name, r.source, r.meta.get("description", "")] for r in registry.all() if r.kind == "suite"]
    click.echo(tabulate(rows, headers=["suite", "from", "description"], maxcolwidths=[None, None, 90]))
