"""``dihal-bench locate``: the per-layer geometry table and ℓ*."""

from __future__ import annotations

from pathlib import Path

import click

from dihal_bench.cli.app import (
    SEED,
    chosen_device,
    cli,
    model_options,
    parse_assignments,
    parse_number,
    quiet_option,
    write_json,
)
from dihal_bench.errors import DihalError
from dihal_bench.locate.defaults import DIHAL_PROXIES, PREPROCESSING_MODES


@cli.command()
@click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True)
@click.option("--corpus", "corpus_name", default="stdlib-docs", show_default=True)
@click.option("--tokens", type=click.IntRange(min=2), default=4096, show_default=True, help="Token hidden states sampled per layer (N).")
@click.option("--seq-len", type=click.IntRange(min=2), default=128, show_default=True, help="Length of the validation sequences.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--proxies", default=",".join(DIHAL_PROXIES),
              show_default=True, help="Comma-separated proxy names, or 'all' for every registered proxy.")
@click.option("--preprocessing", type=click.Choice(PREPROCESSING_MODES), default="trace", show_default=True,
              help="The preprocessing whose S(ℓ) chooses ℓ*.")
@click.option("--variants", default="trace,standardize,trace-drop-top", show_default=True,
              help="Comma-separated preprocessings whose S(ℓ) and ℓ* are shown beside (empty: none).")
@click.option("--drop-top", type=click.IntRange(min=0), default=4, show_default=True,
              help="k of trace-drop-top: the largest-variance channels removed from each layer.")
@click.option("--param", "params", multiple=True, metavar="PROXY.KEY=VALUE", help="Override a proxy constant.")
@click.option("--weight", "weights", multiple=True, metavar="PROXY=W", help="Weight of a proxy in the score (default 1).")
@model_options(from_suite=False)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/locate", show_default=True,
              help="Folder for locate.json, locate.csv and locate.png.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write only the JSON record, here.")
@quiet_option
def locate(backbone_name, corpus_name, tokens, seq_len, seed, proxies, preprocessing, variants, drop_top, params,
           weights, device, dtype, out_dir, json_path, quiet):
    """Score every layer's hidden-state geometry and choose the insertion layer ℓ*."""
    import math

    from dihal_bench.locate import pipeline as locate_module
    from dihal_bench.registry.resolve import (
        backbone_tokenizer,
        describe_backbone,
        load_backbone,
        load_corpus,
    )
    from dihal_bench.study.preflight import (
        check_backbone_name,
        check_corpus_name,
        check_locate_inputs,
        check_writable,
    )

    selected = tuple(p.strip() for p in proxies.split(",") if p.strip())
    if not selected:
        raise DihalError("--proxies names no proxy")
    resolved = locate_module.resolve_proxies(selected)  # unknown names fail before any model loads
    names = set(resolved)
    overrides: dict[str, dict] = {}
    for key, value in parse_assignments(params, "--param").items():
        proxy, dot, name = key.partition(".")
        if not dot or not name:
            raise DihalError(f"--param {key!r} must name PROXY.KEY")
        if proxy not in names:
            raise DihalError(f"--param {key!r}: proxy {proxy!r} is not among the selected proxies ({', '.join(sorted(names))})")
        overrides.setdefault(proxy, {})[name] = parse_number(value, f"--param {key}")
    weight_values = {}
    for proxy, text in parse_assignments(weights, "--weight").items():
        if proxy not in names:
            raise DihalError(f"--weight {proxy}: not among the selected proxies ({', '.join(sorted(names))})")
        weight_values[proxy] = float(parse_number(text, f"--weight {proxy}"))
        if not math.isfinite(weight_values[proxy]):
            raise DihalError(f"--weight {proxy}={text}: a weight must be a finite number")
    config = locate_module.LocateConfig(tokens=tokens, seq_len=seq_len, seed=seed, proxies=selected,
                                        preprocessing=preprocessing, params=overrides, weights=weight_values,
                                        variants=locate_module.check_variants(
                                            v.strip() for v in variants.split(",") if v.strip()),
                                        drop_top=drop_top)
    check_backbone_name(backbone_name, "--backbone")
    check_corpus_name(corpus_name, "--corpus")
    device, dtype = chosen_device(device, dtype)
    check_writable(Path(json_path).parent if json_path else Path(out_dir), "output folder")
    corpus = load_corpus(corpus_name)  # before the backbone: usually the quicker to fail
    check_locate_inputs(describe_backbone(backbone_name), backbone_tokenizer(backbone_name), corpus, tokens=tokens,
                        seq_len=seq_len, drop_top=drop_top, key="--")
    backbone = load_backbone(backbone_name, device=device, dtype=dtype)
    result = locate_module.locate(backbone, corpus, config, progress=not quiet)
    click.echo(locate_module.format_table(result))
    timings = result["timings"]
    click.echo(f"ℓ* = {result['chosen_layer']} for {result['backbone']['name']} "
               f"(N={result['tokens_sampled']} tokens, {result['preprocessing']} preprocessing; "
               f"extraction {timings['extract_seconds']:.1f}s, proxies {timings['proxy_seconds']:.1f}s, "
               f"other preprocessings {timings['variant_seconds']:.1f}s)")
    for line in locate_module.summary_lines(result):
        click.echo(line)
    if json_path:
        write_json(json_path, result)
        click.echo(f"wrote {json_path}")
    else:
        for path in locate_module.write_outputs(result, Path(out_dir)):
            click.echo(f"wrote {path}")
