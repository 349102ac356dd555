"""Metrics against known answers: hand-counted n-grams and entropies, Gen.PPL recomputed
directly with torch on a tiny random Llama, MAUVE on Gaussians, the validity rule on
hand-made texts (rank correlations: test_stats.py)."""

from __future__ import annotations

import json
import math
import sys

import dihal_builtin.metrics as builtin
import numpy as np
import pluggy
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from dihal_bench.api.metrics import (
    MetricContext,
    PrefixFeatures,
    SampleSet,
    evaluate_texts,
    evaluator_features,
    invalid_reason,
    prefix_features,
)
from dihal_bench.base.memo import LastResult
from dihal_bench.errors import DihalError
from dihal_bench.registry import hookspecs

WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away", "and", "then", "it", "slept", "under",
         "tree", "sun", "moon", "star", "red", "blue", "green"]
TEXTS = ["the cat sat", "a dog ran far away and then it slept", "sun moon star", "red blue green tree under the sun"]


def make_tokenizer(*, with_bos: bool) -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["[PAD]", "[UNK]", "<s>", "</s>"] + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="</s>",
        bos_token="<s>" if with_bos else None,
    )


class TinyEvaluator:
    """The members of a backbone that metrics use, over a Hugging Face causal LM; logits and
    final hidden state from two passes, as the Backbone contract's default gives them."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device("cpu")

    def logits_and_final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
        return logits, self.final_hidden(input_ids, attention_mask)

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class OnePassEvaluator(TinyEvaluator):
    """A TinyEvaluator that also offers logits and final hidden state from one forward pass,
    counting those passes and the (rows, width) of each."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast):
        super().__init__(model, tokenizer)
        self.passes: list[tuple[int, int]] = []

    def logits_and_final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        self.passes.append(tuple(input_ids.shape))
        hidden = self.final_hidden(input_ids, attention_mask)
        return self.model.lm_head(hidden), hidden


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4 + len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def evaluator(model) -> TinyEvaluator:
    return TinyEvaluator(model, make_tokenizer(with_bos=True))


@pytest.fixture
def evaluator_without_bos(model) -> TinyEvaluator:
    return TinyEvaluator(model, make_tokenizer(with_bos=False))


