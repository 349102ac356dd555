"""The example baseline plugin (plugins/examples/dihal-bench-ngram), registered inline the way its
entry point registers it once installed: the fitted law is the law of the counts, samples never take
a transition the training text never took when nothing is smoothed, the checkpoint round-trips
through safetensors, a fit resumes from its checkpoint, and the seed decides the samples."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from dihal_bench.errors import DihalError
from dihal_bench.numerics.markov import MarkovChain
from dihal_bench.registry.plugins import get_registry
from dihal_bench.training.budget import Budget

EXAMPLE = Path(__file__).resolve().parent.parent / "plugins" / "examples" / "dihal-bench-ngram"
BUDGET = Budget(steps=1, batch_size=1, seq_len=64)
#: the char tokenizer's first non-special id: chain state s is written as token s + OFFSET
OFFSET = 3

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def example():
    """The plugin's module, imported from its folder as an uninstalled package."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        yield importlib.import_module("dihal_bench_ngram")
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.fixture
def ngram(example, inline_plugin):
    """The registered baseline class, as the harness finds it by name."""
    inline_plugin(example, "ngram-example")
    return get_registry().get("baseline", "ngram").obj


@pytest.fixture(scope="module")
def chain() -> MarkovChain:
    """64 states, each with 4 allowed successors (weights ½, ¼, ⅛, ⅛): docs/known-answers.md."""
    return MarkovChain(states=64, weights=[0.5, 0.25, 0.125, 0.125], seed=0)


@pytest.fixture(scope="module")
def walks(chain) -> torch.Tensor:
    """64 windows of 64 chain states, as token ids of the tiny backbone."""
    return chain.sample(64, 64, torch.Generator().manual_seed(0)) + OFFSET


def test_the_plugin_registers_its_baseline_through_the_hook(ngram, example):
    registration = get_registry().get("baseline", "ngram")
    assert ngram is example.Ngram and registration.plugin == "ngram-example"
    assert registration.meta["description"] and not ngram.in_budget
    assert ngram.token_sampling_options == ("temperature", "top_p")


#: windows with known counts: unigrams 5: 3, 6: 2, 7: 2, 8: 1 (N = 8); after 5 come 6 twice and 8 once,
#: after 6 come 5 and 7 once each, after 7 comes 7 once, and 8 (a window's last token) is never followed
KNOWN = torch.tensor([[5, 6, 5, 8], [5, 6, 7, 7]])
UNIGRAM_COUNTS = torch.tensor([3, 2, 2, 1], dtype=torch.float64)


def test_the_fitted_bigram_law_is_the_law_of_the_counts(ngram, llama_backbone):
    model = ngram(llama_backbone, BUDGET, order=2, smoothing=0.0)
    model.fit(KNOWN, progress=False)
    assert model.fitted().vocabulary.tolist() == [5, 6, 7, 8]
    probabilities = model.next_token_probabilities(torch.tensor([[0], [1], [2], [3]]))
    expected = torch.tensor([[0, 2, 0, 1], [1, 0, 1, 0], [0, 0, 1, 0], [3, 2, 2, 1]], dtype=torch.float64)
    expected = expected / expected.sum(1, keepdim=True)  # the unseen context 8 backs off to the unigram counts
    # both sides are one float64 division of the same integers: equal bit for bit
    assert torch.equal(probabilities, expected)
    assert torch.equal(model.next_token_probabilities(torch.empty(1, 0, dtype=torch.long))[0], UNIGRAM_COUNTS / 8)


def test_smoothing_interpolates_with_the_lower_order(ngram, llama_backbone):
    """p(w | h) = (c(h, w) + α·p_1(w)) / (c(h) + α) and p_1(w) = (c(w) + α/V) / (N + α), by hand."""
    model = ngram(llama_backbone, BUDGET, order=2, smoothing=2.0)
    model.fit(KNOWN, progress=False)
    unigram = (UNIGRAM_COUNTS + 2.0 / 4) / (8 + 2.0)
    after_5 = (torch.tensor([0, 2, 0, 1], dtype=torch.float64) + 2.0 * unigram) / (3 + 2.0)
    probabilities = model.next_token_probabilities(torch.tensor([[0], [3]]))
    # a few float64 operations apart from the formula as written here: agreement to a few ulps
    torch.testing.assert_close(probabilities, torch.stack([after_5, unigram]), rtol=1e-15, atol=0)


def test_an_unsmoothed_bigram_of_the_chain_matches_it_and_never_takes_a_forbidden_step(ngram, llama_backbone,
                                                                                        chain, walks):
    model = ngram(llama_backbone, BUDGET, order=2, smoothing=0.0)
    model.fit(walks, progress=False)
    states = model.fitted().vocabulary - OFFSET
    assert states.tolist() == list(range(64))
    fitted = model.next_token_probabilities(torch.arange(64)[:, None])
    truth = chain.transition[states][:, states]
    assert torch.equal(fitted > 0, truth > 0)  # every allowed step was seen, no forbidden one
    # each row is a multinomial estimate from the row's count of transitions: within 5 standard errors
    row_counts = torch.stack([(walks[:, :-1] == OFFSET + s).sum() for s in states]).double()
    error = (truth * (1 - truth) / row_counts[:, None]).sqrt()
    assert ((fitted - truth).abs() <= 5 * error).all()

    samples = model.sample(64, 64, seed=1, batch_size=32) - OFFSET
    assert chain.forbidden_rate(samples) == 0.0
    smoothed = ngram(llama_backbone, BUDGET, order=2, smoothing=1.0)
    smoothed.fit(walks, progress=False)
    assert chain.forbidden_rate(smoothed.sample(64, 64, seed=1, batch_size=32) - OFFSET) > 0.0  # the test can fail


