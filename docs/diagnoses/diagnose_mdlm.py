"""Diagnose MDLM on the known-answer chain: train it under the sanity suite's matched budget on the
``markov`` corpus and measure, per training variant, what it learned against the exact answers
(issue 20; docs/baseline-diagnosis.md#mdlm).

Each variant trains ``mdlm`` as ``dihal-bench run --suite sanity`` does (the registry's class, the
matched budget of the sanity suite with the DiHAL bridge's parameter allowance, the suite's
diffusion steps, the seed's training windows), with at most one thing changed. Reported:

- the training loss, mean of the first and of the last 50 steps (the bound per token, 1/t-weighted);
- on held-out chain windows, each position masked with probability t = 0.1, 0.5, 0.9: the masked
  tokens' NLL −log p_θ(x₀ᵢ | x_t) and argmax accuracy, beside the exact answer, the chain's
  posterior at each masked position given every unmasked one (forward–backward,
  ``MarkovChain.posterior``), and KL(exact ‖ p_θ) averaged over the masked positions;
- the chain NLL per transition (``MarkovChain.nll_per_token``, ε = 10⁻³) and forbidden rate of
  ``--samples`` samples of 64 tokens drawn by the model's own sampler, beside the chain's
  own (1.21) and i.i.d. uniform text (10.45).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
from dihal_builtin.baselines.mdlm import diffusion_times
from tabulate import tabulate

from dihal_bench.api.references import held_out_windows
from dihal_bench.base.files import write_json_atomic
from dihal_bench.config.suite import resolve_suite
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.training import packed_split, training_subset
from dihal_bench.numerics.markov import UNKNOWN
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.study.protocol import matched_budget

# run as `python docs/diagnoses/NAME.py`: the benchmarks' shared flags, timing and report
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import common  # noqa: E402

DEFAULT_JSON = Path(__file__).parent / "results" / "diagnose_mdlm.json"
#: mask rates of the probe
PROBE_RATES = (0.1, 0.5, 0.9)
#: held-out windows probed, each masked once per rate
PROBE_WINDOWS = 256
#: the steps whose loss is averaged at the start and at the end of training
LOSS_WINDOW = 50

#: training variants: options of the baseline, the budget's steps multiplied, or the loss replaced
VARIANTS = {
    "as-is": {},  # rotary positions, since the fix
    "learned-positions": {"positions": "learned"},  # the port before the fix
    "learned-positions-4x": {"positions": "learned", "steps_multiplier": 4},
    "learned-positions-unweighted": {"positions": "learned", "loss": "unweighted"},
}


def unweighted_loss(model):
    """The bound's masking (same t and mask draws) with the 1/t weight dropped: the mean
    cross-entropy over the masked positions. Not MDLM's objective; it tells whether the weight's
    variance is what keeps the model from learning."""

    def loss(batch: dict, generator: torch.Generator) -> torch.Tensor:
        x0 = batch["ids"]
        t = diffusion_times(len(x0), generator, x0.device)
        masked = torch.rand(x0.shape, generator=generator, device=x0.device) < t[:, None]
        log_p = model.log_probs(x0.masked_fill(masked, model.mask_id)).gather(-1, x0[..., None])[..., 0]
        return -log_p[masked].mean()

    return loss


def word_states(backbone, corpus, compact_ids: torch.Tensor) -> torch.Tensor:
    """The chain state of each compact id (V,), UNKNOWN for a token that is not one chain word."""
    words = backbone.tokenizer.batch_decode(compact_ids[:, None].tolist())
    return torch.tensor([corpus.state_of.get(word.strip(), UNKNOWN) if word.startswith(" ") else UNKNOWN
                         for word in words])


def to_states(ids: torch.Tensor, backbone, corpus) -> torch.Tensor:
    """Chain states (n, T) of backbone token windows (n, T): one token per word on the markov corpus."""
    table = torch.full((backbone.vocab_size,), UNKNOWN, dtype=torch.long)
    present = ids.unique()
    table[present] = word_states(backbone, corpus, present)
    return table[ids]


def exact_posterior(chain, states: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """p(s_i = v | the unmasked states) (n, T, V) of the chain, float64."""
    observed = torch.nn.functional.one_hot(states, chain.states).bool()
    evidence = torch.where(masked[..., None] | observed, 0.0, float("-inf")).double()
    return chain.posterior(evidence)


def probe(model, corpus, windows: torch.Tensor, states: torch.Tensor, seed: int) -> dict:
    """Masked-token NLL, accuracy and KL to the exact posterior at each rate of PROBE_RATES."""
    chain, compact = corpus.chain, model.built().to_compact(windows)
    # the model's columns in chain-state order, so p_θ and the posterior share an axis
    column_of_state = torch.full((chain.states,), -1, dtype=torch.long)
    state_of_column = word_states(model.backbone, corpus, model.built().full_ids)
    known = state_of_column >= 0
    column_of_state[state_of_column[known]] = torch.arange(len(state_of_column))[known]
    if (column_of_state < 0).any():
        raise DihalError("a chain state never occurs in the training windows: the probe needs all of them")
    generator = torch.Generator().manual_seed(seed)
    figures = {}
    for rate in PROBE_RATES:
        masked = torch.rand(compact.shape, generator=generator) < rate
        with torch.no_grad():
            log_p = model.log_probs(compact.masked_fill(masked, model.mask_id)).double()[..., column_of_state]
        exact = exact_posterior(chain, states, masked)
        target = states[masked]
        log_p, exact = log_p[masked], exact[masked]
        kl = (exact * (exact.clamp_min(1e-300).log() - log_p)).where(exact > 0, torch.zeros((), dtype=exact.dtype))
        figures[f"t={rate}"] = {
            "masked": int(masked.sum()),
            "nll": float(-log_p.gather(-1, target[:, None]).mean()),
            "nll_exact": float(-exact.gather(-1, target[:, None]).log().mean()),
            "accuracy": float((log_p.argmax(-1) == target).double().mean()),
            "accuracy_exact": float((exact.argmax(-1) == target).double().mean()),
            "kl_exact_to_model": float(kl.sum(-1).mean()),
        }
    return figures


def chain_scores(model, backbone, corpus, n: int, seq_len: int, seed: int) -> dict:
    """Chain NLL per transition and forbidden rate of n samples of the model's own sampler."""
    samples = model.sample(n, seq_len, seed=seed, batch_size=32)
    states = to_states(samples, backbone, corpus)
    nll = corpus.chain.nll_per_token(states)
    return {"chain_nll": float(nll.mean()), "chain_nll_stderr": float(nll.std() / math.sqrt(len(nll))),
            "forbidden": corpus.chain.forbidden_rate(states)}


