"""The ``dihal-bench`` command line."""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import click

from dihal_bench import __version__
from dihal_bench.errors import DihalError
from dihal_bench.suite import DIHAL_PROXIES


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


def _describe(registration) -> str:
    meta = registration.meta
    if "description" in meta:
        return meta["description"]
    if "higher_is_better" in meta:
        return "higher is better" if meta["higher_is_better"] else "lower is better"
    return ""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(as_json):
    """List every registered plugin object with its kind and distribution."""
    from tabulate import tabulate

    from dihal_bench.plugins import get_registry

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


def _parse_assignments(items, what: str) -> dict[str, str]:
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DihalError(f"{what} {item!r} is not of the form key=value")
        parsed[key.strip()] = value.strip()
    return parsed


def _number(text: str, what: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            raise DihalError(f"{what}: {text!r} is not a number") from None


@cli.command()
@click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True)
@click.option("--corpus", "corpus_name", default="stdlib-docs", show_default=True)
@click.option("--tokens", type=int, default=4096, show_default=True, help="Token hidden states sampled per layer (N).")
@click.option("--seq-len", type=int, default=128, show_default=True, help="Length of the validation sequences.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--proxies", default=",".join(DIHAL_PROXIES),
              show_default=True, help="Comma-separated proxy names, or 'all' for every registered proxy.")
@click.option("--preprocessing", default="trace", show_default=True, help="trace, standardize or none.")
@click.option("--param", "params", multiple=True, metavar="PROXY.KEY=VALUE", help="Override a proxy constant.")
@click.option("--weight", "weights", multiple=True, metavar="PROXY=W", help="Weight of a proxy in the score (default 1).")
@_backbone_options
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/locate", show_default=True,
              help="Folder for locate.json, locate.csv and locate.png.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), help="Write only the JSON record, here.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def locate(backbone_name, corpus_name, tokens, seq_len, seed, proxies, preprocessing, params, weights, device,
           dtype, out_dir, json_path, quiet):
    """Score every layer's hidden-state geometry and choose the insertion layer ℓ*."""
    from dihal_bench import locate as locate_module
    from dihal_bench.backbone import load_backbone
    from dihal_bench.corpus import load_corpus

    overrides: dict[str, dict] = {}
    for key, value in _parse_assignments(params, "--param").items():
        proxy, dot, name = key.partition(".")
        if not dot:
            raise DihalError(f"--param {key!r} must name PROXY.KEY")
        overrides.setdefault(proxy, {})[name] = _number(value, f"--param {key}")
    config = locate_module.LocateConfig(
        tokens=tokens, seq_len=seq_len, seed=seed,
        proxies=tuple(p.strip() for p in proxies.split(",") if p.strip()),
        preprocessing=preprocessing, params=overrides,
        weights={k: float(_number(v, f"--weight {k}")) for k, v in _parse_assignments(weights, "--weight").items()},
    )
    if tokens < 2:
        raise DihalError(f"--tokens {tokens} is too small: the proxies need at least 2 tokens per layer")
    locate_module.resolve_proxies(config.proxies)  # unknown names fail before any model loads
    backbone = load_backbone(backbone_name, device=device, dtype=dtype)
    corpus = load_corpus(corpus_name)
    result = locate_module.locate(backbone, corpus, config, progress=not quiet)
    click.echo(locate_module.format_table(result))
    timings = result["timings"]
    click.echo(f"ℓ* = {result['chosen_layer']} for {result['backbone']['name']} "
               f"(N={result['tokens_sampled']} tokens, {result['preprocessing']} preprocessing; "
               f"extraction {timings['extract_seconds']:.1f}s, proxies {timings['proxy_seconds']:.1f}s)")
    if json_path:
        _write_json(json_path, result)
        click.echo(f"wrote {json_path}")
    else:
        for path in locate_module.write_outputs(result, Path(out_dir)):
            click.echo(f"wrote {path}")


@cli.command()
def suites():
    """List the registered suites."""
    from tabulate import tabulate

    from dihal_bench.plugins import get_registry

    registry = get_registry()
    rows = [[r.name, r.source, r.meta.get("description", "")] for r in registry.all() if r.kind == "suite"]
    click.echo(tabulate(rows, headers=["suite", "from", "description"], maxcolwidths=[None, None, 90]))