def direct_nll(model: LlamaForCausalLM, ids: list[int]) -> float:
    """Summed NLL of ids[1:] given their prefixes: one unpadded sequence, torch's cross_entropy."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    return F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="sum").item()


def text_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def scores(evaluator, texts: list[str], **options) -> tuple[np.ndarray, np.ndarray]:
    evaluation = evaluate_texts(evaluator, texts, **options)
    return evaluation.nll_sums, evaluation.counts


# --- evaluator scoring -------------------------------------------------------------------


def test_evaluate_texts_matches_direct_cross_entropy_with_bos(evaluator, model):
    bos = evaluator.tokenizer.bos_token_id
    nll_sums, counts = scores(evaluator, TEXTS, max_batch_tokens=24)  # padded batches of 10 + 8 and 4 + 4 ids

    expected = [direct_nll(model, [bos] + text_ids(evaluator.tokenizer, text)) for text in TEXTS]
    np.testing.assert_allclose(nll_sums, expected, rtol=1e-5)
    assert counts.tolist() == [len(text.split()) for text in TEXTS]  # BOS makes every word scored
    assert builtin.gen_ppl(nll_sums, counts) == pytest.approx(
        math.exp(sum(expected) / sum(len(t.split()) for t in TEXTS)), rel=1e-5
    )


def test_evaluate_texts_without_bos_leaves_first_token_unscored(evaluator_without_bos, model):
    nll_sums, counts = scores(evaluator_without_bos, TEXTS, max_batch_tokens=18)  # 9 + 7 and 3 + 3 ids

    expected = [direct_nll(model, text_ids(evaluator_without_bos.tokenizer, text)) for text in TEXTS]
    np.testing.assert_allclose(nll_sums, expected, rtol=1e-5)
    assert counts.tolist() == [len(text.split()) - 1 for text in TEXTS]


def test_texts_with_fewer_than_two_scored_tokens_are_excluded(evaluator, evaluator_without_bos):
    texts = ["", "cat", "cat sat", "cat sat on"]
    _, counts_bos = scores(evaluator, texts)
    nll_sums, counts_no_bos = scores(evaluator_without_bos, texts)
    assert counts_bos.tolist() == [0, 0, 2, 3]
    assert counts_no_bos.tolist() == [0, 0, 0, 2]
    assert nll_sums[:3].tolist() == [0.0, 0.0, 0.0]


def test_evaluate_texts_truncates_to_max_length(evaluator, model):
    text = " ".join(WORDS)
    nll_sums, counts = scores(evaluator, [text], max_length=8)
    ids = [evaluator.tokenizer.bos_token_id] + text_ids(evaluator.tokenizer, text)[:7]
    assert counts.tolist() == [7]
    assert nll_sums[0] == pytest.approx(direct_nll(model, ids), rel=1e-5)


def test_gen_ppl_with_a_large_vocabulary_matches_a_float64_reference():
    # A real evaluator's regime: 32k vocabulary, logits up to |15| (initializer_range 0.5).
    with torch.random.fork_rng():
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=32_000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                             initializer_range=0.5)
        large = LlamaForCausalLM(config).eval()
    evaluator = TinyEvaluator(large, make_tokenizer(with_bos=True))
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(3, 40))) for _ in range(12)]
    nll_sums, counts = scores(evaluator, texts, max_batch_tokens=160)  # padded batches

    # The reference upcasts the same float32 logits (one unpadded text at a time): it removes
    # only the rounding of the log-softmax itself.
    reference_nll, tokens = 0.0, 0
    for text in texts:
        ids = torch.tensor([evaluator.tokenizer.bos_token_id] + text_ids(evaluator.tokenizer, text))
        with torch.no_grad():
            logits = large(input_ids=ids[None]).logits[0, :-1].double()
        reference_nll -= logits.log_softmax(dim=-1).gather(1, ids[1:, None]).sum().item()
        tokens += len(ids) - 1
    assert counts.sum() == tokens

    # Gen.PPL = exp(mean NLL), so its relative error is the mean NLL's absolute error. A
    # float32 log-softmax rounds the shifted logits, their exponentials, the 32k-term sum
    # and its log: a few ulps of numbers of magnitude ≤ 16 (|logits| ≤ 15, log V ≈ 10.4),
    # one ulp being eps32·16 ≈ 1.9e-6 nats, and padding changes the logits by a few ulps
    # more. 1e-5 allows ~5 such ulps; the (B, V, T) layout was off by ~2e-5 here.
    assert builtin.gen_ppl(nll_sums, counts) == pytest.approx(math.exp(reference_nll / tokens), rel=1e-5)


def test_evaluator_features_take_the_last_real_token(evaluator, model):
    features = evaluator_features(evaluator, TEXTS, max_batch_tokens=24)

    assert features.shape == (len(TEXTS), model.config.hidden_size)
    for text, feature in zip(TEXTS, features):
        ids = torch.tensor([[evaluator.tokenizer.bos_token_id] + text_ids(evaluator.tokenizer, text)])
        with torch.no_grad():
            expected = model.model(input_ids=ids).last_hidden_state[0, -1]
        np.testing.assert_allclose(feature, expected.numpy(), rtol=1e-4, atol=1e-5)


def test_evaluator_features_cap_each_text_at_max_tokens(evaluator):
    capped = evaluator_features(evaluator, ["the cat sat on a mat", "dog ran far"], max_tokens=[2, 10])
    plain = evaluator_features(evaluator, ["the cat", "dog ran far"])
    np.testing.assert_allclose(capped, plain, rtol=1e-4, atol=1e-5)


def test_one_pass_scores_and_featurises_as_the_two_calls_do(model):
    tokenizer = make_tokenizer(with_bos=True)
    one_pass = OnePassEvaluator(model, tokenizer)
    combined = evaluate_texts(one_pass, TEXTS + ["cat"], max_batch_tokens=24)
    separate = evaluate_texts(TinyEvaluator(model, tokenizer), TEXTS + ["cat"], max_batch_tokens=24)

    assert one_pass.passes == [(2, 10), (2, 4)]  # "cat" (1 scored token) is not run
    # Both compute lm_head(model.model(...)) on the same batches: equal up to kernel choice.
    np.testing.assert_allclose(combined.nll_sums, separate.nll_sums, rtol=1e-6)
    np.testing.assert_allclose(combined.features, separate.features, rtol=1e-6, atol=1e-7)
    assert combined.counts.tolist() == separate.counts.tolist() == [3, 9, 3, 7, 0]
    assert combined.text_tokens.tolist() == [3, 9, 3, 7, 1]
    assert np.isnan(combined.features[4]).all() and not np.isnan(combined.features[:4]).any()


def test_the_pass_features_are_the_evaluator_features(evaluator):
    evaluation = evaluate_texts(evaluator, TEXTS, max_batch_tokens=24)
    # The pass pads texts in pairs, evaluator_features (budget 1) runs each alone: padding
    # moves float32 activations by a few ulps, as in test_evaluator_features_take_the_last_real_token.
    np.testing.assert_allclose(evaluation.features, evaluator_features(evaluator, TEXTS, max_batch_tokens=1),
                               rtol=1e-4, atol=1e-5)


def test_token_budgets_bound_every_batch_and_leave_the_nll_unchanged(model):
    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(2, 30))) for _ in range(20)]
    results = {}
    for budget in (1, 40, 100, 10**6):
        evaluator = OnePassEvaluator(model, make_tokenizer(with_bos=True))
        results[budget] = evaluate_texts(evaluator, texts, max_batch_tokens=budget)
        assert all(rows * width <= budget or rows == 1 for rows, width in evaluator.passes)
        assert sum(rows for rows, _ in evaluator.passes) == len(texts)
    assert max(rows for rows, _ in evaluator.passes) == len(texts)  # the largest budget: one batch

    unbatched = results[1]  # one text per pass, no padding
    for budget, evaluation in results.items():
        # Padding changes a text's float32 logits by a few ulps only (masked positions are not
        # attended to); NLLs of ~3.4 nats per token then move by ~1e-6 relative, well within 1e-5.
        np.testing.assert_allclose(evaluation.nll_sums, unbatched.nll_sums, rtol=1e-5, err_msg=f"budget {budget}")
        assert evaluation.counts.tolist() == unbatched.counts.tolist()


def test_a_large_vocabulary_lowers_the_token_budget_so_that_the_logits_stay_bounded(model):
    """An evaluator whose vocabulary would make a batch's logits pass MAX_BATCH_LOGITS gets smaller batches
    (here 40 tokens whatever the budget asked), with the NLLs and counts of that budget."""
    from dihal_bench.api.metrics import MAX_BATCH_LOGITS

    rng = np.random.default_rng(3)
    texts = [" ".join(rng.choice(WORDS, size=rng.integers(2, 30))) for _ in range(20)]
    wide = OnePassEvaluator(model, make_tokenizer(with_bos=True))
    wide.vocab_size = MAX_BATCH_LOGITS // 40  # the logits of 40 tokens fill the bound
    bounded = evaluate_texts(wide, texts, max_batch_tokens=10**6)
    assert all(rows * width <= 40 or rows == 1 for rows, width in wide.passes) and len(wide.passes) > 1
    asked = evaluate_texts(OnePassEvaluator(model, make_tokenizer(with_bos=True)), texts, max_batch_tokens=40)
    assert bounded.nll_sums.tolist() == asked.nll_sums.tolist() and bounded.counts.tolist() == asked.counts.tolist()


@pytest.mark.parametrize("budget", [0, -5, 2.5, True])
def test_a_bad_token_budget_is_refused(evaluator, budget):
    with pytest.raises(DihalError, match="max_batch_tokens"):
        evaluate_texts(evaluator, TEXTS, max_batch_tokens=budget)
    with pytest.raises(DihalError, match="max_batch_tokens"):
        MetricContext(evaluator=None, references=[], seed=0, max_batch_tokens=budget)


# --- which samples count ------------------------------------------------------------------


def test_empty_and_whitespace_texts_are_invalid():
    assert invalid_reason("") == "empty"
    assert invalid_reason(" \n\t ") == "empty"


def test_a_text_dominated_by_one_word_is_degenerate():
    assert "degenerate" in invalid_reason("the the the cat")  # 3 of 4 words
    assert "degenerate" in invalid_reason("word")  # a one-word text: 1 of 1
    assert "'ha'" in invalid_reason(" ".join(["ha"] * 60 + WORDS[:10]))  # 60 of 70
    assert invalid_reason("the cat the dog") is None  # exactly half is not more than half
    assert invalid_reason("the cat sat on the mat and the dog ran far away") is None


def test_too_few_evaluator_tokens_make_a_text_invalid():
    assert "too short" in invalid_reason("the cat", scored_tokens=1)
    assert invalid_reason("the cat", scored_tokens=2) is None
    assert invalid_reason("", scored_tokens=5) == "empty"


def test_sample_set_lists_its_valid_samples():
    samples = SampleSet("m", ["the cat sat", "", "a a a b", "dog ran"], [[1], [], [2], [3]])
    assert samples.valid_indices() == [0, 3]
    assert samples.valid_indices(scored_tokens=[3, 0, 4, 1]) == [0]
    assert samples.invalid_reasons()[1] == "empty"
    with pytest.raises(DihalError, match="4 texts but 2 counts"):
        samples.valid_indices(scored_tokens=[1, 2])


@pytest.mark.parametrize("field, value", [("min_valid", 0), ("mauve_bootstrap", -1), ("max_length", 1)])
def test_metric_context_refuses_bad_settings(field, value):
    with pytest.raises(DihalError, match=field):
        MetricContext(evaluator=None, references=[], seed=0, **{field: value})


# --- Gen.PPL conventions ------------------------------------------------------------------


def test_gen_ppl_is_exp_of_token_weighted_mean_nll():
    assert builtin.gen_ppl(np.array([2.0, 4.0, 0.0]), np.array([1, 3, 0])) == pytest.approx(math.exp(6.0 / 4))


def test_sample_mean_is_mean_of_per_text_perplexities_skipping_excluded():
    value = builtin.gen_ppl_sample_mean(np.array([2.0, 6.0, 0.0]), np.array([1, 3, 0]))
    assert value == pytest.approx((math.exp(2.0) + math.exp(2.0)) / 2)


def test_sample_mean_at_least_corpus_level_for_equal_lengths():
    rng = np.random.default_rng(0)
    for _ in range(100):
        counts = np.full(8, 16)
        nll_sums = rng.uniform(0.5, 6.0, size=8) * counts
        assert builtin.gen_ppl_sample_mean(nll_sums, counts) >= builtin.gen_ppl(nll_sums, counts)


def test_sample_mean_at_least_geometric_mean_of_per_text_perplexities():
    rng = np.random.default_rng(1)
    for _ in range(100):
        counts = rng.integers(1, 50, size=8)
        nll_sums = rng.uniform(0.5, 6.0, size=8) * counts
        geometric_mean = math.exp(np.mean(nll_sums / counts))
        assert builtin.gen_ppl_sample_mean(nll_sums, counts) >= geometric_mean * (1 - 1e-12)


def test_sample_mean_can_be_below_corpus_level_for_unequal_lengths():
    # The docstring's example: ppl e^5 over 100 tokens, ppl 1 over 2 tokens.
    nll_sums, counts = np.array([500.0, 0.0]), np.array([100, 2])
    corpus, sample_mean = builtin.gen_ppl(nll_sums, counts), builtin.gen_ppl_sample_mean(nll_sums, counts)
    assert corpus == pytest.approx(math.exp(500 / 102))  # 134.6
    assert sample_mean == pytest.approx((math.exp(5) + 1) / 2)  # 74.7
    assert sample_mean < corpus


def test_conventions_agree_when_every_text_has_the_same_perplexity():
    counts = np.array([3, 10, 40])
    nll_sums = 2.5 * counts
    assert builtin.gen_ppl_sample_mean(nll_sums, counts) == pytest.approx(builtin.gen_ppl(nll_sums, counts))


def test_gen_ppl_without_scored_tokens_raises():
    with pytest.raises(DihalError):
        builtin.gen_ppl(np.zeros(2), np.zeros(2, dtype=int))


# --- entropy and diversity ----------------------------------------------------------------


def test_unigram_entropy_known_distributions():
    assert builtin.unigram_entropy([[1, 2, 3, 4, 5] * 3]) == pytest.approx(math.log(5))
    assert builtin.unigram_entropy([[7] * 10]) == 0.0
    two_to_one = -(1 / 3 * math.log(1 / 3) + 2 / 3 * math.log(2 / 3))
    assert builtin.unigram_entropy([[4, 9, 9], [1, 2, 3, 4, 5] * 3, []]) == pytest.approx((two_to_one + math.log(5)) / 2)


def test_diversity_of_a_repeated_token_and_of_distinct_tokens():
    assert builtin.diversity_ngrams(["a a a a"], 2) == pytest.approx(1 / 3)
    assert builtin.diversity_ngrams(["a a a a"], 3) == pytest.approx(1 / 2)
    assert builtin.diversity_ngrams(["a a a a"], 4) == 1.0
    assert builtin.diversity(["a a a a"]) == pytest.approx(1 / 6)
    assert builtin.diversity(["a b c d e"]) == 1.0


def test_diversity_sums_counts_over_texts():
    # 2-grams: (1 + 3) distinct of (3 + 3); 3-grams: (1 + 2) of (2 + 2); 4-grams: 2 of 2.
    assert builtin.diversity(["a a a a", "a b c d"]) == pytest.approx(4 / 6 * 3 / 4 * 1)


def test_diversity_counts_distinct_ngrams_per_text_not_corpus_wide():
    # Each text has 2-grams (a b), (b a), (a b): 2 distinct of 3, so 4/6 in all (corpus-wide would be 2/6).
    assert builtin.diversity_ngrams(["a b a b", "a b a b"], 2) == pytest.approx(4 / 6)


def test_diversity_counts_each_texts_last_ngram():
    # (a b) (b c) (c a) (a b): SimCTG's loop would stop before the last and report 3/3.
    assert builtin.diversity_ngrams(["a b c a b"], 2) == pytest.approx(3 / 4)


def test_diversity_needs_a_long_enough_text():
    with pytest.raises(DihalError):
        builtin.diversity(["a b c", "d e"])
    with pytest.raises(DihalError):
        builtin.diversity_pooled(["a b c", "d e"])


def test_pooled_diversity_counts_an_ngram_shared_by_texts_once():
    # Each text alone repeats nothing; pooled, 3 copies of 4 2-grams, 3 3-grams, 2 4-grams.
    identical = ["a b c d e"] * 3
    assert builtin.diversity(identical) == 1.0
    assert builtin.diversity_pooled_ngrams(identical, 2) == pytest.approx(4 / 12)
    assert builtin.diversity_pooled(identical) == pytest.approx((1 / 3) ** 3)
    # 2-grams (a b) (b a) (a b) twice over: 2 distinct of 6 pooled, against 4 of 6 per text.
    assert builtin.diversity_pooled_ngrams(["a b a b", "a b a b"], 2) == pytest.approx(2 / 6)


def test_pooled_diversity_equals_per_text_when_texts_share_no_ngram():
    texts = ["a a a a", "b c d e f"]  # within the first text 2-grams repeat; across texts nothing is shared
    assert builtin.diversity_pooled(texts) == pytest.approx(builtin.diversity(texts))


def test_pooled_diversity_never_exceeds_per_text_diversity():
    rng = np.random.default_rng(4)
    for _ in range(50):
        texts = [" ".join(rng.choice(list("abcdef"), size=rng.integers(4, 12))) for _ in range(5)]
        assert builtin.diversity_pooled(texts) <= builtin.diversity(texts) + 1e-12


# --- MAUVE --------------------------------------------------------------------------------


def test_mauve_near_one_for_one_gaussian_and_low_for_disjoint_ones():
    rng = np.random.default_rng(0)
    p = rng.normal(size=(200, 16))
    same = builtin.mauve_score(p, rng.normal(size=(200, 16)), seed=0)
    disjoint = builtin.mauve_score(p, rng.normal(size=(200, 16)) + 3.0, seed=0)
    assert same["mauve"] > 0.9
    assert disjoint["mauve"] < 0.2
    assert same["n"] == 200
    assert "optimistic" in same["warning"]


def test_mauve_is_reproducible_for_a_seed():
    rng = np.random.default_rng(1)
    p, q = rng.normal(size=(60, 8)), rng.normal(size=(60, 8)) + 0.5
    assert builtin.mauve_score(p, q, seed=3) == builtin.mauve_score(p, q, seed=3)


def test_mauve_with_too_few_samples_returns_none_and_names_the_count():
    rng = np.random.default_rng(2)
    result = builtin.mauve_score(rng.normal(size=(50, 4)), rng.normal(size=(9, 4)), seed=0)
    assert result["mauve"] is None and result["n"] == 9
    assert "9 generations" in result["warning"]


def test_mauve_half_sample_interval_holds_its_point_and_is_seeded():
    rng = np.random.default_rng(6)
    p, q = rng.normal(size=(40, 8)), rng.normal(size=(40, 8)) + 0.3
    first = builtin.mauve_score(p, q, seed=3, bootstrap=8)
    assert first == builtin.mauve_score(p, q, seed=3, bootstrap=8)
    assert first["bootstrap"] == 8 and first["interval"] == "half-sample"
    assert 0.0 <= first["mauve_ci_low"] <= first["mauve"] <= first["mauve_ci_high"] <= 1.0
    assert first["mauve_ci_low"] < first["mauve_ci_high"]
    other = builtin.mauve_half_sample_interval(p, q, first["mauve"], seed=4, draws=8)
    assert other != (first["mauve_ci_low"], first["mauve_ci_high"])


def test_mauve_leaves_the_process_thread_count_as_it_found_it():
    # faiss and torch share OpenMP: MAUVE's one k-means thread once stayed set for every later matmul
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        rng = np.random.default_rng(8)
        builtin.mauve_score(rng.normal(size=(30, 4)), rng.normal(size=(30, 4)), seed=0, bootstrap=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_mauve_without_bootstrap_has_no_interval():
    rng = np.random.default_rng(7)
    result = builtin.mauve_score(rng.normal(size=(30, 4)), rng.normal(size=(30, 4)), seed=0)
    assert result["mauve_ci_low"] is None and result["mauve_ci_high"] is None and result["bootstrap"] == 0


def test_mauve_intervals_separate_one_gaussian_from_disjoint_ones_at_evaluator_width():
    # The size of a real run's check: 128 samples a side, features as wide as a 576-d evaluator.
    rng = np.random.default_rng(8)
    p = rng.normal(size=(128, 576)).astype(np.float32)
    same = builtin.mauve_score(p, rng.normal(size=(128, 576)).astype(np.float32), seed=0, bootstrap=6)
    shifted = builtin.mauve_score(p, rng.normal(size=(128, 576)).astype(np.float32) + 0.5, seed=0, bootstrap=6)
    assert shifted["mauve_ci_high"] < same["mauve_ci_low"]


def test_mauve_without_the_extra_says_how_to_install_it(monkeypatch, registered, evaluator):
    monkeypatch.setitem(sys.modules, "mauve", None)  # makes `import mauve` raise ImportError
    with pytest.raises(DihalError, match=r"dihal-bench\[mauve\]"):
        builtin.mauve_score(np.zeros((20, 2)), np.zeros((20, 2)), seed=0)
    ctx = MetricContext(evaluator=evaluator, references=TEXTS, seed=0)
    with pytest.raises(DihalError, match=r"dihal-bench\[mauve\]"):
        registered["mauve"][0](sample_set(TEXTS, evaluator.tokenizer), ctx)


# --- rank correlations --------------------------------------------------------------------


# --- the registered metric plugins --------------------------------------------------------


@pytest.fixture(scope="module")
def registered() -> dict[str, tuple]:
    pm = pluggy.PluginManager("dihal_bench")
    pm.add_hookspecs(hookspecs)
    pm.register(builtin)
    found = {}
    pm.hook.register_metrics(register=lambda name, fn, **meta: found.setdefault(name, (fn, meta)))
    return found


def sample_set(texts: list[str], tokenizer) -> SampleSet:
    return SampleSet(method="tiny", texts=texts, token_ids=[text_ids(tokenizer, t) for t in texts])


def test_plugin_registers_every_builtin_metric(registered):
    assert set(registered) == {"gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity", "diversity_pooled", "mauve",
                               "copied_8grams"}
    assert registered["gen_ppl"][1]["higher_is_better"] is False
    assert registered["mauve"][1]["higher_is_better"] is True
    assert registered["diversity_pooled"][1]["higher_is_better"] is True
    assert registered["diversity_pooled"][1]["display_name"] == "Diversity (pooled)"
    assert all(meta["description"] for _, meta in registered.values())


def random_texts(seed: int, count: int) -> list[str]:
    """`count` texts of 5-9 distinct random words: valid under the evaluator tokenizer."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(5, 10), replace=False)) for _ in range(count)]