def run_variant(name: str, change: dict, backbone, corpus, budget, suite, sequences, windows, states, args) -> dict:
    options = dict(change)
    multiplier = options.pop("steps_multiplier", 1)
    replaced_loss = options.pop("loss", None)
    trained_under = budget.replace(steps=(args.steps or budget.steps) * multiplier,
                                   epochs=budget.epochs * multiplier)
    cls = get_registry().get("baseline", "mdlm").obj
    model = cls(backbone, trained_under, seed=args.seed, **{cls.steps_option: suite.sampling.diffusion_steps},
                **options)
    if replaced_loss == "unweighted":
        model.loss = unweighted_loss(model)
    started = time.perf_counter()
    result = model.fit(sequences[:trained_under.distinct_sequences], progress=False)
    seconds = time.perf_counter() - started
    losses = result.losses
    row = {
        "change": change, "steps": trained_under.steps, "parameters": sum(model.parameter_counts().values()),
        "train_seconds": seconds,
        "loss_first": sum(losses[:LOSS_WINDOW]) / len(losses[:LOSS_WINDOW]),
        "loss_last": sum(losses[-LOSS_WINDOW:]) / len(losses[-LOSS_WINDOW:]),
        "probe": probe(model, corpus, windows, states, args.seed),
        **chain_scores(model, backbone, corpus, args.samples, suite.sampling.seq_len, args.seed),
    }
    print(f"{name}: {json.dumps(row)}", flush=True)
    return row


def table(rows: dict) -> str:
    lines = []
    for name, row in rows.items():
        line = {"variant": name, "steps": row["steps"], "loss first/last": f"{row['loss_first']:.3f} / "
                f"{row['loss_last']:.3f}"}
        for rate, probed in row["probe"].items():
            line[f"NLL {rate} (exact)"] = f"{probed['nll']:.3f} ({probed['nll_exact']:.3f})"
            line[f"acc {rate} (exact)"] = f"{probed['accuracy']:.3f} ({probed['accuracy_exact']:.3f})"
            line[f"KL {rate}"] = f"{probed['kl_exact_to_model']:.3f}"
        line["chain NLL"] = f"{row['chain_nll']:.3f} ± {row['chain_nll_stderr']:.3f}"
        line["forbidden"] = f"{row['forbidden']:.3f}"
        lines.append(line)
    return tabulate(lines, headers="keys")


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--variants", nargs="+", default=["as-is"], choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, help="training steps before a variant's multiplier (default: the "
                                                  "suite's 600; --quick: 8)")
    parser.add_argument("--samples", type=int, help="samples scored by the chain (default 32; --quick: 4)")
    args = parser.parse_args()
    args.steps = args.steps or (8 if args.quick else None)
    args.samples = args.samples or (4 if args.quick else 32)

    _, suite = resolve_suite("sanity")
    backbone = load_backbone(suite.backbone)
    corpus = load_corpus(suite.corpus)
    budget = matched_budget(suite, args.seed, backbone.width)
    # the runner's data: a prefix of the seed's permutation of the training split
    longest = max(VARIANTS[name].get("steps_multiplier", 1) for name in args.variants)
    longest_budget = budget.replace(steps=(args.steps or budget.steps) * longest, epochs=budget.epochs * longest)
    train_split = packed_split(backbone, corpus, "train", budget.seq_len)
    sequences = training_subset(train_split, [longest_budget], args.seed)
    validation = packed_split(backbone, corpus, "validation", budget.seq_len)
    windows = held_out_windows(validation, len(validation), args.seed, what="validation")
    states = to_states(windows, backbone, corpus)
    # a packed window may cross a document boundary, where the chain restarts: keep those within one document
    inside = (corpus.chain.transition[states[:, :-1], states[:, 1:]] > 0).all(1)
    windows, states = windows[inside][:PROBE_WINDOWS], states[inside][:PROBE_WINDOWS]

    rows = {name: run_variant(name, VARIANTS[name], backbone, corpus, budget, suite, sequences, windows, states,
                              args) for name in args.variants}
    print(table(rows))
    settings = {"suite": "sanity", "backbone": backbone.name, "corpus": corpus.name, "budget": budget.to_dict(),
                "steps": args.steps, "samples": args.samples, "probe_windows": len(windows),
                "probe_rates": list(PROBE_RATES), "seed": args.seed, "quick": args.quick,
                "chain_entropy_rate": corpus.chain.entropy_rate,
                "unigram_nll": corpus.chain.expected_unigram_nll()}
    if args.json or not args.quick:
        write_json_atomic(args.json or DEFAULT_JSON, {"benchmark": "diagnose_mdlm", "settings": settings,
                                                      "figures": rows})


if __name__ == "__main__":
    main()
