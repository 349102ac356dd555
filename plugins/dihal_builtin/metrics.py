"""Built-in metrics: Gen.PPL (two conventions), unigram entropy, n-gram diversity (per text and
pooled), MAUVE with a half-sample interval, and the share of 8-grams copied from the training split.

The plain functions compute each metric from numbers or texts and say which paper's
convention they follow; `register_metrics` wraps them as `fn(samples, ctx) -> dict`
metric plugins. A registered metric returns its value under its own name plus the counts
it was computed on; when the samples leave nothing to measure it returns None and a
`warning` instead of raising, so one degenerate method does not stop a suite.

Gen.PPL and MAUVE read the same samples, the valid ones (`dihal_bench.api.metrics.invalid_reason`
with the evaluator's token count), and one evaluator pass (`evaluate_texts`) serves both.
Entropy and diversity read every sample; `copied_8grams` reads the valid ones by the same rule,
without an evaluator count (it has no evaluator pass). See docs/method.md#metrics.

Rank correlations across layers are not per-sample metrics: they live in the core,
`dihal_bench.numerics.stats`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager

import numpy as np
import torch
from scipy.special import expit, logit

from dihal_bench import hookimpl
from dihal_bench.api.metrics import (
    Evaluator,
    EvaluatorPass,
    MetricContext,
    PrefixFeatures,
    SampleSet,
    evaluate_texts,
    invalid_reason,
    prefix_features,
)
from dihal_bench.base.memo import LastResult
from dihal_bench.errors import DihalError

#: MAUVE needs at least this many samples on each side to form two histogram buckets.
MAUVE_MIN_SAMPLES = 10
#: Below this many samples per side MAUVE is biased upward (MAUVE README; its paper uses 5000).
MAUVE_RELIABLE_SAMPLES = 1000
#: The n-gram orders whose diversities multiply into `diversity` (SimCTG) and `diversity_pooled` (LD4LG).
DIVERSITY_NS = (2, 3, 4)
#: MAUVE's interval covers this central share of the half-sample deviations.
MAUVE_CI_LEVEL = 0.95
#: how MAUVE's interval is made, recorded beside it (``mauve_interval``): older records, whose
#: interval was a with-replacement bootstrap, carry no such key
MAUVE_INTERVAL = "half-sample"
#: how far inside (0, 1) a MAUVE of exactly 0 or 1 is held on the logit scale
LOGIT_EPSILON = 1e-6
#: the word n-gram order of `copied_8grams`: a run of 8 words rarely recurs by chance, so a
#: sample's 8-gram found in the training split was most likely copied from it
COPY_N = 8

MetricResult = dict[str, float | int | str | list | None]


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


def _ngrams(text: str, n: int) -> list[tuple[str, ...]]:
    """All m - n + 1 n-grams of a text's m whitespace tokens."""
    tokens = text.split()
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def diversity_ngrams(texts: Sequence[str], n: int) -> float:
    """Σ_texts |distinct n-grams in the text| / Σ_texts |n-grams in the text|, on whitespace tokens.

    Distinctness is per text (an n-gram repeated across two texts counts in both), as in
    SimCTG (`yxuansu/SimCTG:simctg/evaluation.py`), where this is 1 - rep-n/100. Unlike
    SimCTG's loop, which stops before each text's last n-gram, all m - n + 1 n-grams of an
    m-token text are counted, so our values differ slightly from SimCTG's on short texts.
    """
    distinct = total = 0
    for text in texts:
        ngrams = _ngrams(text, n)
        distinct += len(set(ngrams))
        total += len(ngrams)
    if total == 0:
        raise DihalError(f"diversity: no text has {n} or more words")
    return distinct / total


def diversity(texts: Sequence[str], ns: Sequence[int] = DIVERSITY_NS) -> float:
    """Diversity = ∏_{n in ns} `diversity_ngrams(texts, n)`: 1 when no text repeats an n-gram.

    SimCTG's definition (∏ (1 - rep-n/100), n = 2, 3, 4). LD4LG applies the same formula to
    the pooled samples (`diversity_pooled`).
    """
    return float(np.prod([diversity_ngrams(texts, n) for n in ns]))


def diversity_pooled_ngrams(texts: Sequence[str], n: int) -> float:
    """|distinct n-grams over all texts| / Σ_texts |n-grams in the text|, on whitespace tokens.

    Distinctness is over the whole sample set: an n-gram that two texts share counts once,
    so a method that writes the same text every time scores low here however varied each
    text is. LD4LG's convention (`justinlovelace/latent-diffusion-for-language:
    evaluation/evaluation.py`, `compute_diversity`: one n-gram set updated over all texts),
    which tokenises with spaCy where we split on whitespace.
    """
    distinct: set[tuple[str, ...]] = set()
    total = 0
    for text in texts:
        ngrams = _ngrams(text, n)
        distinct.update(ngrams)
        total += len(ngrams)
    if total == 0:
        raise DihalError(f"diversity_pooled: no text has {n} or more words")
    return len(distinct) / total


