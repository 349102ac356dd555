"""The synthetic Markov language against its known answers (docs/known-answers.md): the entropy
rate H(w), a doubly stochastic P, forward–backward marginals equal to brute-force enumeration
(plain, DDPM and bridge emissions), the chain's own samples at the entropy rate and i.i.d. ones
at the unigram answers, the `markov` corpus and its exact metrics, and (integration) every word
one token of SmolLM2's tokenizer."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from dihal_builtin.markov import (
    DEFAULT_WEIGHTS,
    WORDS,
    MarkovCorpus,
    markov_corpus,
    parse_reference,
)

from dihal_bench.api.corpus import Corpus, Document
from dihal_bench.api.metrics import MetricContext, SampleSet
from dihal_bench.errors import DihalError
from dihal_bench.numerics.markov import (
    DEFAULT_SMOOTHING,
    UNKNOWN,
    MarkovChain,
    bridge_oracle,
    ddpm_oracle,
    gaussian_log_likelihood,
    oracle_x0,
)
from dihal_bench.registry.plugins import get_registry
from dihal_bench.registry.resolve import load_corpus

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: how many standard errors a sample mean may stray from its exact expectation: a false alarm
#: at 5σ has probability < 1e-6, and every draw here is seeded, so a pass is reproducible
Z = 5.0
#: float64 sums of a few hundred terms of size ≤ 1e3: rounding far below this
EXACT = 1e-10


# -- the chain -----------------------------------------------------------------------------------


def test_entropy_rate_is_h_of_w_and_the_unigram_floor_log_v():
    chain = MarkovChain(64, DEFAULT_WEIGHTS, seed=0)
    assert chain.entropy_rate == pytest.approx(1.75 * math.log(2), rel=1e-14)  # 1/2, 1/4, 1/8, 1/8: 1.75 bits
    assert chain.unigram_entropy == pytest.approx(math.log(64), rel=1e-14)
    assert MarkovChain(5, [1.0], seed=3).entropy_rate == 0.0  # one permutation: deterministic text


@pytest.mark.parametrize("states,weights,seed",
                         [(64, DEFAULT_WEIGHTS, 0), (7, [0.2, 0.3, 0.5], 11), (4, [0.25] * 4, 2)])
def test_p_is_doubly_stochastic_with_k_distinct_images_per_row(states, weights, seed):
    chain = MarkovChain(states, weights, seed)
    P = chain.transition
    assert P.dtype == torch.float64 and P.shape == (states, states)
    ones = torch.ones(states, dtype=torch.float64)
    torch.testing.assert_close(P.sum(1), ones, rtol=0, atol=1e-15)
    torch.testing.assert_close(P.sum(0), ones, rtol=0, atol=1e-15)
    for k in range(len(weights)):  # each Π_k is a permutation
        assert sorted(chain.images[k].tolist()) == list(range(states))
    for v in range(states):  # the K images of a row differ, so its non-zero entries are w itself
        assert len(set(chain.images[:, v].tolist())) == len(weights)
        assert sorted(P[v][P[v] > 0].tolist()) == pytest.approx(sorted(weights), abs=1e-15)
    assert int((P == 0).sum()) == states * (states - len(weights))


def test_the_seed_fixes_the_chain():
    assert torch.equal(MarkovChain(16, [0.6, 0.4], 5).transition, MarkovChain(16, [0.6, 0.4], 5).transition)
    assert not torch.equal(MarkovChain(16, [0.6, 0.4], 5).transition, MarkovChain(16, [0.6, 0.4], 6).transition)


@pytest.mark.parametrize("states,weights,seed,message", [
    (1, [1.0], 0, "states must be an integer >= 2"),
    (True, [1.0], 0, "states must be an integer >= 2"),
    (8, [0.5, 0.4], 0, "weights must sum to 1"),
    (8, [1.5, -0.5], 0, "every weight must be positive"),
    (8, [0.5, float("nan"), 0.5], 0, "every weight must be positive"),
    (2, [0.25, 0.25, 0.5], 0, "needs 1 to 2 weights"),
    (8, [], 0, "needs 1 to 8 weights"),
    (8, "abc", 0, "weights must be a sequence of numbers"),
    (8, [1.0], "0", "seed must be an integer"),
])
def test_bad_chain_options_are_one_line_errors(states, weights, seed, message):
    with pytest.raises(DihalError, match=message) as error:
        MarkovChain(states, weights, seed)
    assert "\n" not in str(error.value)


def test_bad_state_tensors_and_smoothing_are_one_line_errors():
    chain = MarkovChain(4, [0.5, 0.5], 0)
    for states, message in ((torch.tensor([[0, 4]]), "must lie in 0..3"), (torch.tensor([[0, -2]]), "must lie in 0..3"),
                            (torch.tensor([[1]]), "2 or more states"), (torch.tensor([0, 1]), r"\(n, L\) integer"),
                            (torch.tensor([[0.0, 1.0]]), r"\(n, L\) integer")):
        with pytest.raises(DihalError, match=message):
            chain.forbidden_rate(states)
    for smoothing in (0.0, 1.0, -0.1, True):
        with pytest.raises(DihalError, match="smoothing must be a number in"):
            chain.nll_per_token(torch.tensor([[0, 1]]), smoothing)
    with pytest.raises(DihalError, match="must be positive wherever scale"):
        gaussian_log_likelihood(torch.zeros(1, 2, 3), torch.zeros(4, 3), 1.0, None, 0.0)


# -- the exact posterior against brute force -------------------------------------------------------


def brute_force_marginals(chain: MarkovChain, log_density) -> torch.Tensor:
    """γ (n, L, V) by enumerating all V^L sequences s: p(s | x) ∝ π(s_1)·Π P(s_i, s_{i+1})·Π p(x_i | s_i),
    ``log_density(i, v)`` giving (n,) log p(x_i | s_i = v) with every constant kept."""
    n, length, states = log_density.n, log_density.length, chain.states
    marginals = torch.zeros(n, length, states, dtype=torch.float64)
    for sequence in itertools.product(range(states), repeat=length):
        weight = torch.full((n,), 1 / states, dtype=torch.float64)
        for a, b in zip(sequence, sequence[1:]):
            weight = weight * chain.transition[a, b]
        for i, v in enumerate(sequence):
            weight = weight * log_density(i, v).exp()
        for i, v in enumerate(sequence):
            marginals[:, i, v] += weight
    return marginals / marginals.sum(-1, keepdim=True)


class GaussianDensity:
    """log N(x_i; scale·e_v + offset_i, std²·I) with its normalising constant, per sequence."""

    def __init__(self, x, table, scale, offset, std):
        self.x, self.table, self.offset = x.double(), table.double(), offset
        self.scale, self.std = torch.as_tensor(scale, dtype=torch.float64), torch.as_tensor(std, dtype=torch.float64)
        self.n, self.length = x.shape[:2]

    def __call__(self, i: int, v: int) -> torch.Tensor:
        mean = self.scale.reshape(-1, 1) * self.table[v] + (0 if self.offset is None else self.offset[:, i].double())
        d = self.x.shape[-1]
        std = self.std.reshape(-1)
        return (-(self.x[:, i] - mean).pow(2).sum(-1) / (2 * std**2) - d * torch.log(std * math.sqrt(2 * math.pi)))


def tiny_case(seed: int = 0):
    chain = MarkovChain(4, [0.6, 0.3, 0.1], seed=seed)
    generator = torch.Generator().manual_seed(seed)
    table = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    states = chain.sample(3, 4, generator)
    return chain, table, states, generator


def test_forward_backward_equals_enumeration_for_arbitrary_evidence():
    chain, _, _, generator = tiny_case()
    log_likelihood = 3 * torch.randn(3, 4, 4, generator=generator, dtype=torch.float64)

    class Given:
        n, length = 3, 4

        def __call__(self, i, v):
            return log_likelihood[:, i, v]

    gamma = chain.posterior(log_likelihood)
    torch.testing.assert_close(gamma, brute_force_marginals(chain, Given()), rtol=0, atol=EXACT)
    # a constant per (sequence, position) changes nothing: the posterior ignores it
    shifted = log_likelihood + 1e3 * torch.randn(3, 4, 1, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(chain.posterior(shifted), gamma, rtol=0, atol=EXACT)


def test_ddpm_oracle_is_the_posterior_mean_by_enumeration():
    chain, table, states, generator = tiny_case(1)
    alpha = torch.tensor([0.05, 0.5, 0.9], dtype=torch.float64)  # one noise level per sequence
    x = alpha.sqrt()[:, None, None] * table[states] + (1 - alpha).sqrt()[:, None, None] * torch.randn(
        3, 4, 3, generator=generator, dtype=torch.float64)
    expected = brute_force_marginals(chain, GaussianDensity(x, table, alpha.sqrt(), None, (1 - alpha).sqrt())) @ table
    torch.testing.assert_close(oracle_x0(chain, table, x, alpha.sqrt(), None, (1 - alpha).sqrt()), expected,
                               rtol=0, atol=EXACT)
    # the reverse_chain adapter, with t mapped to ᾱ by a schedule
    predict = ddpm_oracle(chain, table, lambda t: 1 - t)
    torch.testing.assert_close(predict(x, 1 - alpha, torch.zeros_like(x)), expected, rtol=0, atol=EXACT)


def test_bridge_oracle_is_the_posterior_mean_under_the_brownian_bridge_by_enumeration():
    chain, table, states, generator = tiny_case(2)
    sigma, t = 0.5, torch.tensor([0.1, 0.5, 0.95], dtype=torch.float64)
    cond = torch.randn(3, 4, 3, generator=generator, dtype=torch.float64)
    tt = t[:, None, None]
    x = (1 - tt) * table[states] + tt * cond + sigma * (tt * (1 - tt)).sqrt() * torch.randn(
        3, 4, 3, generator=generator, dtype=torch.float64)
    density = GaussianDensity(x, table, 1 - t, tt * cond, sigma * (t * (1 - t)).sqrt())
    expected = brute_force_marginals(chain, density) @ table
    torch.testing.assert_close(bridge_oracle(chain, table, sigma)(x, t, cond), expected, rtol=0, atol=EXACT)
    # at t = 1 the bridge sits on its condition: no evidence, so x̂₀ is the prior mean, the mean row
    at_one = bridge_oracle(chain, table, sigma)(cond, torch.ones(3, dtype=torch.float64), cond)
    torch.testing.assert_close(at_one, table.mean(0).expand(3, 4, 3), rtol=0, atol=EXACT)


def test_oracle_keeps_the_input_dtype_and_sharpens_at_low_noise():
    chain, table, states, _ = tiny_case(3)
    clean = table[states].float()
    recovered = oracle_x0(chain, table, clean, 1.0, None, 1e-3)
    assert recovered.dtype == torch.float32
    torch.testing.assert_close(recovered, clean, rtol=0, atol=1e-6)  # float32 rounding of the rows


# -- the chain's own samples and i.i.d. ones -------------------------------------------------------


def test_samples_are_seeded_and_never_take_a_forbidden_transition():
    chain = MarkovChain(16, [0.5, 0.3, 0.2], seed=4)
    first = chain.sample(50, 40, torch.Generator().manual_seed(9))
    assert torch.equal(first, chain.sample(50, 40, torch.Generator().manual_seed(9)))
    assert first.shape == (50, 40) and first.dtype == torch.long
    assert chain.forbidden_rate(first) == 0.0
    assert (chain.transition[first[:, :-1], first[:, 1:]] > 0).all()


def test_chain_samples_score_the_entropy_rate_within_their_standard_error():
    chain = MarkovChain(64, DEFAULT_WEIGHTS, seed=0)
    states = chain.sample(100, 101, torch.Generator().manual_seed(0))  # 10,000 transitions
    # Which permutation a step takes is i.i.d. ~ w, so the transition costs are i.i.d. with the
    # variance of −log P_ε over w: the mean's standard error is exact.
    costs = -((1 - DEFAULT_SMOOTHING) * chain.weights + DEFAULT_SMOOTHING / 64).log()
    error = math.sqrt(float((chain.weights * costs**2).sum() - chain.expected_nll() ** 2) / 10_000)
    assert float(chain.nll_per_token(states).mean()) == pytest.approx(chain.expected_nll(), abs=Z * error)
    # and the smoothed expectation is within ε·(log V + 1) of H(w)
    assert abs(chain.expected_nll() - chain.entropy_rate) < DEFAULT_SMOOTHING * (math.log(64) + 1)


def test_iid_uniform_samples_score_the_unigram_answers():
    chain = MarkovChain(64, DEFAULT_WEIGHTS, seed=0)
    states = torch.randint(64, (100, 101), generator=torch.Generator().manual_seed(1))
    count, allowed = 10_000, 4 / 64
    # consecutive transitions of i.i.d. states are pairwise independent (allowed or not) and
    # uncorrelated in cost (every column of P is w rearranged, like every row): plain standard errors
    rate_error = math.sqrt(allowed * (1 - allowed) / count)
    assert chain.forbidden_rate(states) == pytest.approx(1 - allowed, abs=Z * rate_error)
    costs = -((1 - DEFAULT_SMOOTHING) * chain.transition + DEFAULT_SMOOTHING / 64).log()
    error = math.sqrt(float(costs.pow(2).mean() - costs.mean() ** 2) / count)
    assert float(costs.mean()) == pytest.approx(chain.expected_unigram_nll(), rel=1e-12)
    assert float(chain.nll_per_token(states).mean()) == pytest.approx(chain.expected_unigram_nll(), abs=Z * error)


def test_bigram_tv_known_values():
    chain = MarkovChain(8, DEFAULT_WEIGHTS, seed=1)
    # transitions in exactly the law's proportions (w is dyadic: 4, 2, 1, 1 copies per state): TV 0
    copies = (4, 2, 1, 1)
    exact = torch.tensor([(v, int(chain.images[k, v]))
                          for v in range(8) for k, c in enumerate(copies) for _ in range(c)])
    assert chain.bigram_tv(exact) == pytest.approx(0.0, abs=1e-15)
    # every ordered pair once: TV(uniform on V², π⊗P) = ½[V·Σ_k |1/V² − w_k/V| + 1 − K/V]
    every = torch.tensor(list(itertools.product(range(8), repeat=2)))
    expected = 0.5 * (sum(abs(1 / 8 - w) for w in DEFAULT_WEIGHTS) + 1 - 4 / 8)  # 0.5 here
    assert chain.bigram_tv(every) == pytest.approx(expected, abs=1e-15)
    # words the chain does not know are mass where the law has none
    assert chain.bigram_tv(torch.tensor([[UNKNOWN, UNKNOWN, 3]])) == pytest.approx(1.0, abs=1e-15)
    assert chain.forbidden_rate(torch.tensor([[0, UNKNOWN, int(chain.images[0, 0])]])) == 1.0


# -- the corpus --------------------------------------------------------------------------------------


SMALL = "markov:states=16,weights=0.5/0.3/0.2,seed=3,documents=40,words=30"


def test_the_corpus_renders_chain_windows_as_words_with_stable_ids():
    corpus = load_corpus(SMALL)
    assert isinstance(corpus, MarkovCorpus) and corpus.name == SMALL
    documents = corpus.documents()
    assert [d.id for d in documents] == [f"chain:{i:06d}" for i in range(40)]
    states = torch.tensor([corpus.states(d.text) for d in documents])
    assert states.shape == (40, 30) and states.min() >= 0
    assert corpus.chain.forbidden_rate(states) == 0.0
    assert all(d.text == corpus.render(s) and d.text.startswith(" ") for d, s in zip(documents, states.tolist()))
    # a document's text depends on its index alone, not on how many there are
    fewer = markov_corpus(SMALL, documents=10).documents()
    assert fewer == documents[:10]
    # the name is a reference that rebuilds the same corpus; the hash split applies
    assert load_corpus(corpus.name).documents() == documents
    assert sum(len(corpus.split(name)) for name in ("train", "validation", "test")) == 40
    assert markov_corpus().name == "markov:states=64,weights=0.5/0.25/0.125/0.125,seed=0,documents=1000,words=512"


@pytest.mark.parametrize("reference,message", [
    ("markov:states=16,colour=red", "is not KEY=VALUE with KEY one of"),
    ("markov:states", "is not KEY=VALUE"),
    ("markov:states=sixteen", "states must be an integer"),
    ("markov:weights=0.5/x", "weights must be numbers joined by '/'"),
    ("markov:seed=1,seed=2", "seed is given twice"),
    (f"markov:states={len(WORDS) + 1}", f"at most {len(WORDS)}"),
    ("markov:weights=0.5/0.4", "weights must sum to 1"),
    ("markov:documents=1", "documents must be an integer >= 2"),
])
def test_bad_corpus_references_are_one_line_errors(reference, message):
    with pytest.raises(DihalError, match=message) as error:
        load_corpus(reference)
    assert "\n" not in str(error.value)


def test_reference_options_parse():
    assert parse_reference("markov") == {}
    assert parse_reference("markov:states=8,weights=0.75/0.25,seed=2") == {"states": 8, "weights": (0.75, 0.25),
                                                                          "seed": 2}


# -- the exact metrics --------------------------------------------------------------------------------


def metric(name: str):
    return get_registry().get("metric", name).obj


def context(corpus, seed: int = 0) -> MetricContext:
    return MetricContext(evaluator=None, references=[], seed=seed, corpus=corpus)


def samples_of(texts: list[str]) -> SampleSet:
    return SampleSet("m", texts, [[0]] * len(texts))


def test_metrics_of_chain_text_sit_at_the_chain_anchor_and_of_unigram_text_at_the_unigram_anchor():
    corpus = markov_corpus(states=64)
    chain = corpus.chain
    generator = torch.Generator().manual_seed(5)
    own = samples_of([corpus.render(s) for s in chain.sample(64, 64, generator).tolist()])
    unigram = samples_of([corpus.render(s) for s in torch.randint(64, (64, 64), generator=generator).tolist()])
    count = 64 * 63
    # standard errors of a mean over `count` transitions (independence as in the tests above)
    chain_costs = -((1 - DEFAULT_SMOOTHING) * chain.weights + DEFAULT_SMOOTHING / 64).log()
    chain_error = math.sqrt(float((chain.weights * chain_costs**2).sum() - chain.expected_nll() ** 2) / count)
    uniform_costs = -((1 - DEFAULT_SMOOTHING) * chain.transition + DEFAULT_SMOOTHING / 64).log()
    unigram_error = math.sqrt(float(uniform_costs.pow(2).mean() - uniform_costs.mean() ** 2) / count)
    for texts, forbidden, nll, error in ((own, 0.0, chain.expected_nll(), chain_error),
                                         (unigram, 1 - 4 / 64, chain.expected_unigram_nll(), unigram_error)):
        result = metric("markov_nll")(texts, context(corpus))
        assert result["markov_nll"] == pytest.approx(nll, abs=Z * error)
        assert result["markov_nll_transitions"] == count and result["markov_nll_n"] == 64
        assert result["markov_nll_entropy_rate"] == chain.entropy_rate
        assert result["markov_nll_chain"] == pytest.approx(chain.expected_nll(), abs=Z * chain_error)
        assert result["markov_nll_unigram"] == pytest.approx(chain.expected_unigram_nll(), abs=Z * unigram_error)
        rate = metric("markov_forbidden")(texts, context(corpus))
        assert rate["markov_forbidden"] == pytest.approx(forbidden, abs=Z * math.sqrt(4 / 64 * 60 / 64 / count))
        assert rate["markov_forbidden_chain"] == 0.0
        tv = metric("markov_bigram_tv")(texts, context(corpus))
        assert set(tv) >= {"markov_bigram_tv", "markov_bigram_tv_chain", "markov_bigram_tv_unigram"}
    # with the run's seed the anchors are the same numbers
    assert metric("markov_bigram_tv")(own, context(corpus, 3)) == metric("markov_bigram_tv")(own, context(corpus, 3))
    # chain text's bigram TV is the chain anchor's size, far below unigram text's
    own_tv = metric("markov_bigram_tv")(own, context(corpus))
    assert own_tv["markov_bigram_tv"] < 0.5 * own_tv["markov_bigram_tv_unigram"]


def test_words_outside_the_vocabulary_make_every_transition_they_touch_forbidden():
    corpus = markov_corpus(SMALL)
    first, second = corpus.vocabulary[0], corpus.vocabulary[int(corpus.chain.images[0, 0])]
    allowed = f"{first} {second}"
    assert metric("markov_forbidden")(samples_of([allowed]), context(corpus))["markov_forbidden"] == 0.0
    result = metric("markov_forbidden")(samples_of([f"{first} xyzzy {second}", allowed]), context(corpus))
    assert result["markov_forbidden"] == pytest.approx(2 / 3)
    nll = metric("markov_nll")(samples_of([f"{first} xyzzy"]), context(corpus))["markov_nll"]
    assert nll == pytest.approx(math.log(16 / DEFAULT_SMOOTHING))


def test_samples_without_a_transition_leave_nothing_to_measure():
    result = metric("markov_nll")(samples_of(["the", ""]), context(markov_corpus(SMALL)))
    assert result["markov_nll"] is None and "no transition" in result["warning"]


def test_a_metric_on_another_corpus_is_a_one_line_error():
    class Other(Corpus):
        name, description = "stdlib-docs", "not a chain"

        def documents(self):
            return [Document("a", "text")]

    for corpus, named in ((Other(), "'stdlib-docs'"), (None, "none")):
        with pytest.raises(DihalError, match=f"against the markov corpus's chain; this run's corpus is {named}$"):
            metric("markov_nll")(samples_of(["the of"]), context(corpus))


def test_the_runner_hands_the_runs_corpus_to_the_metrics():
    from types import SimpleNamespace

    from dihal_bench.study.stages.metrics import compute_named_metrics

    corpus = markov_corpus(SMALL)
    settings = SimpleNamespace(max_length=1024, min_valid=1, mauve_bootstrap=0)
    run = SimpleNamespace(evaluator=None, corpus=corpus, config=SimpleNamespace(metrics=settings))
    text = corpus.documents()[0].text
    values = compute_named_metrics(run, "m", samples_of([text]), [], 0, ["markov_forbidden"])
    assert values["markov_forbidden"] == 0.0 and values["markov_forbidden_transitions"] == 29


# -- the real tokenizer (integration) --------------------------------------------------------------------


@pytest.mark.integration
def test_every_word_is_one_smollm2_token_and_documents_tokenize_word_for_word():
    from dihal_builtin.embedded import smollm2_gguf
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)  # no model weights: ~7 s
    encoded = tokenizer([f" {word}" for word in WORDS], add_special_tokens=False)["input_ids"]
    assert [len(ids) for ids in encoded] == [1] * len(WORDS)
    assert len({ids[0] for ids in encoded}) == len(WORDS)
    corpus = markov_corpus(states=len(WORDS), documents=4, words=200)
    for document in corpus.documents():
        ids = tokenizer(document.text, add_special_tokens=False)["input_ids"]
        assert ids == [encoded[state][0] for state in corpus.states(document.text)]
        assert tokenizer.decode(ids).split() == document.text.split()
