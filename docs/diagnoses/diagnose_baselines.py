"""Diagnose SED and Diffusion-LM under the diagnostic matched budget: each hypothesis of issue 20
(item 6) measured side by side on the same data, seed and evaluator (docs/baseline-diagnosis.md).

Each method trains once per *training variant* (its defaults, or one option changed) for S steps
of the diagnostic budget (16 x 64 tokens, lr 1e-3, the DiHAL bridge's parameter allowance) on the
training sequences ``dihal-bench run`` gives it. Each trained model then samples under every
*sampling variant* (its defaults, or one sampling-time change), 128 x 64 tokens with the suite's
100 diffusion steps by default. Reported per (training, sampling) variant:

- Gen.PPL of the samples under the suite's evaluator (gemma3-270m), through the registered
  ``gen_ppl`` metric (the runner's path), beside the unigram floor scored the same way;
- KL(sample unigram || training unigram) in nats, and the share of sampled tokens that are among
  the training split's 20 most frequent (the training share is printed beside it);

and per training variant (one denoiser call, no self-conditioning, on validation windows):

- readout accuracy on clean rows (each token's own row read out) and on one-step x0-estimates from
  x_t at t = 0.05, 0.2, 0.5: the method's readout (argmax of R.x for SED, x.Emb for Diffusion-LM)
  and the nearest row; the x0-MSE per dimension and the KL of the read-out unigram at each t.

A run may cover a subset (``--methods``, ``--train-variants``): its rows are merged into the JSON
report at ``--json`` when that report was made with the same settings, so a measurement too long
for one run is made in parts and printed whole; ``--combine A.json B.json`` measures nothing and
merges reports made in parallel (same settings) into ``--json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import torch
from tabulate import tabulate

from dihal_bench.api.metrics import MetricContext, SampleSet
from dihal_bench.api.references import (
    held_out_windows,
    unigram_distribution,
    unigram_samples,
)
from dihal_bench.api.sampling import special_ids
from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.training import packed_split, training_subset
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.training.budget import Budget

# run as `python docs/diagnoses/NAME.py`: the benchmarks' shared flags, timing and report
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import common  # noqa: E402

DEFAULT_JSON = Path(__file__).parent / "results" / "diagnose_baselines.json"
#: times t of the one-step x0-estimates whose read-out accuracy is measured
PROBE_TIMES = (0.05, 0.2, 0.5)
#: validation windows the read-out accuracy is measured on
PROBE_WINDOWS = 64
#: evaluator tokens per batch (see main)
EVAL_BATCH_TOKENS = 1024
#: the training split's most frequent tokens whose share of the samples is reported
TOP_TOKENS = 20

#: the options each training variant changes (hypothesis (a): the readout cross-entropy's gradient
#: into x0-hat; self-conditioning off in training)
TRAIN_VARIANTS = {
    "sed": {"as-is": {}, "ce-detached": {"detach_readout": True}, "no-self-cond": {"self_condition": 0.0}},
    "diffusion-lm": {"as-is": {}},
}
#: options that shape sampling only: they do not change which model a training variant trains
SAMPLING_ONLY = {"steps", "eta", "clamp", "clamp_final"}
#: sampling-time changes: options replaced on the trained model, or a read-out rule (frequency
#: prior: log p_train(v) added to every score; nearest: the L2-nearest row's token)
SAMPLE_VARIANTS = {
    "sed": {"as-is": {}, "clamp": {"clamp": True}, "self-cond-off": {"self_condition": 0.0},
            "freq-prior": {"readout": "prior"}, "nearest-final": {"readout": "nearest"}},
    "diffusion-lm": {"as-is": {}, "unclamped-final": {"clamp_final": False}, "no-clamp": {"clamp": False},
                     "freq-prior": {"clamp_final": False, "readout": "prior"}},
}


# -- data and the floor -------------------------------------------------------------------------------


def unigram_figures(ids: torch.Tensor, train_unigram: torch.Tensor, top: torch.Tensor) -> dict:
    """KL(p_samples || p_train) in nats and the share of sampled tokens among ``top``."""
    counts = torch.bincount(ids.flatten(), minlength=len(train_unigram)).double()
    p = counts / counts.sum()
    seen = p > 0
    if (train_unigram[seen] == 0).any():
        raise DihalError("a sampled token never occurs in the training split: KL is infinite")
    kl = float((p[seen] * (p[seen] / train_unigram[seen]).log()).sum())
    entropy = float(-(p[seen] * p[seen].log()).sum())
    return {"kl_to_train_unigram": kl, "unigram_entropy": entropy, "top_token_share": float(p[top].sum()),
            "distinct_tokens": int(seen.sum())}


def gen_ppl(ids: torch.Tensor, tokenizer, context: MetricContext, name: str) -> dict:
    """The registered gen_ppl metric on the samples ``ids`` (n, T), as the runner computes it.
    The caller passes the first ``--ppl-samples`` of its samples: the evaluator pass is the
    measurement's largest cost on a shared CPU, and the unigram figures use every sample."""
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    metric = get_registry().get("metric", "gen_ppl").obj
    result = metric(SampleSet(method=name, texts=texts, token_ids=ids.tolist()), context)
    return {"gen_ppl": result["gen_ppl"], "gen_ppl_n_valid": result.get("n_valid"), "example": texts[0][:160]}


