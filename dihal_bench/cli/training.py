"""Single-stage training commands under a suite's protocol: ``sweep``, ``bridge train``,
``generate``, ``baseline train`` and ``baseline sample``."""

from __future__ import annotations

from pathlib import Path

import click

from dihal_bench.cli.app import (
    SEED,
    CommandGroup,
    FiniteFloatRange,
    chosen_device,
    cli,
    model_options,
    parse_assignments,
    parse_int_list,
    quiet_option,
    write_json,
)
from dihal_bench.cli.study import resolved_suite
from dihal_bench.errors import DihalError


def _protocol(suite, sets, seed: int, section: str, epochs: int | None, backbone_name: str | None,
              corpus_name: str | None, out_dir: Path, device: str | None, dtype: str | None,
              layers: list[int] = (), locate_config=None):
    """The budget of ``section`` of a suite's protocol (``--suite``, the diagnostic one by default)
    with ``--set budget.KEY=VALUE`` overrides, ``--epochs`` and the seed applied, through the same
    parser as ``dihal-bench run``; the backbone, corpus, device and dtype are the suite's unless
    the command names them. Everything is checked before any model loads: the names, the output
    folder, and with the backbone plugin's ``describe`` and ``tokenizer`` hooks the ``layers``
    against its depth, the budget against the training split and (``locate_config``) locate's
    tokens and channels. Then the backbone loads, and the command says which protocol it uses:
    so that a refusal is the only line it prints. Returns (resolved suite, budget, corpus, backbone)."""
    from dihal_bench.config.suite import apply_overrides
    from dihal_bench.registry.resolve import (
        backbone_tokenizer,
        describe_backbone,
        load_backbone,
        load_corpus,
    )
    from dihal_bench.study.preflight import check_budget_fits, check_locate_inputs
    from dihal_bench.study.protocol import section_budget

    overrides = parse_assignments(sets, "--set")
    for key in overrides:
        if not key.startswith("budget.") or key.count(".") != 1:
            raise DihalError(f"--set {key!r}: only budget.KEY=VALUE is accepted here")
    if epochs is not None:
        overrides["budget.epochs"] = str(epochs)
    name, config = resolved_suite(suite, backbone_name, corpus_name, None, None, ())
    # the command's --set budget.* applies to the section it trains under
    prefix = "budget." if section == "budget" else "sweep.budget."
    config = apply_overrides(config, {prefix + key.partition(".")[2]: value for key, value in overrides.items()})
    budget = section_budget(config, section, seed)
    device, dtype = chosen_device(device or config.device, dtype or config.dtype)
    _check_training_inputs(config, out_dir)
    corpus = load_corpus(config.corpus)  # before the backbone: usually the quicker to fail
    shape = describe_backbone(config.backbone)
    if shape is not None:
        for layer in layers:
            shape.check_layer(layer)
    tokenizer = backbone_tokenizer(config.backbone)
    if locate_config is not None:
        check_locate_inputs(shape, tokenizer, corpus, tokens=locate_config.tokens, seq_len=locate_config.seq_len,
                            drop_top=locate_config.drop_top, key="locate.")
    if tokenizer is not None:
        check_budget_fits(budget, tokenizer, corpus)
    backbone = load_backbone(config.backbone, device=device, dtype=dtype)
    click.echo(f"protocol: suite {name!r} ({config.backbone} on {device}, {dtype}), {section} = {budget.steps} "
               f"steps x {budget.batch_size} x {budget.seq_len} tokens, lr {budget.lr:g}, epochs {budget.epochs}",
               err=True)
    return config, budget, corpus, backbone


def _training_options(f):
    f = quiet_option(f)
    f = model_options(from_suite=True)(f)
    f = click.option("--epochs", type=click.IntRange(min=1), help="Passes allowed over the training sequences (overrides the budget).")(f)
    f = click.option("--set", "sets", multiple=True, metavar="budget.KEY=VALUE",
                     help="Budget override, e.g. budget.steps=200.")(f)
    f = click.option("--seed", type=SEED, default=0, show_default=True)(f)
    f = click.option("--corpus", "corpus_name", help="Default: the suite's corpus.")(f)
    f = click.option("--backbone", "backbone_name", help="Default: the suite's backbone.")(f)
    f = click.option("--suite", default="diagnostic", show_default=True,
                     help="Whose training protocol (budget, bridge, backbone, corpus, device) to use: a suite name "
                          "or TOML file.")(f)
    return f


