"""Metrics against known answers: hand-counted n-grams and entropies, Gen.PPL recomputed
directly with torch on a tiny random Llama, MAUVE on Gaussians (rank correlations: test_stats.py)."""

from __future__ import annotations

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

from dihal_bench import hookspecs
from dihal_bench.errors import DihalError
from dihal_bench.metrics import (
    MetricContext,
    SampleSet,
    evaluator_features,
    score_texts,
)

WORDS = "the cat sat on a mat dog ran far away and then it slept under tree sun moon star red blue green".split()
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
    """The four members of a backbone that metrics may use, over a Hugging Face causal LM."""

    def __init__(self, model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device("cpu")

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def final_hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


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


# --- evaluator scoring -------------------------------------------------------------------


def test_score_texts_matches_direct_cross_entropy_with_bos(evaluator, model):
    bos = evaluator.tokenizer.bos_token_id
    nll_sums, counts = score_texts(evaluator, TEXTS, batch_size=3)  # one padded batch, one single

    expected = [direct_nll(model, [bos] + text_ids(evaluator.tokenizer, text)) for text in TEXTS]
    np.testing.assert_allclose(nll_sums, expected, rtol=1e-5)
    assert counts.tolist() == [len(text.split()) for text in TEXTS]  # BOS makes every word scored
    assert builtin.gen_ppl(nll_sums, counts) == pytest.approx(
        math.exp(sum(expected) / sum(len(t.split()) for t in TEXTS)), rel=1e-5
    )


def test_score_texts_without_bos_leaves_first_token_unscored(evaluator_without_bos, model):
    nll_sums, counts = score_texts(evaluator_without_bos, TEXTS, batch_size=2)

    expected = [direct_nll(model, text_ids(evaluator_without_bos.tokenizer, text)) for text in TEXTS]
    np.testing.assert_allclose(nll_sums, expected, rtol=1e-5)
    assert counts.tolist() == [len(text.split()) - 1 for text in TEXTS]


def test_texts_with_fewer_than_two_scored_tokens_are_excluded(evaluator, evaluator_without_bos):
    texts = ["", "cat", "cat sat", "cat sat on"]
    _, counts_bos = score_texts(evaluator, texts)
    nll_sums, counts_no_bos = score_texts(evaluator_without_bos, texts)
    assert counts_bos.tolist() == [0, 0, 2, 3]
    assert counts_no_bos.tolist() == [0, 0, 0, 2]
    assert nll_sums[:3].tolist() == [0.0, 0.0, 0.0]


def test_score_texts_truncates_to_max_length(evaluator, model):
    text = " ".join(WORDS)
    nll_sums, counts = score_texts(evaluator, [text], max_length=8)
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
    nll_sums, counts = score_texts(evaluator, texts, batch_size=5)  # padded batches

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
    features = evaluator_features(evaluator, TEXTS, batch_size=3)

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
    assert set(registered) == {"gen_ppl", "gen_ppl_sample_mean", "entropy", "diversity", "mauve"}
    assert registered["gen_ppl"][1]["higher_is_better"] is False
    assert registered["mauve"][1]["higher_is_better"] is True
    assert all(meta["description"] for _, meta in registered.values())


def test_gen_ppl_metrics_score_the_texts_once(registered, evaluator, monkeypatch):
    calls = []
    logits = evaluator.logits
    monkeypatch.setattr(evaluator, "logits", lambda *args: calls.append(1) or logits(*args))
    monkeypatch.setattr(builtin, "_last_scores", None)
    samples = sample_set(TEXTS + ["cat"], evaluator.tokenizer)
    ctx = MetricContext(evaluator=evaluator, references=[], seed=0, batch_size=len(TEXTS) + 1)

    corpus = registered["gen_ppl"][0](samples, ctx)
    sample_mean = registered["gen_ppl_sample_mean"][0](samples, ctx)

    assert len(calls) == 1
    nll_sums, counts = score_texts(evaluator, samples.texts)
    assert corpus["gen_ppl"] == pytest.approx(builtin.gen_ppl(nll_sums, counts))
    assert sample_mean["gen_ppl_sample_mean"] == pytest.approx(builtin.gen_ppl_sample_mean(nll_sums, counts))
    assert corpus["n_scored"] == len(TEXTS) and corpus["n_excluded"] == 1  # "cat" has 1 scored token


def test_evaluator_metrics_need_an_evaluator(registered, evaluator):
    samples = sample_set(TEXTS, evaluator.tokenizer)
    for name in ("gen_ppl", "gen_ppl_sample_mean", "mauve"):
        with pytest.raises(DihalError, match=name):
            registered[name][0](samples, MetricContext(evaluator=None, references=TEXTS, seed=0))


def test_entropy_and_diversity_metrics(registered, evaluator):
    samples = SampleSet(method="tiny", texts=["a a a a", "a b c d", ""], token_ids=[[1, 2], [3, 3], []])
    ctx = MetricContext(evaluator=None, references=[], seed=0)
    assert registered["entropy"][0](samples, ctx) == {"entropy": pytest.approx(math.log(2) / 2), "n": 2}
    assert registered["diversity"][0](samples, ctx) == {
        "diversity": pytest.approx(1 / 2),
        "diversity_2": pytest.approx(4 / 6),
        "diversity_3": pytest.approx(3 / 4),
        "diversity_4": 1.0,
    }
    assert registered["diversity"][0](SampleSet("tiny", ["a b"], [[1]]), ctx)["diversity"] is None


def test_mauve_metric_length_matches_references_to_generations(registered, evaluator, monkeypatch):
    rng = np.random.default_rng(5)
    generations = [" ".join(rng.choice(WORDS, size=rng.integers(2, 6))) for _ in range(12)] + [" "]
    references = [" ".join(rng.choice(WORDS, size=10)) for _ in range(20)]
    caps = []

    def spy(evaluator, texts, *, max_tokens=None, **options):
        caps.append(max_tokens)
        return evaluator_features(evaluator, texts, max_tokens=max_tokens, **options)

    monkeypatch.setattr(builtin, "evaluator_features", spy)
    samples = sample_set(generations, evaluator.tokenizer)
    result = registered["mauve"][0](samples, MetricContext(evaluator=evaluator, references=references, seed=0))

    assert caps == [None, [len(text.split()) for text in generations[:12]]]
    assert result["n"] == 12 and 0.0 <= result["mauve"] <= 1.0
    assert "12 of 13 samples" in result["warning"]


def test_mauve_metric_with_few_references_returns_none(registered, evaluator):
    samples = sample_set(TEXTS * 5, evaluator.tokenizer)
    result = registered["mauve"][0](samples, MetricContext(evaluator=evaluator, references=TEXTS, seed=0))
    assert result["mauve"] is None and "4 references" in result["warning"]


def test_sample_set_rejects_mismatched_lengths():
    with pytest.raises(DihalError, match="2 texts but 1"):
        SampleSet(method="m", texts=["a", "b"], token_ids=[[1]])