def test_evaluator_metrics_run_the_evaluator_once_on_the_same_valid_samples(registered, model, monkeypatch):
    evaluator = OnePassEvaluator(model, make_tokenizer(with_bos=True))
    monkeypatch.setattr(builtin, "_last_pass", LastResult())
    invalid = ["", "the the the cat", "cat"]  # empty, degenerate, one scored token
    generations = random_texts(9, 12)
    samples = sample_set(invalid + generations, evaluator.tokenizer)
    ctx = MetricContext(evaluator=evaluator, references=random_texts(10, 20), seed=0, min_valid=12,
                        mauve_bootstrap=0)
    mauve_q, mauve_score = [], builtin.mauve_score

    def spy(p_features, q_features, **options):
        mauve_q.append(q_features)
        return mauve_score(p_features, q_features, **options)

    monkeypatch.setattr(builtin, "mauve_score", spy)

    corpus = registered["gen_ppl"][0](samples, ctx)
    sample_mean = registered["gen_ppl_sample_mean"][0](samples, ctx)
    mauve = registered["mauve"][0](samples, ctx)

    assert len(evaluator.passes) == 1  # every generation in one batch, scored and featurised at once
    expected = evaluate_texts(evaluator, generations)
    # expected pads the valid texts in another batch: the float32 rounding of padding, as above
    assert corpus["gen_ppl"] == pytest.approx(builtin.gen_ppl(expected.nll_sums, expected.counts), rel=1e-5)
    assert sample_mean["gen_ppl_sample_mean"] == pytest.approx(
        builtin.gen_ppl_sample_mean(expected.nll_sums, expected.counts), rel=1e-5)
    for result in (corpus, sample_mean, mauve):
        assert (result["n_valid"], result["n_invalid"]) == (12, 3)
    np.testing.assert_allclose(mauve_q[0], expected.features, rtol=1e-4, atol=1e-5)
    assert mauve["n"] == 12 and 0.0 <= mauve["mauve"] <= 1.0