def _resolved_suite(suite, backbone, corpus, evaluator, seeds, sets):
    from dihal_bench.suite import apply_overrides, resolve_suite

    name, config = resolve_suite(suite)
    overrides = _parse_assignments(sets, "--set")
    for key, value in (("backbone", backbone), ("corpus", corpus), ("evaluator", evaluator)):
        if value:
            overrides[key] = json.dumps(value)
    if seeds:
        try:
            overrides["seeds"] = json.dumps([int(s) for s in seeds.split(",") if s.strip()])
        except ValueError:
            raise DihalError(f"--seeds {seeds!r} is not a comma-separated list of integers") from None
    return name, apply_overrides(config, overrides)


@cli.command()
@click.option("--suite", default="diagnostic", show_default=True, help="A suite name (see `dihal-bench suites`) or a TOML file.")
@click.option("--backbone", help="Override the suite's backbone.")
@click.option("--corpus", help="Override the suite's corpus.")
@click.option("--evaluator", help="Override the suite's evaluator LM (Gen.PPL, MAUVE features).")
@click.option("--seeds", help="Comma-separated seeds, e.g. 0,1,2.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any suite key, e.g. budget.steps=100.")
@click.option("--out", "out_root", type=click.Path(file_okay=False), default="runs", show_default=True,
              help="Where jobs (checkpoints, samples, partial results) are kept; reused on restart.")
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="results", show_default=True,
              help="Where the run record is written.")
@click.option("--dry-run", is_flag=True, help="Print the resolved plan, the jobs and their estimated cost; run nothing.")
@click.option("--quiet", is_flag=True, help="No progress bars.")
def run(suite, backbone, corpus, evaluator, seeds, sets, out_root, results_dir, dry_run, quiet):
    """Run a whole suite: locate, sweep, DiHAL and every baseline, metrics, run record."""
    from dihal_bench.runner import run_suite

    name, config = _resolved_suite(suite, backbone, corpus, evaluator, seeds, sets)
    if dry_run:
        from dihal_bench.plan import format_plan

        click.echo(format_plan(name, config))
        return
    path = run_suite(name, config, out_root=Path(out_root), results_dir=Path(results_dir), progress=not quiet)
    click.echo(f"wrote run record {path}")


# -- training commands: sweep, bridge train, generate, baseline train/sample ---------------------


def _budget(sets, seed: int, section: tuple[str, ...], epochs: int | None = None):
    """The diagnostic suite's budget at ``section`` (its protocol is the default), with
    ``--set budget.KEY=VALUE`` overrides, ``--epochs`` and the seed applied."""
    from dihal_bench.budget import Budget
    from dihal_bench.suite import resolve_suite

    table = resolve_suite("diagnostic")[1]
    for key in section:
        table = table[key]
    overrides = {}
    for key, value in _parse_assignments(sets, "--set").items():
        head, dot, field = key.partition(".")
        if head != "budget" or not dot:
            raise DihalError(f"--set {key!r}: only budget.KEY=VALUE is accepted here")
        overrides[field] = value
    if epochs is not None:
        overrides["epochs"] = str(epochs)
    return Budget.from_dict({**table, "seed": seed}).with_overrides(overrides)


def _training_options(f):
    f = click.option("--quiet", is_flag=True, help="No progress bars.")(f)
    f = click.option("--epochs", type=int, help="Passes allowed over the training sequences (overrides the budget).")(f)
    f = click.option("--set", "sets", multiple=True, metavar="budget.KEY=VALUE",
                     help="Budget override, e.g. budget.steps=200.")(f)
    f = click.option("--seed", type=int, default=0, show_default=True)(f)
    f = click.option("--corpus", "corpus_name", default="stdlib-docs", show_default=True)(f)
    f = click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True)(f)
    return f


@cli.command()
@_training_options
@click.option("--layers", default="auto", show_default=True,
              help="Comma-separated layers, or 'auto' (about ten spread over the stack, always with ℓ*).")
