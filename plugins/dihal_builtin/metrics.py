"""Built-in metrics: Gen.PPL (two conventions), unigram entropy, n-gram diversity, MAUVE.

The plain functions compute each metric from numbers or texts and say which paper's
convention they follow; `register_metrics` wraps them as `fn(samples, ctx) -> dict`
metric plugins. A registered metric returns its value under its own name plus the counts
it was computed on; when the samples leave nothing to measure it returns None and a
`warning` instead of raising, so one degenerate method does not stop a suite.

Rank correlations across layers are not per-sample metrics: they live in the core,
`dihal_bench.stats`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence

import numpy as np

from dihal_bench import hookimpl
from dihal_bench.errors import DihalError
from dihal_bench.metrics import (
    MIN_SCORED_TOKENS,
    Evaluator,
    MetricContext,
    SampleSet,
    evaluator_features,
    score_texts,
)

#: MAUVE needs at least this many samples on each side to form two histogram buckets.
MAUVE_MIN_SAMPLES = 10
#: Below this many samples per side MAUVE is biased upward (MAUVE README; its paper uses 5000).
MAUVE_RELIABLE_SAMPLES = 1000
#: The n-gram orders whose diversities multiply into `diversity` (SimCTG).
DIVERSITY_NS = (2, 3, 4)

MetricResult = dict[str, float | int | str | None]


# --- the metrics as plain functions -------------------------------------------------------


def gen_ppl(nll_sums: np.ndarray, counts: np.ndarray) -> float:
    """Corpus-level generative perplexity: exp(Σ_i NLL_i / Σ_i n_i).

    `nll_sums[i]` is text i's summed token NLL in nats and `counts[i]` its number of scored
    tokens (0 = excluded). Every token weighs the same, so long samples dominate. This is
    MDLM's convention (`kuleshov-group/mdlm:diffusion.py`, a token-weighted mean NLL,
    exponentiated once).
    """
    nll_sums, counts = np.asarray(nll_sums, dtype=np.float64), np.asarray(counts)
    total = counts.sum()
    if total == 0:
        raise DihalError("gen_ppl: no scored tokens")
    return float(np.exp(nll_sums.sum() / total))


def gen_ppl_sample_mean(nll_sums: np.ndarray, counts: np.ndarray) -> float:
    """Mean over texts of each text's perplexity: (1/m) Σ_i exp(NLL_i / n_i), over texts with n_i > 0.

    SEDD's convention (`louaaron/Score-Entropy-Discrete-Diffusion:run_train.py`) and LD4LG's
    (`evaluate`'s "perplexity" `mean_perplexity`), which DiHAL probably follows.

    How it relates to `gen_ppl`, writing ppl_i = exp(NLL_i / n_i):
    - always ≥ the geometric mean of the ppl_i (AM ≥ GM);
    - when all n_i are equal that geometric mean is `gen_ppl`, so then this is ≥ `gen_ppl`
      (equal iff all ppl_i are equal);
    - with unequal lengths either may be larger. `gen_ppl` is the geometric mean weighted
      by n_i, so one long, poor sample can pull it above this unweighted mean: ppl 148.4
      over 100 tokens and ppl 1 over 2 tokens give `gen_ppl` 134.6 but a mean of 74.7.
    The two conventions are not comparable; a table must say which it shows.
    """
    nll_sums, counts = np.asarray(nll_sums, dtype=np.float64), np.asarray(counts)
    scored = counts > 0
    if not scored.any():
        raise DihalError("gen_ppl_sample_mean: no scored text")
    return float(np.mean(np.exp(nll_sums[scored] / counts[scored])))


def unigram_entropy(token_ids_per_text: Sequence[Sequence[int]]) -> float:
    """Mean over texts of the entropy (nats) of each text's own token-id unigram distribution.

    For a text whose ids occur with frequencies p_v, H = -Σ_v p_v ln p_v: ln k for k
    distinct ids used equally often, 0 for one id repeated. Empty texts are skipped.
    ReMDM's convention (`kuleshov-group/remdm:main.py`, `torch.special.entr` over counts),
    reported beside Gen.PPL because repetitive, low-entropy text games Gen.PPL.
    """
    entropies = []
    for ids in token_ids_per_text:
        if len(ids) == 0:
            continue
        _, frequencies = np.unique(np.asarray(ids), return_counts=True)
        p = frequencies / frequencies.sum()
        entropies.append(float(-(p * np.log(p)).sum()))
    if not entropies:
        raise DihalError("unigram_entropy: every text is empty")
    return float(np.mean(entropies))


def diversity_ngrams(texts: Sequence[str], n: int) -> float:
    """Σ_texts |distinct n-grams in the text| / Σ_texts |n-grams in the text|, on whitespace tokens.

    Distinctness is per text (an n-gram repeated across two texts counts in both), as in
    SimCTG (`yxuansu/SimCTG:simctg/evaluation.py`), where this is 1 - rep-n/100. Unlike
    SimCTG's loop, which stops before each text's last n-gram, all m - n + 1 n-grams of an
    m-token text are counted, so our values differ slightly from SimCTG's on short texts.
    """
    distinct = total = 0
    for text in texts:
        tokens = text.split()
        ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
        distinct += len(set(ngrams))
        total += len(ngrams)
    if total == 0:
        raise DihalError(f"diversity: no text has {n} or more words")
    return distinct / total


def diversity(texts: Sequence[str], ns: Sequence[int] = DIVERSITY_NS) -> float:
    """Diversity = ∏_{n in ns} `diversity_ngrams(texts, n)`: 1 when no text repeats an n-gram.

    SimCTG's definition (∏ (1 - rep-n/100), n = 2, 3, 4). LD4LG, whose metrics DiHAL
    probably reuses, applies the same formula to the pooled samples tokenised by spaCy,
    so its numbers are comparable in kind, not digit for digit.
    """
    return float(np.prod([diversity_ngrams(texts, n) for n in ns]))


def mauve_score(
    p_features: np.ndarray, q_features: np.ndarray, *, seed: int, num_buckets: int | str = "auto"
) -> MetricResult:
    """MAUVE between references P and generations Q, given (n, d) features of each.

    Calls mauve-text's `compute_mauve(p_features=..., q_features=...)` with its defaults
    (L2-normalise, PCA to 90% variance, k-means into `num_buckets` = n/10 buckets,
    scaling c = 5; Pillutla et al., NeurIPS 2021), seeded by `seed`. Returns
    `{"mauve": float, "n": int}`, n being the smaller side's count, plus a `warning` when
    n < 1000, where MAUVE reads optimistic. With fewer than 10 samples on a side it
    returns mauve None and a warning instead.

    mauve-text (GPLv3) is the optional extra `dihal-bench[mauve]`.
    """
    mauve = _import_mauve()
    p_features, q_features = np.asarray(p_features), np.asarray(q_features)
    n = min(len(p_features), len(q_features))
    if n < MAUVE_MIN_SAMPLES:
        return {"mauve": None, "n": n, "warning": _too_few_for_mauve(len(p_features), len(q_features))}
    out = mauve.compute_mauve(
        p_features=p_features, q_features=q_features, num_buckets=num_buckets, seed=seed, verbose=False
    )
    result: MetricResult = {"mauve": float(out.mauve), "n": n}
    if n < MAUVE_RELIABLE_SAMPLES:
        result["warning"] = (
            f"MAUVE on {n} samples per side is optimistic; use at least {MAUVE_RELIABLE_SAMPLES} (its paper uses 5000)"
        )
    return result


def _import_mauve():
    try:
        import mauve
    except ImportError:
        raise DihalError('MAUVE needs mauve-text: pip install "dihal-bench[mauve]"') from None
    return mauve


def _is_constant(values: np.ndarray) -> bool:
    return bool(np.all(values == values[0]))


def _too_few_for_mauve(n_references: int, n_generations: int) -> str:
    return (
        f"MAUVE not computed: needs {MAUVE_MIN_SAMPLES} non-empty texts per side, "
        f"got {n_references} references and {n_generations} generations"
    )


# --- the registered metric plugins --------------------------------------------------------


def _require_evaluator(ctx: MetricContext, metric: str) -> Evaluator:
    if ctx.evaluator is None:
        raise DihalError(f"metric {metric!r} needs an evaluator model, and this run has none")
    return ctx.evaluator


# The last scoring, so that gen_ppl and gen_ppl_sample_mean on the same samples run the
# evaluator once. A weak reference, so the memo neither keeps a model alive nor mistakes
# a new model at a recycled id() for the old one.
_last_scores: tuple[weakref.ref, tuple, tuple[np.ndarray, np.ndarray]] | None = None


def _evaluator_scores(samples: SampleSet, ctx: MetricContext, metric: str) -> tuple[np.ndarray, np.ndarray]:
    global _last_scores
    evaluator = _require_evaluator(ctx, metric)
    key = (tuple(samples.texts), ctx.max_length)
    if _last_scores is not None and _last_scores[0]() is evaluator and _last_scores[1] == key:
        return _last_scores[2]
    nll_sums, counts = score_texts(evaluator, samples.texts, batch_size=ctx.batch_size, max_length=ctx.max_length)
    nll_sums.flags.writeable = counts.flags.writeable = False  # shared by every caller of the memo
    _last_scores = (weakref.ref(evaluator), key, (nll_sums, counts))
    return nll_sums, counts


def _perplexity_metric(name: str, aggregate: Callable[[np.ndarray, np.ndarray], float]) -> Callable:
    def metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
        nll_sums, counts = _evaluator_scores(samples, ctx, name)
        scored = counts > 0
        result: MetricResult = {
            name: None,
            "n_scored": int(scored.sum()),
            "n_excluded": int((~scored).sum()),
            "tokens": int(counts.sum()),
        }
        if scored.any():
            result[name] = aggregate(nll_sums, counts)
        else:
            result["warning"] = f"no sample has {MIN_SCORED_TOKENS} or more evaluator tokens to score"
        return result

    return metric


def _entropy_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    nonempty = [ids for ids in samples.token_ids if len(ids) > 0]
    if not nonempty:
        return {"entropy": None, "n": 0, "warning": "every sample is empty"}
    return {"entropy": unigram_entropy(nonempty), "n": len(nonempty)}


def _diversity_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    longest = max(DIVERSITY_NS)
    if all(len(text.split()) < longest for text in samples.texts):
        return {"diversity": None, "warning": f"no sample has {longest} or more words"}
    per_n = {f"diversity_{n}": diversity_ngrams(samples.texts, n) for n in DIVERSITY_NS}
    return {"diversity": float(np.prod(list(per_n.values()))), **per_n}


def _mauve_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    """MAUVE of the generations (Q) against as many held-out references (P), length-matched.

    Empty texts are dropped on both sides. P is the first n references, n = the number of
    generations (or fewer, if there are fewer references); reference i is truncated to the
    evaluator token length of generation i, so both sides have the same length profile,
    as in ReMDM, which compares against equal-length validation chunks.
    """
    evaluator = _require_evaluator(ctx, "mauve")
    _import_mauve()  # fail before the evaluator pass, not after
    nonempty_generations = [text for text in samples.texts if text.strip()]
    nonempty_references = [text for text in ctx.references if text.strip()]
    n = min(len(nonempty_generations), len(nonempty_references))
    if n < MAUVE_MIN_SAMPLES:
        warning = _too_few_for_mauve(len(nonempty_references), len(nonempty_generations))
        return {"mauve": None, "n": n, "warning": warning}
    generations, references = nonempty_generations[:n], nonempty_references[:n]

    options = dict(batch_size=ctx.batch_size, max_length=ctx.max_length)
    lengths = [len(ids) for ids in evaluator.tokenizer(generations, add_special_tokens=False)["input_ids"]]
    q_features = evaluator_features(evaluator, generations, **options)
    p_features = evaluator_features(evaluator, references, max_tokens=lengths, **options)
    result = mauve_score(p_features, q_features, seed=ctx.seed)
    if n < len(samples.texts):
        shortfall = f"MAUVE used {n} of {len(samples.texts)} samples (empty ones or too few references)"
        result["warning"] = "; ".join(filter(None, [shortfall, result.get("warning")]))
    return result


@hookimpl
def register_metrics(register):
    register(
        "gen_ppl",
        _perplexity_metric("gen_ppl", gen_ppl),
        description="generative perplexity under the evaluator, corpus level: exp(sum NLL / sum tokens) (MDLM)",
        higher_is_better=False,
        display_name="Gen.PPL",
    )
    register(
        "gen_ppl_sample_mean",
        _perplexity_metric("gen_ppl_sample_mean", gen_ppl_sample_mean),
        description="generative perplexity under the evaluator, mean of per-sample perplexities (SEDD, LD4LG)",
        higher_is_better=False,
        display_name="Gen.PPL (mean)",
    )
    register(
        "entropy",
        _entropy_metric,
        description="mean per-sample unigram entropy of the generated token ids, nats (ReMDM)",
        higher_is_better=True,
        display_name="Entropy",
    )
    register(
        "diversity",
        _diversity_metric,
        description="product over n=2,3,4 of distinct/total n-grams per text, whitespace tokens (SimCTG)",
        higher_is_better=True,
        display_name="Diversity",
    )
    register(
        "mauve",
        _mauve_metric,
        description="MAUVE of generations vs held-out references on evaluator features (needs dihal-bench[mauve])",
        higher_is_better=True,
        display_name="MAUVE",
    )
