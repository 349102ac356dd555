"""The `markov` corpus, a synthetic language with an exact entropy rate, and the exact metrics
that score samples against it (docs/known-answers.md).

The corpus writes windows of a seeded `dihal_bench.numerics.markov.MarkovChain` as English text: state v
is the v-th word of ``WORDS``, each written with a leading space, which SmolLM2's tokenizer reads
as one token (tests/test_markov.py checks every word), so each method's tokenizer, embeddings
and text path are the real ones while the source's distribution is known exactly.

The metrics need no evaluator model: they map each sample's text back to chain states by
whitespace words (any tokenizer's text works; a word outside the chain's vocabulary is an
unknown state, and every transition that touches one counts as forbidden), then score the
transitions exactly. Each reports, beside its value, the same quantity on two anchors of the
same size, drawn with the run's seed: the chain's own samples (`<metric>_chain`) and i.i.d.
uniform samples, the chain's unigram law (`<metric>_unigram`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dihal_bench import hookimpl
from dihal_bench.api.corpus import DEFAULT_SPLIT_FRACTIONS, Corpus, Document
from dihal_bench.api.metrics import MetricContext, SampleSet
from dihal_bench.errors import DihalError
from dihal_bench.numerics.markov import DEFAULT_SMOOTHING, UNKNOWN, MarkovChain
from dihal_bench.training.loop import derived_seed

#: the chain's words, in state order: frequent English words that SmolLM2's tokenizer reads as one
#: token each when written with a leading space; a chain of V states uses the first V
WORDS = tuple(
    "the of and to in is that for it as with was on be by at this from or an are not but have which you all one "
    "had can there were their they we his more will has her when if would so what who been no about some out also "
    "other time into them only than its new then these may people like could first such two over our very most "
    "even after made many any way well where years back much before because through world good those both same "
    "each under life down last still work great long day own never here while part might old should place state "
    "right".split()
)
DEFAULT_STATES = 64
#: H(w) = 1.75 bits = 1.2130 nats per token, against log 64 = 6 bits for unigram text
DEFAULT_WEIGHTS = (0.5, 0.25, 0.125, 0.125)
DEFAULT_DOCUMENTS = 1000
DEFAULT_WORDS_PER_DOCUMENT = 512
#: what starts a reference with options, e.g. markov:states=16,weights=0.7/0.3,seed=1
PREFIX = "markov:"
OPTION_TYPES = {"states": int, "weights": tuple, "seed": int, "documents": int, "words": int}


class MarkovCorpus(Corpus):
    """``documents`` documents of ``words`` words, each a window of the chain from a uniform first
    state, drawn with its own seed (derived from ``seed`` and its index), so a document's text
    depends on its index alone and its id "chain:<index>" decides its split as for any corpus.

    The options are written into ``name`` (``markov:states=...,weights=...,seed=...,documents=...,
    words=...``), which is also a reference that rebuilds this corpus.
    """

    description = "a seeded Markov chain over English words with an exact entropy rate (docs/known-answers.md)"

    def __init__(
        self,
        *,
        states: int = DEFAULT_STATES,
        weights: Sequence[float] = DEFAULT_WEIGHTS,
        seed: int = 0,
        documents: int = DEFAULT_DOCUMENTS,
        words: int = DEFAULT_WORDS_PER_DOCUMENT,
        split_fractions: Sequence[float] = DEFAULT_SPLIT_FRACTIONS,
    ):
        super().__init__(split_fractions=split_fractions)
        if isinstance(states, int) and not isinstance(states, bool) and states > len(WORDS):
            raise DihalError(f"markov corpus: states must be at most {len(WORDS)} (its word list), got {states}")
        self.chain = MarkovChain(states, weights, seed)
        for option, value in (("documents", documents), ("words", words)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise DihalError(f"markov corpus: {option} must be an integer >= 2, got {value!r}")
        self.seed, self.document_count, self.words_per_document = seed, documents, words
        self.vocabulary = WORDS[:states]
        self.state_of = {word: state for state, word in enumerate(self.vocabulary)}
        typed_weights = "/".join(repr(float(w)) for w in weights)
        self.name = (f"{PREFIX}states={states},weights={typed_weights},seed={seed},documents={documents},"
                     f"words={words}")

    def documents(self) -> list[Document]:
        firsts, choices = [], []
        for index in range(self.document_count):
            generator = torch.Generator().manual_seed(derived_seed(self.seed, "markov-document", index))
            firsts.append(torch.randint(self.chain.states, (1,), generator=generator))
            choices.append(torch.multinomial(self.chain.weights, self.words_per_document - 1, replacement=True,
                                             generator=generator))
        walks = self.chain.walk(torch.cat(firsts), torch.stack(choices))
        return [Document(f"chain:{index:06d}", self.render(walk)) for index, walk in enumerate(walks.tolist())]

    def render(self, states: Sequence[int]) -> str:
        """The text of a state sequence: each state's word with a leading space (one SmolLM2 token)."""
        return "".join(f" {self.vocabulary[state]}" for state in states)

    def states(self, text: str) -> list[int]:
        """The chain states of a text's whitespace words, ``UNKNOWN`` for a word outside the vocabulary."""
        return [self.state_of.get(word, UNKNOWN) for word in text.split()]


def markov_corpus(reference: str = "markov", **options) -> MarkovCorpus:
    """The corpus ``markov`` (defaults) or ``markov:KEY=VALUE,...`` with keys states, weights
    (numbers joined by '/'), seed, documents and words; keyword options override the reference's."""
    return MarkovCorpus(**{**parse_reference(reference), **options})