@click.option("--eval-sequences", type=int, default=32, show_default=True, help="Validation sequences per layer.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/sweep", show_default=True)
def sweep(backbone_name, corpus_name, seed, sets, epochs, quiet, layers, eval_sequences, out_dir):
    """Train one bridge per layer under one protocol; table, rank correlations and plot."""
    from dihal_bench import sweep as sweep_module
    from dihal_bench.backbone import load_backbone
    from dihal_bench.corpus import load_corpus
    from dihal_bench.locate import LocateConfig, locate

    budget = _budget(sets, seed, ("sweep", "budget"), epochs)
    chosen_layers = None if layers == "auto" else _int_list(layers, "--layers")
    backbone = load_backbone(backbone_name)
    if chosen_layers is not None:
        sweep_module.check_layers(backbone, chosen_layers)
    corpus = load_corpus(corpus_name)
    located = locate(backbone, corpus, LocateConfig(seed=seed), progress=not quiet)
    if chosen_layers is None:
        chosen_layers = sweep_module.auto_layers(backbone.num_layers, located["chosen_layer"])
    spec = sweep_module.BridgeSpec(budget=budget)
    result = sweep_module.run_sweep(backbone, corpus, chosen_layers, spec, eval_sequences=eval_sequences,
                                    work_dir=Path(out_dir) / "checkpoints", progress=not quiet)
    result["correlations"] = sweep_module.layer_correlations(located, result["layers"], seed)
    result.update(locate=located, budget=budget.to_dict(), backbone=backbone.name, corpus=corpus.name)
    click.echo(sweep_module.format_sweep(result))
    for path in sweep_module.write_sweep_outputs(result, Path(out_dir)):
        click.echo(f"wrote {path}")


