"""Train continuous-diffusion baselines on the known-answer chain under the sanity suite's matched
budget, each with at most one option changed, and score their samples against the true chain
(issue 20; docs/baseline-diagnosis.md#sed-and-diffusion-lm-on-the-known-answer-chain).

Each variant trains the registered baseline as ``dihal-bench run --suite sanity`` does (the registry's
class, the sanity suite's budget with the DiHAL bridge's parameter allowance, its diffusion steps,
the seed's training windows of the ``markov`` corpus), with the options the variant names; the
``as-is`` variants repeat the record's rows, a check that the instrument trains what the runner
trained. Reported per variant: the final training loss, and the chain NLL per transition
(ε = 10⁻³, ± its standard error) and forbidden rate of ``--samples`` samples of 64 tokens, beside
the chain's own text (1.21) and i.i.d. uniform words (10.45).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from diagnose_mdlm import chain_scores
from tabulate import tabulate

from dihal_bench.base.files import write_json_atomic
from dihal_bench.config.suite import resolve_suite
from dihal_bench.hybrid.training import packed_split, training_subset
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_backbone, load_corpus
from dihal_bench.study.protocol import matched_budget

# run as `python docs/diagnoses/NAME.py`: the benchmarks' shared flags, timing and report
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import common  # noqa: E402

DEFAULT_JSON = Path(__file__).parent / "results" / "diagnose_on_chain.json"

#: variant name -> (registered baseline, options changed from its defaults)
VARIANTS = {
    "sed as-is": ("sed", {}),
    "sed rotary": ("sed", {"positions": "rotary"}),
    "sed rotary, detached readout": ("sed", {"positions": "rotary", "detach_readout": True}),
    "diffusion-lm as-is": ("diffusion-lm", {}),
    "diffusion-lm rotary": ("diffusion-lm", {"positions": "rotary"}),
}


def run_variant(name: str, backbone, corpus, budget, suite, sequences, args) -> dict:
    method, options = VARIANTS[name]
    trained_under = budget.replace(steps=args.steps or budget.steps)
    cls = get_registry().get("baseline", method).obj
    model = cls(backbone, trained_under, seed=args.seed, **{cls.steps_option: suite.sampling.diffusion_steps},
                **options)
    started = time.perf_counter()
    result = model.fit(sequences[:trained_under.distinct_sequences], progress=False)
    row = {"method": method, "options": options, "steps": trained_under.steps,
           "parameters": sum(model.parameter_counts().values()), "train_seconds": time.perf_counter() - started,
           "final_loss": result.losses[-1],
           **chain_scores(model, backbone, corpus, args.samples, suite.sampling.seq_len, args.seed)}
    print(f"{name}: {row}", flush=True)
    return row


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, help="training steps (default: the suite's 600; --quick: 8)")
    parser.add_argument("--samples", type=int, help="samples scored by the chain (default 64; --quick: 4)")
    args = parser.parse_args()
    args.steps = args.steps or (8 if args.quick else None)
    args.samples = args.samples or (4 if args.quick else 64)

    _, suite = resolve_suite("sanity")
    backbone = load_backbone(suite.backbone)
    corpus = load_corpus(suite.corpus)
    budget = matched_budget(suite, args.seed, backbone.width)
    # the runner's data: a prefix of the seed's permutation of the training split
    sequences = training_subset(packed_split(backbone, corpus, "train", budget.seq_len), [budget], args.seed)
    rows = {name: run_variant(name, backbone, corpus, budget, suite, sequences, args) for name in args.variants}
    print(tabulate([[name, row["steps"], f"{row['final_loss']:.3f}",
                     f"{row['chain_nll']:.3f} ± {row['chain_nll_stderr']:.3f}", f"{row['forbidden']:.3f}"]
                    for name, row in rows.items()],
                   headers=["variant", "steps", "final loss", "chain NLL", "forbidden"]))
    settings = {"suite": "sanity", "backbone": backbone.name, "corpus": corpus.name, "budget": budget.to_dict(),
                "steps": args.steps, "samples": args.samples, "seed": args.seed, "quick": args.quick,
                "chain_entropy_rate": corpus.chain.entropy_rate,
                "unigram_nll": corpus.chain.expected_unigram_nll()}
    if args.json or not args.quick:
        write_json_atomic(args.json or DEFAULT_JSON, {"benchmark": "diagnose_on_chain", "settings": settings,
                                                      "figures": rows})


if __name__ == "__main__":
    main()