# -- the instruments on one trained model ------------------------------------------------------------


def readout_scores(model, x: torch.Tensor, rule: str, log_prior: torch.Tensor) -> torch.Tensor:
    """Compact ids read out of vectors x (..., d) by ``rule``: the method's own readout, the same
    plus the log training prior, or the nearest row of the table the method diffuses over."""
    if rule == "nearest":
        table = model.embeddings if model.name == "sed" else model.parts["embeddings"].weight
        flat = x.reshape(-1, x.shape[-1])
        distance = torch.cdist(flat, table)
        if model.banned:
            distance[:, model.banned] = float("inf")
        return distance.argmin(-1).reshape(x.shape[:-1])
    weight = model.parts["readout"].weight if model.name == "sed" else model.parts["embeddings"].weight
    scores = x @ weight.T
    if rule == "prior":
        scores = scores + log_prior
    if model.banned:
        scores[..., model.banned] = float("-inf")
    return scores.argmax(-1)


def clean_and_noised(model, ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """x0 of compact ids: SED's fixed row, Diffusion-LM's q(x0 | w) draw."""
    if model.name == "sed":
        return model.embeddings[ids]
    emb = model.parts["embeddings"](ids)
    return emb + model.sigma_0 * torch.randn(emb.shape, generator=generator)


@torch.no_grad()
def probe(model, windows: torch.Tensor, train_unigram_compact: torch.Tensor, seed: int) -> dict:
    """Read-out accuracy on clean rows and on one-step x0-estimates (see the module docstring)."""
    from dihal_builtin.baselines.schedules import (
        cosine_alpha_bar,
        noised,
        sqrt_alpha_bar,
    )

    model.module().eval()
    vocabulary = model.built()
    covered = vocabulary._compact_of[windows] >= 0
    ids = vocabulary._compact_of[windows].clamp(min=0)
    log_prior = train_unigram_compact.clamp(min=1e-30).log()
    generator = torch.Generator().manual_seed(seed)
    table = model.embeddings if model.name == "sed" else model.parts["embeddings"].weight
    all_rows = torch.arange(len(vocabulary))
    figures = {
        "covered_positions": float(covered.double().mean()),
        "clean_rows_accuracy_uniform": float((readout_scores(model, table, "own", log_prior) == all_rows)
                                             .double().mean()),
        "clean_rows_accuracy_tokens": float((readout_scores(model, table[ids], "own", log_prior) == ids)[covered]
                                            .double().mean()),
    }
    alpha_bar = cosine_alpha_bar if model.name == "sed" else sqrt_alpha_bar
    for t in PROBE_TIMES:
        x0 = clean_and_noised(model, ids, generator)
        times = torch.full((len(ids),), t)
        x_t = noised(x0, alpha_bar(times)[:, None, None], torch.randn(x0.shape, generator=generator))
        if model.name == "sed":
            x0_hat = model.denoise(x_t, times, torch.zeros_like(x_t))
        else:
            x0_hat = model.parts["denoiser"](x_t, times)
        for rule in ("own", "prior", "nearest"):
            picked = readout_scores(model, x0_hat, rule, log_prior)
            figures[f"t{t}_{rule}_accuracy"] = float((picked == ids)[covered].double().mean())
            if rule == "own":
                counts = torch.bincount(picked[covered], minlength=len(vocabulary)).double()
                p = counts / counts.sum()
                seen = p > 0
                figures[f"t{t}_own_readout_kl"] = float((p[seen] * (p[seen] / train_unigram_compact[seen]
                                                                       .clamp(min=1e-30)).log()).sum())
        figures[f"t{t}_x0_mse"] = float((x0_hat - x0).pow(2)[covered].mean())
        figures[f"t{t}_x0_hat_norm"] = float(x0_hat[covered].norm(dim=-1).mean())
    figures["row_norm_mean"] = float(table.norm(dim=-1).mean())
    figures.update(readout_norms(model, train_unigram_compact))
    return figures


def readout_norms(model, train_unigram_compact: torch.Tensor) -> dict:
    """How the norms of the rows the readout scores against (SED's R, Diffusion-LM's Emb) follow
    token frequency: an argmax of x.row favours long rows when x has not committed to one."""
    weight = model.parts["readout"].weight if model.name == "sed" else model.parts["embeddings"].weight
    norms = weight.detach().norm(dim=-1).double()
    log_frequency = train_unigram_compact.clamp(min=1e-12).log()
    top = train_unigram_compact.topk(TOP_TOKENS).indices
    rest = torch.ones(len(norms), dtype=torch.bool)
    rest[top] = False
    centred = torch.stack([norms - norms.mean(), log_frequency - log_frequency.mean()])
    correlation = float((centred[0] * centred[1]).sum() / centred.norm(dim=-1).prod())
    return {"readout_row_norm_top": float(norms[top].mean()), "readout_row_norm_rest": float(norms[rest].mean()),
            "readout_norm_logfreq_correlation": correlation}


@torch.no_grad()
def sample_variant(model, settings_change: dict, n: int, seq_len: int, seed: int, batch_size: int,
                   log_prior: torch.Tensor) -> torch.Tensor:
    """Backbone ids (n, seq_len): the model's sampler with ``settings_change`` applied, read out by
    its own rule unless the change names another (``readout``)."""
    change = dict(settings_change)
    rule = change.pop("readout", "own")
    original = model.settings
    model.settings = dataclasses.replace(original, **change)
    try:
        if rule == "own":
            return model.sample(n, seq_len, seed, batch_size=batch_size)
        model.module().eval()
        generator = torch.Generator().manual_seed(seed)
        batches = []
        from tqdm.auto import tqdm

        with tqdm(disable=True) as bar:
            for start in range(0, n, batch_size):
                x0_hat = model.final_estimate(min(batch_size, n - start), seq_len, generator, bar)
                batches.append(readout_scores(model, x0_hat, rule, log_prior))
        return model.built().to_full(torch.cat(batches))
    finally:
        model.settings = original


def trained_model(name: str, variant: str, options: dict, backbone, short: Budget, sequences, args):
    """(model, training figures): trained under ``short``, or loaded from ``--work`` where a run
    trained it before. Training checkpoints there, so a run stopped mid-training resumes (the
    training loop makes a resumed run bitwise the same as an uninterrupted one)."""
    cls = get_registry().get("baseline", name).obj
    model = cls(backbone, short, args.seed, **{cls.steps_option: args.diffusion_steps}, **options)
    # every training option's value in the name: a model trained under other defaults is not reused
    trained_under = {k: v for k, v in dataclasses.asdict(model.settings).items() if k not in SAMPLING_ONLY}
    digest = hashlib.sha256(json.dumps([trained_under, short.to_dict()], sort_keys=True).encode()).hexdigest()[:12]
    folder = args.work / f"{name}-{variant}-seed{args.seed}-{digest}"
    figures_path = folder / "train.json"
    if figures_path.exists():
        model.load(folder / "model")
        return model, json.loads(figures_path.read_text())
    result, fit_seconds = common.timed(model.fit, sequences, checkpoint_dir=folder / "checkpoint", progress=False)
    model.save(folder / "model")
    figures = {"steps": result.steps_done, "train_seconds_this_run": fit_seconds,
               "final_loss": sum(result.losses[-10:]) / len(result.losses[-10:])}
    figures_path.write_text(json.dumps(figures))
    return model, figures


def measure(name: str, variant: str, options: dict, backbone, short: Budget, sequences, windows, context,
            train_unigram, top, args, save, measured: dict) -> dict:
    """Train one variant, probe it, sample it under every sampling variant not in ``measured`` (the
    rows of an earlier run with the same settings); ``save(row)`` after each."""
    model, training = trained_model(name, variant, options, backbone, short, sequences, args)
    compact = model.built().full_ids
    train_compact = train_unigram[compact]
    train_compact = train_compact / train_compact.sum()
    log_prior = train_compact.clamp(min=1e-30).log()
    row = {
        "options": options,
        "parameters": sum(model.parameter_counts().values()),
        **training,
        "probe": probe(model, windows, train_compact, args.seed),
        "sampling": dict(measured),
    }
    print(f"  {name} {variant}: loss {row['final_loss']:.3f}, probe {json.dumps(row['probe'])}", flush=True)
    for sample_name, change in SAMPLE_VARIANTS[name].items():
        if (args.sample_variants and sample_name not in args.sample_variants) or sample_name in measured:
            continue
        if sample_name == "self-cond-off" and model.settings.self_condition == 0:
            continue  # trained without it: the as-is row already samples without it
        ids, seconds = common.timed(sample_variant, model, change, args.samples, args.sample_len, args.seed,
                                    args.batch_size, log_prior)
        row["sampling"][sample_name] = {
            "change": change, "sample_seconds": seconds,
            **gen_ppl(ids[:args.ppl_samples], backbone.tokenizer, context, f"{name}/{variant}/{sample_name}"),
            **unigram_figures(ids, train_unigram, top),
        }
        print(f"  {name} {variant} {sample_name}: Gen.PPL {row['sampling'][sample_name]['gen_ppl']}", flush=True)
        save(row)
    save(row)
    return row


# -- the report ---------------------------------------------------------------------------------------


def tables(report: dict) -> str:
    floor = report["unigram_floor"]
    rows = [["unigram floor", "", "", f"{floor['gen_ppl']:,.0f}", floor["kl_to_train_unigram"], floor["unigram_entropy"],
             floor["top_token_share"], floor["distinct_tokens"]]]
    probes = []
    for name, variants in report["methods"].items():
        for variant, row in variants.items():
            for sample_name, s in row["sampling"].items():
                # None: the metric flagged too few valid samples (repetitive text), as in a run record
                ppl = f"{s['gen_ppl']:,.0f}" if s["gen_ppl"] is not None else f"flagged ({s['gen_ppl_n_valid']} valid)"
                rows.append([name, variant, sample_name, ppl, s["kl_to_train_unigram"], s["unigram_entropy"],
                             s["top_token_share"], s["distinct_tokens"]])
            p = row["probe"]
            probes.append([name, variant, row["steps"], row["final_loss"], p["clean_rows_accuracy_uniform"],
                           p["clean_rows_accuracy_tokens"]]
                          + [p[f"t{t}_{rule}_accuracy"] for t in PROBE_TIMES for rule in ("own", "prior", "nearest")]
                          + [p[f"t{t}_own_readout_kl"] for t in PROBE_TIMES])
    samples = tabulate(rows, headers=["method", "trained", "sampled", "Gen.PPL", "KL(samples||train)",
                                      "unigram H", f"top-{TOP_TOKENS} share", "distinct"], floatfmt=",.3f")
    headers = ["method", "trained", "steps", "loss", "clean acc (rows)", "clean acc (tokens)"]
    headers += [f"t={t} {rule}" for t in PROBE_TIMES for rule in ("own", "prior", "nearest")]
    headers += [f"t={t} KL" for t in PROBE_TIMES]
    return samples + "\n\n" + tabulate(probes, headers=headers, floatfmt=".3f")


def merged(previous: dict | None, report: dict) -> dict:
    """``report`` with the rows of ``previous`` that it did not re-measure (training variants, and
    sampling variants of a training variant), when both were made with the same settings: same
    settings and seed train the same model, so a training variant's rows from two runs agree."""
    if not previous or previous.get("settings") != report["settings"]:
        return report
    methods = {name: dict(variants) for name, variants in previous["figures"]["methods"].items()}
    for name, variants in report["figures"]["methods"].items():
        for variant, row in variants.items():
            earlier = methods.setdefault(name, {}).get(variant, {})
            methods[name][variant] = {**row, "sampling": {**earlier.get("sampling", {}), **row["sampling"]}}
    return {**report, "figures": {**report["figures"], "methods": methods}}


def combine(paths: list[Path], json_path: Path | None) -> None:
    """Merge the reports at ``paths`` (same settings, else a DihalError) and print them whole."""
    reports = [json.loads(Path(path).read_text()) for path in paths]
    settings = reports[0]["settings"]
    if any(r["settings"] != settings for r in reports):
        raise DihalError(f"diagnose_baselines: {', '.join(map(str, paths))} were not made with the same settings")
    record = {"settings": settings, "figures": reports[0]["figures"]}
    for report in reports[1:]:
        record = merged(record, {"settings": settings, "figures": report["figures"]})
    print(tables(record["figures"]))
    common.report("diagnose_baselines", record["figures"], settings, json_path)


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--backbone", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib-docs")
    parser.add_argument("--evaluator", help="Gen.PPL evaluator (default: the diagnostic suite's)")
    parser.add_argument("--steps", type=int, help="S training steps (default: the budget's 600; --quick: 4)")
    parser.add_argument("--samples", type=int, help="samples per variant (default 128; --quick: 4)")
    parser.add_argument("--sample-len", type=int, default=64)
    parser.add_argument("--ppl-samples", type=int, help="the first N samples scored by the evaluator (default: all)")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per reverse chain")
    parser.add_argument("--diffusion-steps", type=int, help="reverse steps (default: the suite's 100; --quick: 4)")
    parser.add_argument("--methods", nargs="+", default=list(TRAIN_VARIANTS), choices=list(TRAIN_VARIANTS))
    parser.add_argument("--train-variants", nargs="+", help="only these training variants (default: all)")
    parser.add_argument("--sample-variants", nargs="+", help="only these sampling variants (default: all)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/dihal-diagnose-baselines"),
                        help="trained models and training checkpoints, reused by later runs")
    parser.add_argument("--combine", nargs="+", type=Path, metavar="REPORT",
                        help="merge these reports; measure nothing")
    args = parser.parse_args()
    if args.combine:
        return combine(args.combine, args.json or DEFAULT_JSON)
    if args.json is None and not args.quick:  # a --quick check never overwrites the measurement
        args.json = DEFAULT_JSON
    suite = common.diagnostic_suite()
    args.steps = args.steps or (4 if args.quick else None)
    args.samples = args.samples or (4 if args.quick else 128)
    args.ppl_samples = min(args.ppl_samples or args.samples, args.samples)
    args.diffusion_steps = args.diffusion_steps or (4 if args.quick else suite.sampling.diffusion_steps)

    backbone = load_backbone(args.backbone)
    evaluator_name = args.evaluator or suite.evaluator
    evaluator = backbone if evaluator_name == args.backbone else load_backbone(evaluator_name)
    corpus = load_corpus(args.corpus)
    full = Budget.from_dict({**suite.budget, "seed": args.seed})
    full = full.replace(param_allowance=common.bridge_spec(suite, full).parameter_count(backbone.width))
    short = full.replace(steps=args.steps or full.steps)
    # the runner's data: a prefix of the seed's permutation of the training split (Run.train_sequences)
    train_split = packed_split(backbone, corpus, "train", short.seq_len)
    sequences = training_subset(train_split, [short], args.seed)[:short.distinct_sequences]
    validation = packed_split(backbone, corpus, "validation", short.seq_len)
    windows = held_out_windows(validation, min(PROBE_WINDOWS, len(validation)), args.seed, what="validation")
    banned = special_ids(backbone.tokenizer)
    train_unigram = unigram_distribution(train_split, banned)
    train_unigram = torch.cat([train_unigram, torch.zeros(backbone.vocab_size - len(train_unigram),
                                                          dtype=train_unigram.dtype)])
    top = train_unigram.topk(TOP_TOKENS).indices
    # 1,024 tokens per evaluator batch: 1 GiB of logits over Gemma's 262k vocabulary instead of the
    # default's 8 GiB, on a machine shared with other jobs (batching moves scores by float rounding only)
    context = MetricContext(evaluator=evaluator, references=[], seed=args.seed, max_batch_tokens=EVAL_BATCH_TOKENS,
                            max_length=suite.metrics.max_length,
                            min_valid=min(suite.metrics.min_valid, args.ppl_samples))

    settings = {"backbone": backbone.name, "corpus": corpus.name, "evaluator": evaluator_name,
                "budget": short.to_dict(), "train_sequences": len(sequences), "samples": args.samples,
                "ppl_samples": args.ppl_samples, "sample_len": args.sample_len,
                "diffusion_steps": args.diffusion_steps, "seed": args.seed,
                "probe_windows": len(windows), "probe_times": list(PROBE_TIMES), "quick": args.quick}
    previous = json.loads(args.json.read_text()) if args.json and args.json.exists() else None
    if previous and previous.get("settings") == settings:  # the floor depends on the settings alone
        floor = previous["figures"]["unigram_floor"]
    else:  # as the runner's unigram reference row draws it
        floor_ids = unigram_samples(train_split, args.samples, args.sample_len, args.seed, banned=banned)
        floor = {**gen_ppl(floor_ids[:args.ppl_samples], backbone.tokenizer, context, "unigram"),
                 **unigram_figures(floor_ids, train_unigram, top),
                 "train_top_token_share": float(train_unigram[top].sum())}
    print(f"unigram floor: Gen.PPL {floor['gen_ppl']:,.0f}", flush=True)

    methods: dict[str, dict] = {}
    record = merged(previous, {"settings": settings, "figures": {"unigram_floor": floor, "methods": methods}})
    if args.json is not None:  # the floor is kept even if this run is cut short
        write_json_atomic(args.json, {"benchmark": "diagnose_baselines", **record})

    def save(name: str, variant: str, row: dict) -> None:
        """Merge a (partial) row into the report and write it: a run cut short keeps what it measured."""
        nonlocal record
        record = merged(record, {"settings": settings, "figures": {"unigram_floor": floor,
                                                                   "methods": {name: {variant: row}}}})
        if args.json is not None:
            write_json_atomic(args.json, {"benchmark": "diagnose_baselines", **record})

    for name in args.methods:
        for variant, options in TRAIN_VARIANTS[name].items():
            if args.train_variants and variant not in args.train_variants:
                continue
            measured = record["figures"]["methods"].get(name, {}).get(variant, {}).get("sampling", {})
            measure(name, variant, options, backbone, short, sequences, windows, context, train_unigram, top, args,
                    lambda row, name=name, variant=variant: save(name, variant, row), measured)
    print(f"{backbone.name} on {corpus.name}, {short.steps} steps of {short.batch_size} x {short.seq_len} tokens "
          f"(lr {short.lr}), allowance {short.param_allowance:,}; {args.samples} samples x {args.sample_len} "
          f"tokens, {args.diffusion_steps} reverse steps; Gen.PPL by {evaluator_name}; "
          f"training top-{TOP_TOKENS} share {floor['train_top_token_share']:.3f}")
    print(tables(record["figures"]))
    common.report("diagnose_baselines", record["figures"], settings, args.json)


if __name__ == "__main__":
    main()