def test_gen_ppl_records_each_samples_nll_and_tokens_and_they_rebuild_it(registered, model, monkeypatch):
    evaluator = OnePassEvaluator(model, make_tokenizer(with_bos=True))
    monkeypatch.setattr(builtin, "_last_pass", LastResult())
    generations = random_texts(12, 16)
    samples = sample_set(generations[:3] + ["", "the the the cat"] + generations[3:], evaluator.tokenizer)
    ctx = MetricContext(evaluator=evaluator, references=[], seed=0, min_valid=16)
    result = registered["gen_ppl"][0](samples, ctx)

    nll, tokens = result["nll_per_sample"], result["tokens_per_sample"]
    assert len(nll) == len(tokens) == 18
    assert nll[3] is None and nll[4] is None  # empty and degenerate: invalid, left out of Gen.PPL
    assert all(value is not None for i, value in enumerate(nll) if i not in (3, 4))
    valid = [i for i in range(18) if nll[i] is not None]
    assert sum(tokens[i] for i in valid) == result["tokens"]
    # the lists are the numbers Gen.PPL was computed from: they give it back to float64 rounding
    assert result["gen_ppl"] == pytest.approx(math.exp(sum(nll[i] for i in valid) / result["tokens"]), rel=1e-12)
    expected = evaluate_texts(evaluator, generations)
    np.testing.assert_allclose([nll[i] for i in valid], expected.nll_sums, rtol=1e-5)  # float32 padding, as above
    json.dumps(result)  # plain JSON values, as a record stores them
    assert "nll_per_sample" not in registered["gen_ppl_sample_mean"][0](samples, ctx)