def _check_training_inputs(config, out_dir) -> None:
    from dihal_bench.registry.options import check_options, check_registered
    from dihal_bench.study.preflight import (
        check_backbone_name,
        check_corpus_name,
        check_writable,
    )

    check_registered("bridge", [config.bridge.name], "bridge.name")
    check_options("bridge", config.bridge.name, dict(config.bridge.options), "bridge.options", harness_arguments=1)
    check_backbone_name(config.backbone, "--backbone")
    check_corpus_name(config.corpus, "--corpus")
    check_writable(Path(out_dir), "output folder --out")


@cli.command()
@_training_options
@click.option("--layers", default="auto", show_default=True,
              help="Comma-separated layers, or 'auto' (about ten spread over the stack, always with ℓ*).")
@click.option("--eval-sequences", type=click.IntRange(min=1),
              help="Validation windows the hybrid's perplexity and KL are measured on per layer (a seeded random "
                   "subset; bridgeability takes every window). Default: the suite's sweep.eval_sequences.")
@click.option("--stream-targets", is_flag=True,
              help="Compute the bridge's training states per batch instead of storing them, and the validation "
                   "states one layer at a time (memory bounded by the batch and one layer's validation states).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="runs/sweep", show_default=True)
def sweep(suite, backbone_name, corpus_name, seed, sets, epochs, device, dtype, quiet, layers, eval_sequences,
          stream_targets, out_dir):
    """Train one bridge per layer under one protocol; table, rank correlations and plot."""
    from dihal_bench.hybrid import sweep as sweep_module
    from dihal_bench.locate.pipeline import LocateConfig, locate
    from dihal_bench.study.plan import auto_sweep_layers
    from dihal_bench.study.protocol import bridge_spec

    chosen_layers = None if layers == "auto" else parse_int_list(layers, "--layers")
    if chosen_layers == []:
        raise DihalError("--layers names no layer")
    locate_config = LocateConfig(seed=seed)
    config, budget, corpus, backbone = _protocol(suite, sets, seed, "sweep.budget", epochs, backbone_name,
                                                 corpus_name, out_dir, device, dtype, layers=chosen_layers or (),
                                                 locate_config=locate_config)
    if chosen_layers is not None:  # again: a backbone plugin without `describe` is first known here
        sweep_module.check_layers(backbone, chosen_layers)
    located = locate(backbone, corpus, locate_config, progress=not quiet)
    if chosen_layers is None:
        chosen_layers = auto_sweep_layers(backbone.num_layers, {located["chosen_layer"]}, 10)
    spec = bridge_spec(config, "sweep.budget", seed)
    result = sweep_module.run_sweep(backbone, corpus, chosen_layers, spec,
                                    eval_sequences=eval_sequences or config.sweep.eval_sequences,
                                    work_dir=Path(out_dir) / "checkpoints", progress=not quiet,
                                    stream_targets=stream_targets)
    result["correlations"] = sweep_module.layer_correlations(located, result["layers"], seed)
    result["correlations_trace"] = sweep_module.layer_correlations(located, result["layers"], seed,
                                                                   "bridge_mse_trace")
    result.update(locate=located, budget=budget.to_dict(), backbone=backbone.name, corpus=corpus.name)
    click.echo(sweep_module.format_sweep(result))
    for path in sweep_module.write_sweep_outputs(result, Path(out_dir)):
        click.echo(f"wrote {path}")


@cli.group(cls=CommandGroup)
def bridge():
    """Train a single DiHAL bridge (one layer)."""


@bridge.command("train")
@_training_options
@click.option("--layer", type=click.IntRange(min=1), required=True, help="Replace layers 1..LAYER by the bridge.")
@click.option("--eval-sequences", type=click.IntRange(min=1),
              help="Validation windows for the hybrid's perplexity and KL (bridgeability takes every window). "
                   "Default: the suite's sweep.eval_sequences.")
@click.option("--stream-targets", is_flag=True,
              help="Compute the bridge's training states per batch instead of storing them (memory bounded by the batch).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Checkpoint folder (resumes an interrupted training found there).")
def bridge_train(suite, backbone_name, corpus_name, seed, sets, epochs, device, dtype, quiet, layer, eval_sequences,
                 stream_targets, out_dir):
    """Train the DiHAL bridge for one layer, evaluate it, save a safetensors checkpoint."""
    from dihal_bench.hybrid import sweep as sweep_module
    from dihal_bench.hybrid.checkpoint import save_bridge_checkpoint
    from dihal_bench.study.protocol import bridge_spec

    config, budget, corpus, backbone = _protocol(suite, sets, seed, "budget", epochs, backbone_name, corpus_name,
                                                 out_dir, device, dtype, layers=[layer])
    backbone.check_layer(layer)  # again: a backbone plugin without `describe` is first known here
    spec = bridge_spec(config, "budget", seed)
    result = sweep_module.run_sweep(backbone, corpus, [layer], spec,
                                    eval_sequences=eval_sequences or config.sweep.eval_sequences,
                                    work_dir=Path(out_dir) / "training", progress=not quiet, keep_bridges=True,
                                    stream_targets=stream_targets)
    trained = result.pop("bridges")[layer]
    save_bridge_checkpoint(trained, spec.name, layer, backbone.name, Path(out_dir))
    row = result["layers"][0]
    write_json(Path(out_dir) / "train.json", {**result, "budget": budget.to_dict()})
    click.echo(f"layer {layer}: bridge MSE {row['bridge_mse']:.4f}, R² {row['bridge_r2']:.3f}, hybrid PPL "
               f"{row['hybrid_ppl']:.2f} (backbone {result['backbone_ppl']:.2f}, skip control {row['skip_ppl']:.1f}), "
               f"KL {row['kl_to_backbone']:.3f}; {row['steps']} steps in {row['train_seconds']:.0f}s")
    click.echo(f"wrote checkpoint {out_dir}")


@cli.command()
@click.option("--checkpoint", type=click.Path(file_okay=False), required=True, help="A `bridge train` output folder.")
@click.option("-n", "count", type=click.IntRange(min=1), default=4, show_default=True, help="Number of samples.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=48, show_default=True)
@click.option("--temperature", type=FiniteFloatRange(min=0, min_open=True), default=1.0, show_default=True,
              help="As every built-in suite samples (sampling.temperature).")
@click.option("--top-p", type=FiniteFloatRange(min=0, max=1, min_open=True), default=1.0, show_default=True,
              help="As every built-in suite samples (sampling.top_p).")
@click.option("--steps", type=click.IntRange(min=1), help="Bridge sampling steps K (default: the bridge's own).")
@click.option("--prompt", help="Text to continue (default: unconditional from the start token).")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--no-sink-passthrough", is_flag=True, help="Ablation: let the bridge produce position 0 too.")
@click.option("--trust-unverified", is_flag=True,
              help="Load a checkpoint whose bridge.json records no weights_sha256 (its weights unverified).")
@model_options(from_suite=False)
@quiet_option
def generate(checkpoint, count, max_new_tokens, temperature, top_p, steps, prompt, seed, no_sink_passthrough,
             trust_unverified, device, dtype, quiet):
    """Sample text from a DiHAL hybrid: bridge → upper layers → LM head."""
    from dihal_bench.hybrid.checkpoint import load_bridge_checkpoint, read_bridge_meta
    from dihal_bench.hybrid.model import HybridLM
    from dihal_bench.registry.resolve import describe_backbone, load_backbone

    meta = read_bridge_meta(Path(checkpoint), trust_unverified=trust_unverified)
    device, dtype = chosen_device(device, dtype)
    shape = describe_backbone(meta["backbone"])
    if shape is not None:  # a checkpoint of another backbone's layer, before the backbone loads
        shape.check_layer(meta["layer"])
    backbone = load_backbone(meta["backbone"], device=device, dtype=dtype)
    trained, layer = load_bridge_checkpoint(Path(checkpoint), backbone, trust_unverified=trust_unverified)
    hybrid = HybridLM(backbone, trained, layer, sink_passthrough=not no_sink_passthrough, steps=steps)
    prompt_ids = None
    if prompt:
        prompt_ids = backbone.tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"][0]
    ids = hybrid.generate(count, max_new_tokens, prompt_ids=prompt_ids, temperature=temperature, top_p=top_p,
                          seed=seed, batch_size=count)
    for i, text in enumerate(backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)):
        click.echo(f"--- sample {i} (DiHAL ℓ={layer}, {backbone.name}) ---\n{prompt or ''}{text}")


@cli.group(cls=CommandGroup)
def baseline():
    """Train and sample a registered baseline (`dihal-bench plugins` lists them)."""


@baseline.command("train")
@click.argument("name")
@_training_options
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE", help="A baseline option, e.g. embed_dim=32.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), help="Checkpoint folder (default runs/baselines/NAME).")
def baseline_train(name, suite, backbone_name, corpus_name, seed, sets, epochs, device, dtype, quiet, options,
                   out_dir):
    """Train baseline NAME under the matched budget; prints its parameter table."""
    from tabulate import tabulate

    from dihal_bench.base.values import parse_value
    from dihal_bench.hybrid.training import packed_split, training_subset
    from dihal_bench.registry.options import check_options
    from dihal_bench.registry.plugins import get_registry
    from dihal_bench.study.protocol import matched_budget

    cls = get_registry().get("baseline", name).obj
    chosen = {k: parse_value(v) for k, v in parse_assignments(options, "--option").items()}
    check_options("baseline", name, chosen, "--option", harness_arguments=3)
    out = Path(out_dir or Path("runs") / "baselines" / name)
    config, _, corpus, backbone = _protocol(suite, sets, seed, "budget", epochs, backbone_name, corpus_name, out,
                                            device, dtype)
    budget = matched_budget(config, seed, backbone.width)  # the allowance: the suite's DiHAL bridge
    model = cls(backbone, budget, seed, **chosen)
    sequences = training_subset(packed_split(backbone, corpus, "train", budget.seq_len), [model.budget], seed)
    result = model.fit(sequences, checkpoint_dir=out / "checkpoint", progress=not quiet)
    model.save(out / "model")
    counts = model.parameter_counts()
    rows = [[part, f"{n:,}"] for part, n in counts.items()] + [["total", f"{sum(counts.values()):,}"]]
    click.echo(tabulate(rows, headers=[name, "trainable parameters"]))
    allowance = model.budget.param_allowance
    click.echo(f"allowance {allowance:,} (±{model.budget.allowance_tolerance:.0%}); {result.steps_done} steps, "
               f"{result.tokens_seen:,} tokens, {result.seconds:.0f}s" if model.in_budget
               else f"{name} trains nothing (reference outside the budget)")
    click.echo(f"wrote {out / 'model'}")