def test_special_tokens_are_never_counted_nor_sampled(ngram, llama_backbone):
    eos = llama_backbone.tokenizer.eos_token_id
    windows = torch.tensor([[5, 6, eos, 7, 5], [6, 5, 6, 7, eos]])
    model = ngram(llama_backbone, BUDGET, order=3, smoothing=1.0)
    model.fit(windows, progress=False)
    assert eos not in model.fitted().vocabulary.tolist()
    grams, _ = model.fitted().table(2)
    assert {tuple(gram) for gram in (model.fitted().vocabulary[grams]).tolist()} == {(5, 6), (6, 5), (6, 7), (7, 5)}
    assert eos not in model.sample(16, 32, seed=0).unique().tolist()


def test_the_seed_decides_the_samples_and_temperature_zero_is_the_argmax(ngram, llama_backbone, walks):
    model = ngram(llama_backbone, BUDGET, order=3)
    model.fit(walks, progress=False)
    first = model.sample(8, 20, seed=4, batch_size=3)
    assert first.shape == (8, 20) and first.dtype == torch.long
    assert torch.equal(first, model.sample(8, 20, seed=4, batch_size=3))
    assert not torch.equal(first, model.sample(8, 20, seed=5, batch_size=3))
    greedy = ngram(llama_backbone, BUDGET, order=3, temperature=0.0)
    greedy.fit(walks, progress=False)
    ids = greedy.sample(2, 5, seed=0) - OFFSET
    compact = torch.searchsorted(greedy.fitted().vocabulary, ids + OFFSET)
    for i in range(5):
        assert torch.equal(compact[:, i], greedy.next_token_probabilities(compact[:, max(0, i - 2):i]).argmax(1))


def test_the_checkpoint_is_safetensors_and_round_trips(ngram, llama_backbone, walks, tmp_path):
    model = ngram(llama_backbone, BUDGET, order=3)
    model.fit(walks, progress=False)
    model.save(tmp_path)
    assert {path.name for path in tmp_path.iterdir()} == {"weights.safetensors", "baseline.json"}
    restored = ngram(llama_backbone, BUDGET, order=3)
    with pytest.raises(DihalError, match="not fitted"):
        restored.sample(1, 4, seed=0)
    restored.load(tmp_path)
    assert restored.fitted().shapes() == model.fitted().shapes()
    for key, value in model.module().state_dict().items():
        assert torch.equal(restored.module().state_dict()[key], value), key
    assert torch.equal(restored.sample(6, 16, seed=2), model.sample(6, 16, seed=2))
    ngram(llama_backbone, BUDGET, order=3, temperature=0.5).load(tmp_path)  # sampling options may differ
    with pytest.raises(DihalError, match="holds 'ngram' with options"):
        ngram(llama_backbone, BUDGET, order=2).load(tmp_path)
    weights = tmp_path / "weights.safetensors"
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    with pytest.raises(DihalError, match="sha256|damaged|changed"):
        ngram(llama_backbone, BUDGET, order=3).load(tmp_path)


def test_a_fit_resumes_from_its_checkpoint_and_refuses_other_windows(ngram, llama_backbone, walks, tmp_path):
    first = ngram(llama_backbone, BUDGET, order=3)
    counted = first.fit(walks, checkpoint_dir=tmp_path, progress=False)
    assert counted.resumed_from_step is None and counted.tokens_seen == walks.numel()
    assert json.loads((tmp_path / "baseline.json").read_text())["data_sha256"] == first.data_sha256
    again = ngram(llama_backbone, BUDGET, order=3)
    resumed = again.fit(walks, checkpoint_dir=tmp_path, progress=False)
    assert resumed.resumed_from_step == 0
    assert torch.equal(again.sample(4, 16, seed=0), first.sample(4, 16, seed=0))
    with pytest.raises(DihalError, match="other training windows"):
        ngram(llama_backbone, BUDGET, order=3).fit(walks[:10], checkpoint_dir=tmp_path, progress=False)


def test_bad_options_are_refused(ngram, llama_backbone):
    for options, message in (({"order": 0}, "order must be in 1..64"), ({"order": 65}, "order must be in 1..64"),
                             ({"smoothing": -1.0}, "smoothing must be finite"),
                             ({"smoothing": math.inf}, "smoothing must be finite"),
                             ({"temperature": -1.0}, "temperature"), ({"orders": 2}, "unknown option")):
        with pytest.raises(DihalError, match=message):
            ngram(llama_backbone, BUDGET, **options)
    with pytest.raises(DihalError, match="no text tokens"):
        ngram(llama_backbone, BUDGET).fit(torch.tensor([[0, 1, 2]]), progress=False)