def test_too_few_valid_samples_flag_the_method_instead_of_averaging(registered, evaluator):
    samples = sample_set(TEXTS + ["", "a a a a"], evaluator.tokenizer)
    ctx = MetricContext(evaluator=evaluator, references=random_texts(11, 20), seed=0)  # min_valid 16
    for name in ("gen_ppl", "gen_ppl_sample_mean", "mauve"):
        result = registered[name][0](samples, ctx)
        assert result[name] is None, name
        assert "flagged, not averaged: 4 valid samples of 6, under min_valid=16" in result["warning"]
        assert "sample 4: empty" in result["warning"]
        assert (result["n_valid"], result["n_invalid"]) == (4, 2)


def test_evaluator_metrics_need_an_evaluator(registered, evaluator):
    samples = sample_set(TEXTS, evaluator.tokenizer)
    for name in ("gen_ppl", "gen_ppl_sample_mean", "mauve"):
        with pytest.raises(DihalError, match=name):
            registered[name][0](samples, MetricContext(evaluator=None, references=TEXTS, seed=0))


def test_entropy_and_diversity_metrics(registered, evaluator):
    samples = SampleSet(method="tiny", texts=["a a a a", "a b c d", ""], token_ids=[[1, 2], [3, 3], []])
    ctx = MetricContext(evaluator=None, references=[], seed=0)
    assert registered["entropy"][0](samples, ctx) == {"entropy": pytest.approx(math.log(2) / 2), "n": 2, "n_valid": 1}
    assert registered["diversity"][0](samples, ctx) == {
        "diversity": pytest.approx(1 / 2),
        "diversity_2": pytest.approx(4 / 6),
        "diversity_3": pytest.approx(3 / 4),
        "diversity_4": 1.0,
        "n_valid": 1,
    }
    assert registered["diversity"][0](SampleSet("tiny", ["a b"], [[1]]), ctx)["diversity"] is None