def diversity_pooled(texts: Sequence[str], ns: Sequence[int] = DIVERSITY_NS) -> float:
    """Pooled diversity = ∏_{n in ns} `diversity_pooled_ngrams(texts, n)`: 1 when no n-gram
    occurs twice in the whole set; never above `diversity` of the same texts."""
    return float(np.prod([diversity_pooled_ngrams(texts, n) for n in ns]))


def training_ngrams(texts: Iterable[str], n: int = COPY_N) -> frozenset[int]:
    """The hashes of every word n-gram (`_ngrams`, whitespace tokens) of each text.

    Each text's n-grams are its own: none runs from the end of one text into the next, as no
    such run is anywhere in the texts. An n-gram is kept as Python's hash of its tuple, which is
    stable within a process (string hashing is salted per process), so the set is a fraction of
    the n-grams' size; with 64-bit hashes, an n-gram that is not in 10⁵ training n-grams matches
    one of their hashes with odds of about 10⁻¹⁴.
    """
    return frozenset(hash(ngram) for text in texts for ngram in _ngrams(text, n))


def copied_ngrams(texts: Sequence[str], training: AbstractSet[int], n: int = COPY_N) -> tuple[int, int]:
    """(copied, total): of all word n-grams of the texts, counted with repeats, how many are in
    ``training`` (hashes from `training_ngrams` of the training text) and how many there are."""
    copied = total = 0
    for text in texts:
        hashes = [hash(ngram) for ngram in _ngrams(text, n)]
        copied += sum(value in training for value in hashes)
        total += len(hashes)
    return copied, total


def mauve_score(
    p_features: np.ndarray,
    q_features: np.ndarray,
    *,
    seed: int,
    num_buckets: int | str = "auto",
    bootstrap: int = 0,
) -> MetricResult:
    """MAUVE between references P and generations Q, given (n, d) features of each.

    Calls mauve-text's `compute_mauve(p_features=..., q_features=...)` with its defaults
    (L2-normalise, PCA to 90% variance, k-means into `num_buckets` = n/10 buckets,
    scaling c = 5; Pillutla et al., NeurIPS 2021), seeded by `seed`. Returns
    `{"mauve": float, "n": int, "mauve_ci_low", "mauve_ci_high", "bootstrap": int, "interval": str}`,
    n being the smaller side's count and the interval `mauve_half_sample_interval`'s with
    `bootstrap` draws (None for 0), plus a `warning` when n < 1000, where MAUVE reads
    optimistic. With fewer than 10 samples on a side it returns mauve None and a warning.

    mauve-text (GPLv3) is the optional extra `dihal-bench[mauve]`.
    """
    mauve = _import_mauve()
    p_features, q_features = np.asarray(p_features), np.asarray(q_features)
    n = min(len(p_features), len(q_features))
    result: MetricResult = {"mauve": None, "n": n, "mauve_ci_low": None, "mauve_ci_high": None, "bootstrap": 0}
    if n < MAUVE_MIN_SAMPLES:
        result["warning"] = _too_few_for_mauve(len(p_features), len(q_features))
        return result
    with _mauve_threads():
        out = mauve.compute_mauve(
            p_features=p_features, q_features=q_features, num_buckets=num_buckets, seed=seed, verbose=False
        )
    result["mauve"] = float(out.mauve)
    if bootstrap > 0:
        result["mauve_ci_low"], result["mauve_ci_high"] = mauve_half_sample_interval(
            p_features, q_features, float(out.mauve), seed=seed, draws=bootstrap, num_buckets=num_buckets
        )
        result["bootstrap"], result["interval"] = bootstrap, MAUVE_INTERVAL
    if n < MAUVE_RELIABLE_SAMPLES:
        result["warning"] = (
            f"MAUVE on {n} samples per side is optimistic; use at least {MAUVE_RELIABLE_SAMPLES} (its paper uses 5000)"
        )
    return result