def _int_list(text: str, what: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise DihalError(f"{what} {text!r} is not a comma-separated list of integers") from None


@cli.group(cls=_Group)
def bridge():
    """Train a single DiHAL bridge (one layer)."""


@bridge.command("train")
@_training_options
@click.option("--layer", type=int, required=True, help="Replace layers 1..LAYER by the bridge.")
@click.option("--eval-sequences", type=int, default=32, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Checkpoint folder (resumes an interrupted training found there).")
def bridge_train(backbone_name, corpus_name, seed, sets, epochs, quiet, layer, eval_sequences, out_dir):
    """Train the DiHAL bridge for one layer, evaluate it, save a safetensors checkpoint."""
    from dihal_bench import sweep as sweep_module
    from dihal_bench.backbone import load_backbone
    from dihal_bench.bridge_io import save_bridge_checkpoint
    from dihal_bench.corpus import load_corpus

    budget = _budget(sets, seed, ("budget",), epochs)
    backbone = load_backbone(backbone_name)
    backbone.check_layer(layer)
    corpus = load_corpus(corpus_name)
    spec = sweep_module.BridgeSpec(budget=budget)
    result = sweep_module.run_sweep(backbone, corpus, [layer], spec, eval_sequences=eval_sequences,
                                    work_dir=Path(out_dir) / "training", progress=not quiet, keep_bridges=True)
    trained = result.pop("bridges")[layer]
    save_bridge_checkpoint(trained, spec.name, layer, backbone.name, Path(out_dir))
    row = result["layers"][0]
    _write_json(Path(out_dir) / "train.json", {**result, "budget": budget.to_dict()})
    click.echo(f"layer {layer}: bridge MSE {row['bridge_mse']:.4f}, R² {row['bridge_r2']:.3f}, hybrid PPL "
               f"{row['hybrid_ppl']:.2f} (backbone {result['backbone_ppl']:.2f}, skip control {row['skip_ppl']:.1f}), "
               f"KL {row['kl_to_backbone']:.3f}; {row['steps']} steps in {row['train_seconds']:.0f}s")
    click.echo(f"wrote checkpoint {out_dir}")


@cli.command()
@click.option("--checkpoint", type=click.Path(file_okay=False), required=True, help="A `bridge train` output folder.")
@click.option("-n", "count", type=int, default=4, show_default=True, help="Number of samples.")
@click.option("--max-new-tokens", type=int, default=48, show_default=True)
@click.option("--temperature", type=float, default=0.8, show_default=True)
@click.option("--top-p", type=float, default=0.95, show_default=True)
@click.option("--steps", type=int, help="Bridge sampling steps K (default: the bridge's own).")
@click.option("--prompt", help="Text to continue (default: unconditional from the start token).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--no-sink-passthrough", is_flag=True, help="Ablation: let the bridge produce position 0 too.")
def generate(checkpoint, count, max_new_tokens, temperature, top_p, steps, prompt, seed, no_sink_passthrough):
    """Sample text from a DiHAL hybrid: bridge → upper layers → LM head."""
    from dihal_bench.backbone import load_backbone
    from dihal_bench.bridge_io import load_bridge_checkpoint, read_bridge_meta
    from dihal_bench.hybrid import HybridLM

    meta = read_bridge_meta(Path(checkpoint))
    backbone = load_backbone(meta["backbone"])
    trained, layer = load_bridge_checkpoint(Path(checkpoint), backbone)
    hybrid = HybridLM(backbone, trained, layer, sink_passthrough=not no_sink_passthrough, steps=steps)
    prompt_ids = None
    if prompt:
        prompt_ids = backbone.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    ids = hybrid.generate(count, max_new_tokens, prompt_ids=prompt_ids, temperature=temperature, top_p=top_p,
                          seed=seed, batch_size=count)
    for i, text in enumerate(backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)):
        click.echo(f"--- sample {i} (DiHAL ℓ={layer}, {backbone.name}) ---\n{prompt or ''}{text}")


@cli.group(cls=_Group)
def baseline():
    """Train and sample the baselines (diffusion-lm, sed, ld4lg, codar, ar-backbone)."""


def _baseline(name, backbone, budget, seed, options):
    from dihal_bench.plugins import get_registry
    from dihal_bench.sweep import BridgeSpec

    cls = get_registry().get("baseline", name).obj
    if budget.param_allowance is None:  # DiHAL's default bridge sets the allowance, as in the suites
        budget = budget.replace(param_allowance=BridgeSpec(budget=budget).parameter_count(backbone.width))
    return cls(backbone, budget, seed, **options)


@baseline.command("train")
@click.argument("name")
@_training_options
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="A baseline option, e.g. embed_dim=32.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Checkpoint folder (default runs/baselines/NAME).")
def baseline_train(name, backbone_name, corpus_name, seed, sets, epochs, quiet, options, out_dir):
    """Train baseline NAME under the matched budget; prints its parameter table."""
    from tabulate import tabulate

    from dihal_bench.backbone import load_backbone
    from dihal_bench.corpus import load_corpus
    from dihal_bench.plugins import get_registry
    from dihal_bench.suite import parse_value
    from dihal_bench.sweep import packed_split, training_subset

    get_registry().get("baseline", name)
    budget = _budget(sets, seed, ("budget",), epochs)
    out = Path(out_dir or Path("runs") / "baselines" / name)
    backbone = load_backbone(backbone_name)
    model = _baseline(name, backbone, budget, seed,
                      {k: parse_value(v) for k, v in _parse_assignments(options, "--option").items()})
    sequences = training_subset(packed_split(backbone, load_corpus(corpus_name), "train", budget.seq_len),
                                [model.budget], seed)
    result = model.fit(sequences, checkpoint_dir=out / "checkpoint", progress=not quiet)
    model.save(out / "model")
    counts = model.parameter_counts()
    rows = [[part, f"{n:,}"] for part, n in counts.items()] + [["total", f"{sum(counts.values()):,}"]]
    click.echo(tabulate(rows, headers=[name, "trainable parameters"]))
    allowance = model.budget.param_allowance
    click.echo(f"allowance {allowance:,} (±{model.budget.allowance_tolerance:.0%}); {result.steps_done} steps, "
               f"{result.tokens_seen:,} tokens, {result.wall_seconds:.0f}s" if model.in_budget
               else f"{name} trains nothing (reference outside the budget)")
    click.echo(f"wrote {out / 'model'}")