def test_pooled_diversity_metric(registered):
    samples = SampleSet(method="tiny", texts=["a b c d e"] * 3 + ["x"], token_ids=[[1]] * 4)
    ctx = MetricContext(evaluator=None, references=[], seed=0)
    assert registered["diversity_pooled"][0](samples, ctx) == {
        "diversity_pooled": pytest.approx(1 / 27),
        "diversity_pooled_2": pytest.approx(4 / 12),
        "diversity_pooled_3": pytest.approx(3 / 9),
        "diversity_pooled_4": pytest.approx(2 / 6),
        "n_valid": 3,  # "x" is a one-word text
    }
    assert registered["diversity"][0](samples, ctx)["diversity"] == 1.0
    short = registered["diversity_pooled"][0](SampleSet("tiny", ["a b"], [[1]]), ctx)
    assert short["diversity_pooled"] is None and "4 or more words" in short["warning"]


def test_mauve_metric_length_matches_references_to_generations(registered, evaluator, monkeypatch):
    rng = np.random.default_rng(5)
    generations = [" ".join(rng.choice(WORDS, size=rng.integers(2, 6), replace=False)) for _ in range(12)] + [" "]
    references = [" ".join(rng.choice(WORDS, size=10)) for _ in range(20)] + ["", "sun sun sun"]
    featurised, caps = [], []

    def spy_features(evaluator, texts, **options):
        featurised.append(list(texts))
        return prefix_features(evaluator, texts, **options)

    def spy_at(self, max_tokens=None):
        caps.append((len(self.states), max_tokens))
        return original_at(self, max_tokens)

    original_at = PrefixFeatures.at
    monkeypatch.setattr(builtin, "prefix_features", spy_features)
    monkeypatch.setattr(PrefixFeatures, "at", spy_at)
    samples = sample_set(generations, evaluator.tokenizer)
    ctx = MetricContext(evaluator=evaluator, references=references[::-1], seed=0, min_valid=10, mauve_bootstrap=3)
    result = registered["mauve"][0](samples, ctx)
    again = registered["mauve"][0](samples, ctx)

    # Only the valid references are featurised (the generations come from the scoring pass),
    # once for both calls; the first 12 are read, each cut to its generation's length.
    assert featurised == [references[19::-1]]
    assert caps == [(12, [len(text.split()) for text in generations[:12]])] * 2
    assert again["mauve"] == result["mauve"]
    assert result["n"] == 12 and 0.0 <= result["mauve"] <= 1.0
    assert (result["n_valid"], result["n_invalid"]) == (12, 1)
    assert result["bootstrap"] == 3 and result["mauve_ci_low"] <= result["mauve_ci_high"]


def test_mauve_metric_with_few_references_returns_none(registered, evaluator):
    samples = sample_set(TEXTS * 5, evaluator.tokenizer)
    result = registered["mauve"][0](samples, MetricContext(evaluator=evaluator, references=TEXTS, seed=0))
    assert result["mauve"] is None and "4 references" in result["warning"]


def test_sample_set_rejects_mismatched_lengths():
    with pytest.raises(DihalError, match="2 texts but 1"):
        SampleSet(method="m", texts=["a", "b"], token_ids=[[1]])