def mauve_half_sample_interval(
    p_features: np.ndarray,
    q_features: np.ndarray,
    point: float,
    *,
    seed: int,
    draws: int,
    num_buckets: int | str = "auto",
) -> tuple[float, float]:
    """A `MAUVE_CI_LEVEL` (95%) interval of MAUVE at this sample size, by half-sampling.

    Each draw keeps ⌊n/2⌋ rows of each side without replacement and its own k-means seed, all from
    a NumPy generator seeded with `seed`. On the logit scale, the interval is logit(`point`) (MAUVE
    of all rows) plus the central quantiles of the draws' deviations from their median.

    Why half-samples: a with-replacement bootstrap duplicates rows, and duplicates lower MAUVE
    (intervals below their own point). Half-samples hold no duplicate, and the spread of
    half-sample estimates about their centre matches the full-sample estimate's own spread (for
    a mean exactly: sampling n/2 of n halves the variance of an n/2 sample). Centring on the
    draws' median removes the shift the smaller sample brings. Why logit: MAUVE is bounded by 1,
    and near it its spread is lopsided; on the raw scale the interval held the target 80% of the
    time for two sets from one Gaussian, on the logit scale 95% (benchmarks/mauve_interval_bench.py).
    The interval covers MAUVE's expectation over sample sets of this size, not its large-n limit
    (docs/method.md#metrics).
    """
    if draws < 1:
        raise DihalError(f"mauve interval: draws must be >= 1, got {draws}")
    mauve = _import_mauve()
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        p_rows = rng.choice(len(p_features), size=len(p_features) // 2, replace=False)
        q_rows = rng.choice(len(q_features), size=len(q_features) // 2, replace=False)
        # mauve-text passes seed + 2 on to faiss, which takes a 32-bit int
        kmeans_seed = int(rng.integers(0, 2**31 - 3))
        with _mauve_threads():
            out = mauve.compute_mauve(p_features=p_features[p_rows], q_features=q_features[q_rows],
                                      num_buckets=num_buckets, seed=kmeans_seed, verbose=False)
        values.append(out.mauve)
    logits = _logit(np.asarray(values))
    tail = 100 * (1 - MAUVE_CI_LEVEL) / 2
    low, high = np.percentile(logits - np.median(logits), [tail, 100 - tail])
    centre = _logit(np.asarray(point))
    return float(expit(centre + low)), float(expit(centre + high))


def _logit(values: np.ndarray) -> np.ndarray:
    """logit, with MAUVE's attainable 0 and 1 held just inside (0, 1)."""
    return logit(np.clip(values, LOGIT_EPSILON, 1 - LOGIT_EPSILON))


def _import_mauve():
    try:
        import faiss  # noqa: F401 (mauve-text's k-means; `_mauve_threads` sets its threads)
        import mauve
    except ImportError:
        raise DihalError('MAUVE needs mauve-text: pip install "dihal-bench[mauve]"') from None
    return mauve


@contextmanager
def _mauve_threads() -> Iterator[None]:
    """One OpenMP thread while MAUVE runs, the process's thread count restored after it.

    k-means over a few hundred points is too small to share out: on a busy 2-core machine faiss's
    OpenMP threads spin-wait, and 51 MAUVE calls took 2.3 s with 2 threads against 0.35 s with one;
    one thread also gives the same clustering whatever the machine's core count. But faiss and torch
    share the OpenMP runtime: left at one, every matmul after the first MAUVE call ran on one thread
    (the ladder's frontier and latency stages on a 2-core machine, docs/results.md#the-ladder-budgets-as-an-axis)."""
    import faiss

    threads = torch.get_num_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)
        torch.set_num_threads(threads)


def _too_few_for_mauve(n_references: int, n_generations: int) -> str:
    return (
        f"MAUVE not computed: needs {MAUVE_MIN_SAMPLES} valid texts per side, "
        f"got {n_references} references and {n_generations} generations"
    )


# --- the registered metric plugins --------------------------------------------------------

# The hashed word 8-grams of the last corpus's training split, so that `copied_8grams` reads the
# training text once per corpus and process, not once per method; the corpus is held by a weak
# reference and compared by identity (a corpus object splits its documents once, for good).
_training_ngrams = LastResult()


def _require_evaluator(ctx: MetricContext, metric: str) -> Evaluator:
    if ctx.evaluator is None:
        raise DihalError(f"metric {metric!r} needs an evaluator model, and this run has none")
    return ctx.evaluator


# The last evaluator pass, so that gen_ppl, gen_ppl_sample_mean and mauve on the same samples
# run the evaluator once.
_last_pass = LastResult()
# The references' features at every truncation, so that MAUVE's P side, length-matched to
# each method's generations, costs one evaluator pass per run rather than one per method.
_last_references = LastResult()


def _evaluator_pass(samples: SampleSet, ctx: MetricContext, metric: str) -> EvaluatorPass:
    evaluator = _require_evaluator(ctx, metric)

    def compute() -> EvaluatorPass:
        evaluation = evaluate_texts(evaluator, samples.texts, max_batch_tokens=ctx.max_batch_tokens,
                                    max_length=ctx.max_length)
        for array in (evaluation.nll_sums, evaluation.counts, evaluation.text_tokens, evaluation.features):
            array.flags.writeable = False  # shared by every caller of the memo
        return evaluation

    # The batching is not in the key: it changes the numbers only by float rounding.
    return _last_pass.get(evaluator, (tuple(samples.texts), ctx.max_length), compute)


def _reference_features(references: list[str], ctx: MetricContext) -> PrefixFeatures:
    evaluator = _require_evaluator(ctx, "mauve")
    return _last_references.get(evaluator, (tuple(references), ctx.max_length), lambda: prefix_features(
        evaluator, references, max_batch_tokens=ctx.max_batch_tokens, max_length=ctx.max_length))


def _validity(samples: SampleSet, evaluation: EvaluatorPass) -> tuple[list[int], list[str | None]]:
    """The rows Gen.PPL and MAUVE read (valid, with the evaluator's counts) and every row's reason."""
    reasons = samples.invalid_reasons(evaluation.counts)
    return [i for i, reason in enumerate(reasons) if reason is None], reasons


def _validity_counts(rows: list[int], samples: SampleSet) -> MetricResult:
    return {"n_valid": len(rows), "n_invalid": len(samples.texts) - len(rows)}


def _flag_if_too_few(rows: list[int], reasons: list[str | None], ctx: MetricContext) -> str | None:
    """The warning that flags a method with fewer than `ctx.min_valid` valid samples, else None."""
    if len(rows) >= ctx.min_valid:
        return None
    example = next(((i, reason) for i, reason in enumerate(reasons) if reason is not None), None)
    why = f" (sample {example[0]}: {example[1]})" if example else ""
    return (f"flagged, not averaged: {len(rows)} valid samples of {len(reasons)}, "
            f"under min_valid={ctx.min_valid}{why}")


def _perplexity_metric(name: str, aggregate: Callable[[np.ndarray, np.ndarray], float], *,
                       per_sample: bool = False) -> Callable:
    def metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
        evaluation = _evaluator_pass(samples, ctx, name)
        rows, reasons = _validity(samples, evaluation)
        result: MetricResult = {name: None, **_validity_counts(rows, samples),
                                "tokens": int(evaluation.counts[rows].sum())}
        if per_sample:
            result |= _per_sample(evaluation, reasons)
        flag = _flag_if_too_few(rows, reasons, ctx)
        if flag:
            result["warning"] = flag
        else:
            result[name] = aggregate(evaluation.nll_sums[rows], evaluation.counts[rows])
        return result

    return metric


def _per_sample(evaluation: EvaluatorPass, reasons: list[str | None]) -> MetricResult:
    """Each sample's summed NLL (None where invalid: Gen.PPL leaves it out) and scored token count,
    in sample order, so that a difference of Gen.PPLs can be bootstrapped over samples, paired by
    index (`dihal_bench.numerics.stats.paired_log_ppl_difference`). Recorded even when the method is flagged."""
    return {"nll_per_sample": [None if reason is not None else float(nll)
                               for nll, reason in zip(evaluation.nll_sums, reasons)],
            "tokens_per_sample": [int(count) for count in evaluation.counts]}


def _entropy_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    nonempty = [ids for ids in samples.token_ids if len(ids) > 0]
    n_valid = len(samples.valid_indices())
    if not nonempty:
        return {"entropy": None, "n": 0, "n_valid": n_valid, "warning": "every sample is empty"}
    return {"entropy": unigram_entropy(nonempty), "n": len(nonempty), "n_valid": n_valid}


def _diversity_metric(name: str, per_n: Callable[[Sequence[str], int], float]) -> Callable:
    def metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
        n_valid = len(samples.valid_indices())
        longest = max(DIVERSITY_NS)
        if all(len(text.split()) < longest for text in samples.texts):
            return {name: None, "n_valid": n_valid, "warning": f"no sample has {longest} or more words"}
        orders = {f"{name}_{n}": per_n(samples.texts, n) for n in DIVERSITY_NS}
        return {name: float(np.prod(list(orders.values()))), **orders, "n_valid": n_valid}

    return metric


def _copied_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    """The share of the valid samples' word 8-grams that occur in the run corpus's training split:
    how much of the samples is memorised training text. None, with a warning, when no valid
    sample has 8 words."""
    name = "copied_8grams"
    corpus = ctx.corpus
    if corpus is None:
        raise DihalError(f"metric {name!r} compares samples with the corpus's training split, "
                         f"and this metric context has no corpus (it has one inside a run)")
    rows = samples.valid_indices()
    counts = {"n_valid": len(rows), "n_invalid": len(samples.texts) - len(rows)}
    training = _training_ngrams.get(corpus, ("train", COPY_N), lambda: training_ngrams(
        document.text for document in corpus.split("train")))
    copied, total = copied_ngrams([samples.texts[i] for i in rows], training)
    if total == 0:
        return {name: None, f"{name}_n": 0, **counts, "warning": f"no valid sample has {COPY_N} or more words"}
    return {name: copied / total, f"{name}_n": total, **counts}


def _mauve_metric(samples: SampleSet, ctx: MetricContext) -> MetricResult:
    """MAUVE of the valid generations (Q) against as many valid held-out references (P), length-matched.

    Q is the generations Gen.PPL reads, featurised by the same evaluator pass. P is the
    first n valid references, n = the number of valid generations (or fewer, if there are
    fewer references); reference i is truncated to the evaluator token length of generation
    i, so both sides have the same length profile, as in ReMDM, which compares against
    equal-length validation chunks.
    """
    _require_evaluator(ctx, "mauve")
    _import_mauve()  # fail before the evaluator pass, not after
    evaluation = _evaluator_pass(samples, ctx, "mauve")
    rows, reasons = _validity(samples, evaluation)
    counts = _validity_counts(rows, samples)
    flag = _flag_if_too_few(rows, reasons, ctx)
    if flag:
        return {"mauve": None, "n": 0, "mauve_ci_low": None, "mauve_ci_high": None, **counts, "warning": flag}
    references = [text for text in ctx.references if invalid_reason(text) is None]
    n = min(len(rows), len(references))
    if n < MAUVE_MIN_SAMPLES:
        return {"mauve": None, "n": n, "mauve_ci_low": None, "mauve_ci_high": None, **counts,
                "warning": _too_few_for_mauve(len(references), len(rows))}
    rows = rows[:n]
    p_features = _reference_features(references, ctx).head(n).at(evaluation.text_tokens[rows].tolist())
    result = {**mauve_score(p_features, evaluation.features[rows], seed=ctx.seed, bootstrap=ctx.mauve_bootstrap),
              **counts}
    if n < counts["n_valid"]:
        shortfall = f"MAUVE used {n} of {counts['n_valid']} valid samples: only {len(references)} valid references"
        result["warning"] = "; ".join(filter(None, [shortfall, result.get("warning")]))
    return result


@hookimpl
def register_metrics(register):
    register(
        "gen_ppl",
        _perplexity_metric("gen_ppl", gen_ppl, per_sample=True),
        description="generative perplexity under the evaluator, corpus level: exp(sum NLL / sum tokens) (MDLM)",
        higher_is_better=False,
        display_name="Gen.PPL",
        default=True,
    )
    register(
        "gen_ppl_sample_mean",
        _perplexity_metric("gen_ppl_sample_mean", gen_ppl_sample_mean),
        description="generative perplexity under the evaluator, mean of per-sample perplexities (SEDD, LD4LG)",
        higher_is_better=False,
        display_name="Gen.PPL (mean)",
        default=True,
    )
    register(
        "entropy",
        _entropy_metric,
        description="mean per-sample unigram entropy of the generated token ids, nats (ReMDM)",
        higher_is_better=True,
        display_name="Entropy",
        default=True,
        reads_evaluator=False,
    )
    register(
        "diversity",
        _diversity_metric("diversity", diversity_ngrams),
        description="product over n=2,3,4 of distinct/total n-grams per text, whitespace tokens (SimCTG)",
        higher_is_better=True,
        display_name="Diversity",
        default=True,
        reads_evaluator=False,
    )
    register(
        "diversity_pooled",
        _diversity_metric("diversity_pooled", diversity_pooled_ngrams),
        description="product over n=2,3,4 of distinct/total n-grams pooled over all samples, whitespace tokens (LD4LG)",
        higher_is_better=True,
        display_name="Diversity (pooled)",
        default=True,
        reads_evaluator=False,
    )
    register(
        "mauve",
        _mauve_metric,
        description="MAUVE of valid generations vs held-out references on evaluator features, "
        "with a half-sample 95% interval (needs dihal-bench[mauve])",
        higher_is_better=True,
        display_name="MAUVE",
        default=True,
    )
    register(
        "copied_8grams",
        _copied_metric,
        description="share of the valid samples' whitespace-word 8-grams found in the corpus's training split: "
        "memorisation of the training split (no better direction)",
        higher_is_better=None,
        display_name="copied 8-grams",
        default=False,
        reads_evaluator=False,
    )