@baseline.command("sample")
@click.argument("name")
@click.option("--backbone", "backbone_name", default="smollm2-135m", show_default=True)
@click.option("--from", "out_dir", type=click.Path(file_okay=False), help="Trained folder (default runs/baselines/NAME).")
@click.option("-n", "count", type=int, default=4, show_default=True)
@click.option("--seq-len", type=int, default=48, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def baseline_sample(name, backbone_name, out_dir, count, seq_len, seed):
    """Print samples from a trained baseline NAME."""
    import json as json_module

    from dihal_bench.backbone import load_backbone
    from dihal_bench.baseline import CONFIG_FILE
    from dihal_bench.budget import Budget

    folder = Path(out_dir or Path("runs") / "baselines" / name) / "model"
    if not (folder / CONFIG_FILE).is_file():
        raise DihalError(f"no trained {name} in {folder}; run `dihal-bench baseline train {name}` first")
    saved = json_module.loads((folder / CONFIG_FILE).read_text())
    backbone = load_backbone(backbone_name)
    model = _baseline(name, backbone, Budget.from_dict(saved["budget"]), saved["seed"], saved["options"])
    model.load(folder)
    ids = model.sample(count, seq_len, seed, batch_size=count)
    for i, text in enumerate(backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)):
        click.echo(f"--- {name} sample {i} ---\n{text}")


@cli.command()
@click.option("--results", "results_dir", type=click.Path(file_okay=False), default="results", show_default=True)
@click.option("--format", "formats", default="md,csv,html", show_default=True, help="Any of md, csv, html, latex.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="leaderboards", show_default=True)
def leaderboard(results_dir, formats, out_dir):
    """Aggregate run records (mean ± std over seeds) into method, layer and proxy tables."""
    from dihal_bench.leaderboard import build_leaderboards

    paths = build_leaderboards(Path(results_dir), Path(out_dir), tuple(f.strip() for f in formats.split(",")),
                               warn=lambda message: click.echo(f"Warning: {message}", err=True))
    click.echo(f"wrote {len(paths)} files to {out_dir}")


@cli.command("lm-eval")
@click.option("--model-args", help="backbone=NAME[,layer=L,bridge=CHECKPOINT_DIR,steps=K,max_length=N]")
@click.option("--record", "record_path", type=click.Path(dir_okay=False, exists=True),
              help="Instead of --model-args: evaluate METHOD of this run record and add the results to it.")
@click.option("--method", help="With --record: ar-backbone or a dihal-* method.")
@click.option("--seed", type=int, help="With --record: which seed's model (default: the first).")
@click.option("--tasks", default="dihal-local", show_default=True,
              help="Comma-separated lm-eval tasks; dihal-local = rolling perplexity on the corpus's test split.")
@click.option("--corpus", help="Corpus of the dihal-local task (default: the record's, else stdlib-docs).")
@click.option("--limit", type=int, help="At most this many documents per task.")
@click.option("--batch-size", type=int, default=4, show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Write lm_eval.json here.")
def lm_eval_cmd(model_args, record_path, method, seed, tasks, corpus, limit, batch_size, out_dir):
    """Evaluate the backbone or a DiHAL hybrid with lm-evaluation-harness (needs dihal-bench[lm-eval])."""
    from dihal_bench import lm_eval_adapter

    if bool(model_args) == bool(record_path):
        raise DihalError("give either --model-args or --record with --method")
    if record_path:
        if not method:
            raise DihalError("--record needs --method (ar-backbone or dihal-chosen, dihal-worst, dihal-oracle)")
        record = json.loads(Path(record_path).read_text())
        model_args, seed = lm_eval_adapter.model_args_from_record(record, method, seed)
        corpus = corpus or record["corpus"]
    summary = lm_eval_adapter.run_lm_eval(model_args, [t.strip() for t in tasks.split(",") if t.strip()],
                                          limit=limit, corpus=corpus or "stdlib-docs", batch_size=batch_size,
                                          out_dir=Path(out_dir) if out_dir else None)
    click.echo(json.dumps(summary["results"], indent=2))
    if record_path:
        lm_eval_adapter.attach_to_record(Path(record_path), method, seed, summary)
        click.echo(f"added to {record_path} ({method}, seed {seed}); rebuild tables with `dihal-bench leaderboard`")


def main():
    cli(prog_name="dihal-bench")


if __name__ == "__main__":
    main()