def parse_reference(reference: str) -> dict:
    """The options written in a ``markov[:KEY=VALUE,...]`` reference."""
    if reference == "markov":
        return {}
    if not reference.startswith(PREFIX):
        raise DihalError(f"corpus {reference!r} is not of the form 'markov' or '{PREFIX}KEY=VALUE,...'")
    options = {}
    for item in filter(None, reference[len(PREFIX):].split(",")):
        key, sign, value = item.partition("=")
        if not sign or key not in OPTION_TYPES:
            raise DihalError(f"corpus {reference!r}: {item!r} is not KEY=VALUE with KEY one of "
                             f"{', '.join(OPTION_TYPES)}")
        if key in options:
            raise DihalError(f"corpus {reference!r}: {key} is given twice")
        try:
            options[key] = (tuple(float(w) for w in value.split("/")) if OPTION_TYPES[key] is tuple
                            else int(value))
        except ValueError:
            kind = "numbers joined by '/'" if OPTION_TYPES[key] is tuple else "an integer"
            raise DihalError(f"corpus {reference!r}: {key} must be {kind}, got {value!r}") from None
    return options


def handles_markov(reference: str) -> bool:
    return reference.startswith(PREFIX)


# -- the exact metrics -----------------------------------------------------------------------------


def _chain_corpus(ctx: MetricContext, metric: str) -> MarkovCorpus:
    corpus = ctx.corpus
    if not isinstance(corpus, MarkovCorpus):
        which = "none" if corpus is None else repr(corpus.name)
        raise DihalError(f"metric {metric!r} scores samples against the markov corpus's chain; "
                         f"this run's corpus is {which}")
    return corpus


def _transitions(texts: Sequence[str], corpus: MarkovCorpus) -> torch.Tensor:
    """(N, 2) long: every pair of consecutive words of every text, as states."""
    pairs = [pair for states in map(corpus.states, texts) for pair in zip(states[:-1], states[1:])]
    return torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)


def _anchors(texts: Sequence[str], corpus: MarkovCorpus, seed: int) -> dict[str, torch.Tensor]:
    """The transitions of two anchor sample sets of the texts' own sizes (one sequence per text of
    as many words): the chain's samples and i.i.d. uniform ones, drawn with ``seed``."""
    generator = torch.Generator().manual_seed(derived_seed(seed, "markov-anchors", 0))
    lengths = [len(text.split()) for text in texts]
    chain, uniform = [], []
    for length in lengths:
        if length >= 2:
            walk = corpus.chain.sample(1, length, generator)[0]
            chain.append(torch.stack([walk[:-1], walk[1:]], dim=1))
            draws = torch.randint(corpus.chain.states, (length,), generator=generator)
            uniform.append(torch.stack([draws[:-1], draws[1:]], dim=1))
    empty = torch.empty(0, 2, dtype=torch.long)
    return {"chain": torch.cat(chain) if chain else empty, "unigram": torch.cat(uniform) if uniform else empty}


def _mean_nll(chain: MarkovChain, pairs: torch.Tensor) -> float:
    return float(chain.transition_costs(pairs, DEFAULT_SMOOTHING).mean())


def _exact_metric(name: str, score, extra=None):
    """A registered metric: ``score(chain, pairs) -> float`` of the samples' transitions and of
    each anchor's, plus the transitions counted and what ``extra(chain)`` adds."""

    def metric(samples: SampleSet, ctx: MetricContext) -> dict:
        corpus = _chain_corpus(ctx, name)
        pairs = _transitions(samples.texts, corpus)
        counts = {f"{name}_transitions": len(pairs), f"{name}_n": sum(len(t.split()) >= 2 for t in samples.texts)}
        if len(pairs) == 0:
            return {name: None, f"{name}_chain": None, f"{name}_unigram": None, **counts,
                    "warning": "no sample has two or more words: no transition to score"}
        anchors = _anchors(samples.texts, corpus, ctx.seed)
        return {name: score(corpus.chain, pairs), **{f"{name}_{anchor}": score(corpus.chain, anchor_pairs)
                                                      for anchor, anchor_pairs in anchors.items()},
                **counts, **(extra(corpus.chain) if extra else {})}

    return metric


@hookimpl
def register_corpora(register):
    register("markov", markov_corpus, handles=handles_markov,
             description=f"{MarkovCorpus.description}; options as {PREFIX}states=64,weights=0.5/0.25/0.125/0.125,"
                         f"seed=0,documents=1000,words=512")


@hookimpl
def register_metrics(register):
    register(
        "markov_nll",
        _exact_metric("markov_nll", _mean_nll, lambda chain: {
            "markov_nll_entropy_rate": chain.entropy_rate, "markov_nll_unigram_entropy": chain.unigram_entropy,
            "markov_nll_smoothing": DEFAULT_SMOOTHING}),
        higher_is_better=False,
        display_name="Chain NLL",
        reads_evaluator=False,
        description="nats per transition under the markov corpus's true chain, smoothed by 1e-3 "
                    "(entropy rate H(w) for its own samples); needs the markov corpus",
    )
    register(
        "markov_forbidden",
        _exact_metric("markov_forbidden", lambda chain, pairs: chain.forbidden_rate(pairs)),
        higher_is_better=False,
        display_name="Forbidden",
        reads_evaluator=False,
        description="share of transitions the markov corpus's chain forbids (0 for its own samples, "
                    "1 - K/V for unigram text); needs the markov corpus",
    )
    register(
        "markov_bigram_tv",
        _exact_metric("markov_bigram_tv", lambda chain, pairs: chain.bigram_tv(pairs)),
        higher_is_better=False,
        display_name="Bigram TV",
        reads_evaluator=False,
        description="total variation between the samples' bigram frequencies and the markov chain's "
                    "stationary bigram law; needs the markov corpus",
    )