@baseline.command("sample")
@click.argument("name")
@click.option("--backbone", "backbone_name",
              help="Default: the backbone the baseline was trained with (its baseline.json names it).")
@click.option("--from", "out_dir", type=click.Path(file_okay=False), help="Trained folder (default runs/baselines/NAME).")
@click.option("-n", "count", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--seq-len", type=click.IntRange(min=1), default=48, show_default=True)
@click.option("--seed", type=SEED, default=0, show_default=True)
@model_options(from_suite=False)
@quiet_option
def baseline_sample(name, backbone_name, out_dir, count, seq_len, seed, device, dtype, quiet):
    """Print samples from a trained baseline NAME."""
    from dihal_bench.api.baseline import CONFIG_FILE, read_config
    from dihal_bench.registry.plugins import get_registry
    from dihal_bench.registry.resolve import load_backbone
    from dihal_bench.study.preflight import check_backbone_name
    from dihal_bench.training.budget import Budget

    cls = get_registry().get("baseline", name).obj
    folder = Path(out_dir or Path("runs") / "baselines" / name) / "model"
    if not (folder / CONFIG_FILE).is_file():
        raise DihalError(f"no trained {name} in {folder}; run `dihal-bench baseline train {name}` first")
    saved = read_config(folder)
    try:
        budget, seed_trained, options = Budget.from_dict(saved["budget"]), saved["seed"], saved["options"]
    except (KeyError, TypeError) as exc:
        raise DihalError(f"{folder / CONFIG_FILE} is damaged ({type(exc).__name__}: {exc})") from None
    backbone_name = backbone_name or saved.get("backbone")
    if backbone_name is None:
        raise DihalError(f"{folder / CONFIG_FILE} does not name the backbone it was trained with (saved before "
                         "baselines recorded it); give --backbone")
    check_backbone_name(backbone_name, "--backbone")
    device, dtype = chosen_device(device, dtype)
    backbone = load_backbone(backbone_name, device=device, dtype=dtype)
    model = cls(backbone, budget, seed_trained, **options)
    model.load(folder)
    ids = model.sample(count, seq_len, seed, batch_size=count)
    for i, text in enumerate(backbone.tokenizer.batch_decode(ids, skip_special_tokens=True)):
        click.echo(f"--- {name} sample {i} ---\n{text}")
