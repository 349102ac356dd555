"""The metrics stage's evaluator pass (``evaluate_texts``: Gen.PPL's scores and MAUVE's features) over a
methods row's samples, batched as before 2026-12-06 (up to 8,192 tokens a batch whatever the vocabulary)
against batches whose logits stay within ``MAX_BATCH_LOGITS``, taking turns, with the peak resident memory
each adds and the summed NLLs compared.

The texts are the suite's sample length (64 tokens of the embedded backbone) cut from stdlib-docs'
validation split, scored by the embedded evaluator, Gemma-3-270M (a 262,144-token vocabulary: 1 GiB of
float32 logits per 1,024 tokens). Run: ``python benchmarks/evaluator_batching_bench.py --json
benchmarks/results/evaluator_batching.json`` (about 6 minutes on 2 cores, alone; ``--quick`` is a check that
it runs). dihal_bench/api/metrics.py cites it for MAX_BATCH_LOGITS.
"""

from __future__ import annotations

import resource
from unittest import mock

import numpy as np
from common import median_seconds, parser, report, verdict

import dihal_bench.api.metrics as metrics
from dihal_bench.hybrid.training import packed_split
from dihal_bench.registry.resolve import load_backbone, load_corpus

#: a methods row's samples, at the suite's sample length
SAMPLES, LENGTH = 128, 64


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    args = parser(__doc__).parse_args()
    samples, repeats = (8, 1) if args.quick else (SAMPLES, 2)
    backbone, evaluator = load_backbone("smollm2-135m"), load_backbone("gemma3-270m")
    windows = packed_split(backbone, load_corpus("stdlib-docs"), "validation", LENGTH)[:samples]
    texts = [backbone.tokenizer.decode(row.tolist()) for row in windows]

    def unbounded():  # every batch up to DEFAULT_MAX_BATCH_TOKENS, as before the bound
        with mock.patch.object(metrics, "MAX_BATCH_LOGITS", 2**62):
            return metrics.evaluate_texts(evaluator, texts)

    def bounded():
        return metrics.evaluate_texts(evaluator, texts)

    figures: dict = {"vocabulary": evaluator.vocab_size, "texts": len(texts),
                     "bounded_batch_tokens": metrics.logits_bounded(metrics.DEFAULT_MAX_BATCH_TOKENS, evaluator)}
    passes = {}
    # the bounded pass first: the peak resident memory only grows, so each figure is the pass's own high mark
    for name, run in (("bounded", bounded), ("unbounded", unbounded)):
        passes[name] = run()
        figures[f"{name}_peak_rss_gib"] = peak_rss_gib()
    for name, run in (("bounded", bounded), ("unbounded", unbounded)):
        figures[f"{name}_seconds"] = median_seconds(run, repeats, warmup=False)
    sums, tokens = {name: done.nll_sums for name, done in passes.items()}, int(passes["bounded"].counts.sum())
    figures["speedup"] = figures["unbounded_seconds"] / figures["bounded_seconds"]
    figures["largest_relative_nll_difference"] = float(np.max(np.abs(sums["bounded"] / sums["unbounded"] - 1)))
    print(f"{len(texts)} texts of {LENGTH} tokens, Gemma-3-270M: unbounded {figures['unbounded_seconds']:.1f} s, "
          f"bounded ({figures['bounded_batch_tokens']} tokens a batch) {figures['bounded_seconds']:.1f} s, "
          f"speedup {figures['speedup']:.2f}x ({tokens / figures['bounded_seconds']:.0f} scored tokens/s bounded); "
          f"peak resident {figures['bounded_peak_rss_gib']:.1f} → {figures['unbounded_peak_rss_gib']:.1f} GiB; "
          f"largest relative NLL difference {figures['largest_relative_nll_difference']:.1e}")
    print(f"target: bounded no slower than unbounded: {verdict(1.0, figures['speedup'])}")
    report("evaluator_batching", figures, {"samples": len(texts), "seq_len": LENGTH, "repeats": repeats,
                                           "quick": args.quick, "seed": args.seed}, args.json)


if __name__ == "__main__":
    main()
