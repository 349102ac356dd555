"""The hybrid LM on tiny random-weight Llama, Qwen3 and Gemma3 backbones: the oracle bridge
reproduces the backbone, position 0 is exact, cached decoding (upper layers' and bridge's
caches) equals recomputing the whole prefix (beyond the sliding window too), and the intact
control equals transformers' greedy generate."""

from __future__ import annotations

import pytest
import torch
from dihal_builtin.bridge import DihalBridge
from dihal_builtin.hf_backbone import HFBackbone
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from dihal_bench.api.sampling import sample_next_token, special_ids
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.model import (
    HybridLM,
    OracleBridge,
    intact_control,
    skip_control,
    start_token_id,
)

FAMILIES = ("llama", "qwen3", "gemma3")
VOCAB = 128  # the tiny models' (conftest.py)
WINDOW = 8  # the tiny Gemma3's sliding window: generated lengths go well beyond it


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=FAMILIES)
def backbone(request, tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models[request.param], char_tokenizer, f"tiny-{request.param}")


def random_ids(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def fitted_bridge(backbone: HFBackbone, layer: int, *, layers: int = 1, steps: int = 2, linear_path: bool = False,
                  bridge_class: type[DihalBridge] = DihalBridge) -> DihalBridge:
    """An untrained tiny DiHAL bridge whose standardiser matches the backbone's h_0 and h_ℓ;
    ``linear_path`` gives the linear condition path (zero at initialisation) random weights."""
    torch.manual_seed(1)
    bridge = bridge_class(backbone.width, d_model=32, layers=layers, heads=2, steps=steps)
    if linear_path:
        torch.nn.init.normal_(bridge.cond_skip.weight, std=0.2)
    ids = random_ids(8, 12, seed=1)
    states = backbone.hidden_states(ids)
    mask = torch.ones(ids.shape, dtype=torch.bool)
    mask[:, 0] = False
    bridge.fit_standardizer(states[0], states[layer], mask)
    return bridge


def word_tokenizer(*, with_bos: bool) -> PreTrainedTokenizerFast:
    """A word-level tokenizer with (optionally) a BOS token, which the character one lacks."""
    specials = ["<pad>", "<eos>", "<unk>"] + (["<s>"] if with_bos else [])
    words = ["the", "cat", "sat", "on", "a", "mat"]
    backend = Tokenizer(models.WordLevel({t: i for i, t in enumerate(specials + words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>",
                                   eos_token="<eos>", bos_token="<s>" if with_bos else None)


# -- teacher forcing ----------------------------------------------------------------------


def test_oracle_bridge_reproduces_backbone_logits_at_every_layer(backbone):
    ids = random_ids(3, 2 * WINDOW + 3)
    mask = torch.ones_like(ids)
    mask[1, WINDOW + 2 :] = 0  # right padding: the real positions are unaffected
    real = mask.bool()
    full, padded = backbone.logits(ids), backbone.logits(ids, mask)
    for layer in range(1, backbone.num_layers):
        hybrid = HybridLM(backbone, OracleBridge(backbone, layer), layer)
        torch.testing.assert_close(hybrid.logits(ids), full, atol=1e-5, rtol=0)
        torch.testing.assert_close(hybrid.logits(ids, mask)[real], padded[real], atol=1e-5, rtol=0)


def test_sink_passthrough_makes_position_0_exact_and_gives_it_to_the_bridge(backbone):
    layer = 2
    ids = random_ids(3, 9)
    bridge = fitted_bridge(backbone, layer, bridge_class=SpiedBridge)
    truth = backbone.hidden_states(ids)[layer]
    hybrid = HybridLM(backbone, bridge, layer)
    on, bridged = hybrid.lower_states(ids), hybrid.bridged_states(ids)
    torch.testing.assert_close(on[:, 0], truth[:, 0], atol=1e-5, rtol=0)
    assert torch.equal(on, bridged)  # the bridge returns the sink it is given
    assert torch.equal(bridge.sinks[-1], hybrid.sink_state(ids))
    torch.testing.assert_close(bridge.sinks[-1], truth[:, :1], atol=1e-5, rtol=0)

    ablation = HybridLM(backbone, bridge, layer, sink_passthrough=False)
    off = ablation.lower_states(ids)
    assert bridge.sinks[-1] is None and torch.equal(off, ablation.bridged_states(ids))
    assert (off[:, 0] - truth[:, 0]).norm(dim=-1).min() > 1e-2  # the untrained bridge misses it
    assert (off[:, 1:] - on[:, 1:]).abs().amax() > 1e-3  # and every later position attends to it


def test_skip_control_feeds_the_embedding_output(backbone):
    ids = random_ids(2, 8)
    control = skip_control(backbone, 2, sink_passthrough=False)
    assert torch.equal(control.lower_states(ids), backbone.embed(ids))
    torch.testing.assert_close(control.logits(ids), backbone.resume(backbone.embed(ids), 2), atol=0, rtol=0)
    with_sink = skip_control(backbone, 2).lower_states(ids)
    torch.testing.assert_close(with_sink[:, 0], backbone.hidden_states(ids)[2][:, 0], atol=1e-5, rtol=0)


def test_layer_out_of_range_is_refused(backbone):
    with pytest.raises(DihalError, match="out of range"):
        HybridLM(backbone, fitted_bridge(backbone, 1), backbone.num_layers)


# -- generation ---------------------------------------------------------------------------


@pytest.mark.parametrize("temperature, top_p", [(1.0, 0.9), (0.0, 1.0)], ids=["nucleus", "greedy"])
@pytest.mark.parametrize("sink_passthrough", [True, False], ids=["sink", "no-sink"])
def test_cached_generation_equals_uncached(backbone, temperature, top_p, sink_passthrough):
    """Beyond Gemma3's sliding window, unconditionally and after a prompt longer than the window,
    with a batch split unevenly."""
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2), 2, sink_passthrough=sink_passthrough)
    for prompt in (None, random_ids(3, 2 * WINDOW - 1, seed=5)):
        options = {"prompt_ids": prompt, "temperature": temperature, "top_p": top_p, "seed": 3, "batch_size": 2}
        cached = hybrid.generate(3, 3 * WINDOW, **options)
        uncached = hybrid.generate(3, 3 * WINDOW, use_cache=False, **options)
        assert cached.shape == (3, 3 * WINDOW) and cached.dtype == torch.long
        assert torch.equal(cached, uncached)
        assert len(cached.unique()) > 3  # real variation, not a repeated token


# Cached and uncached decoding run the same float32 operations on the same numbers; they
# differ only in how the work is batched (one new position against the whole prefix), which
# changes the summation order inside matrix products and attention. Each such sum (length
# ≤ 128 here) is exact to a relative few × 1e-6 in the worst case (length × 2^-24), and
# the logits come out of ~10² of them in sequence (K ≤ 8 denoiser passes of a 2-block
# transformer, then the upper layers) with O(1) gains: worst case ~1e-4 relative on logits
# of size ≤ 10, so 1e-3 absolute. A misplaced position, mask or condition moves them by O(1).
LOGITS_ATOL = 1e-3


@pytest.mark.parametrize("steps", [1, 8], ids=["K1", "K8"])
@pytest.mark.parametrize("batch", [1, 16], ids=["batch1", "batch16"])
@pytest.mark.parametrize("prompted", [False, True], ids=["no-prompt", "prompt"])
def test_cached_decode_equals_uncached_decode(backbone, steps, batch, prompted):
    """Step by step in logits, and token for token in generate, beyond Gemma3's window."""
    # two blocks: every block's cache in use; the linear path: a path that sees positions too
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2, layers=2, steps=steps, linear_path=True), 2)
    start = backbone.tokenizer.eos_token_id  # generate's start token: the character tokenizer has no BOS
    context = random_ids(batch, 2 * WINDOW - 1, seed=5) if prompted else torch.full((batch, 1), start)
    cached, uncached = hybrid.decoder(), hybrid.decoder(use_cache=False)
    generator = torch.Generator().manual_seed(2)
    new = context
    for _ in range(3 * WINDOW):
        reference = uncached.append(new)
        assert reference.shape == (batch, new.shape[1], VOCAB)
        torch.testing.assert_close(cached.append(new), reference, atol=LOGITS_ATOL, rtol=0)
        new = sample_next_token(reference[:, -1], 1.0, 1.0, generator)[:, None]
    assert cached.length == uncached.length == context.shape[1] + 3 * WINDOW - 1

    options = {"prompt_ids": context if prompted else None, "seed": 3, "batch_size": batch}
    tokens = hybrid.generate(batch, 3 * WINDOW, **options)
    assert torch.equal(tokens, hybrid.generate(batch, 3 * WINDOW, use_cache=False, **options))
    assert len(tokens.unique()) > 3


class SpiedBridge(DihalBridge):
    """Records the number of positions of every whole-sequence and incremental sampling call."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled, self.stepped, self.sinks = [], [], []

    def sample(self, cond, *args, sink=None, **kwargs):
        self.sampled.append(cond.shape[1])
        self.sinks.append(sink)
        return super().sample(cond, *args, sink=sink, **kwargs)

    def sample_step(self, cond_new, cache):
        self.stepped.append(cond_new.shape[1])
        return super().sample_step(cond_new, cache)


class WholeSequenceBridge(SpiedBridge):
    """A bridge with no sample cache, as a third-party bridge that only implements ``sample``."""

    def new_sample_cache(self, steps=None, sink=None, generator=None, sampler=None):
        return None


def test_cached_decode_runs_the_bridge_on_new_positions_only(backbone):
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2, bridge_class=SpiedBridge), 2)
    hybrid.generate(2, 6, prompt_ids=random_ids(2, 4))
    assert hybrid.bridge.sampled == [] and hybrid.bridge.stepped == [4, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("sink_passthrough", [True, False], ids=["sink", "no-sink"])
def test_the_bridge_cache_holds_the_sink_of_the_first_token(backbone, sink_passthrough):
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2), 2, sink_passthrough=sink_passthrough)
    decoder, prompt = hybrid.decoder(), random_ids(2, 4)
    decoder.append(prompt)
    expected = hybrid.sink_state(prompt) if sink_passthrough else None
    assert decoder.bridge_cache.steps == 2
    assert decoder.bridge_cache.sink is None if expected is None else torch.equal(decoder.bridge_cache.sink, expected)


def test_bridge_without_sample_cache_is_resampled_over_the_prefix(backbone):
    """The fallback for such bridges: the same tokens as the uncached decode, the upper
    layers still cached (so only the bridge sees the whole prefix)."""
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2, bridge_class=WholeSequenceBridge), 2)
    options = {"prompt_ids": random_ids(2, 4), "seed": 3}
    cached = hybrid.generate(2, 6, **options)
    assert hybrid.bridge.stepped == [] and hybrid.bridge.sampled == [4, 5, 6, 7, 8, 9]
    first_sink = hybrid.bridge.sinks[0]
    assert first_sink is not None and all(sink is first_sink for sink in hybrid.bridge.sinks)  # computed once
    assert torch.equal(cached, hybrid.generate(2, 6, use_cache=False, **options))


def test_sink_state_runs_only_the_replaced_layers(backbone, monkeypatch):
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2), 2)
    depths = []
    hidden_states = backbone.hidden_states

    def spy(input_ids, attention_mask=None, *, up_to=None):
        depths.append(up_to)
        return hidden_states(input_ids, attention_mask, up_to=up_to)

    monkeypatch.setattr(backbone, "hidden_states", spy)
    hybrid.generate(2, 4)
    assert depths == [2]  # once, at the first position, layers 1..2 only


def test_decoder_refuses_malformed_input(backbone):
    decoder = HybridLM(backbone, fitted_bridge(backbone, 1), 1).decoder()
    decoder.append(random_ids(2, 3))
    for ids in (random_ids(3, 1), random_ids(2, 0), random_ids(2, 1)[0]):
        with pytest.raises(DihalError, match="append takes token ids of shape"):
            decoder.append(ids)


def test_intact_control_matches_transformers_greedy_generate(backbone):
    start = backbone.tokenizer.eos_token_id  # the character tokenizer has no BOS
    ours = intact_control(backbone).generate(2, 3 * WINDOW, temperature=0.0)
    theirs = backbone.model.generate(torch.full((2, 1), start), max_new_tokens=3 * WINDOW, do_sample=False,
                                     suppress_tokens=special_ids(backbone.tokenizer))
    assert torch.equal(ours, theirs[:, 1:])


def test_same_seed_gives_same_tokens_and_another_seed_differs(backbone):
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 1), 1)
    first = hybrid.generate(4, 8, seed=11)
    assert torch.equal(first, hybrid.generate(4, 8, seed=11))
    assert not torch.equal(first, hybrid.generate(4, 8, seed=12))


def test_generation_never_draws_a_special_token_even_the_most_likely(backbone, monkeypatch):
    eos = backbone.tokenizer.eos_token_id
    resume = backbone.resume

    def eos_favoured(*args, **kwargs):
        logits = resume(*args, **kwargs)
        logits[..., eos] += 100.0  # EOS would be drawn at nearly every step
        return logits

    monkeypatch.setattr(backbone, "resume", eos_favoured)
    for temperature in (0.0, 1.0):
        ids = intact_control(backbone).generate(4, 8, temperature=temperature, seed=3)
        assert ids.shape == (4, 8) and eos not in ids.tolist()[0] and not (ids == eos).any()


def test_generation_starts_from_bos_or_else_eos(tiny_models):
    for with_bos, start in ((True, "<s>"), (False, "<eos>")):
        backbone = HFBackbone(tiny_models["llama"], word_tokenizer(with_bos=with_bos), "tiny-llama")
        hybrid = skip_control(backbone, 2)
        start_id = backbone.tokenizer.convert_tokens_to_ids(start)
        assert start_token_id(backbone.tokenizer) == start_id
        prompted = hybrid.generate(2, 6, prompt_ids=torch.tensor([start_id]), temperature=0.0)
        assert torch.equal(hybrid.generate(2, 6, temperature=0.0), prompted)
        other = hybrid.generate(2, 6, prompt_ids=torch.tensor([start_id + 1]), temperature=0.0)
        assert not torch.equal(prompted, other)  # the start token matters, so the check has teeth


def test_a_tokenizer_without_bos_or_eos_has_no_start_token(tiny_models):
    tokenizer = word_tokenizer(with_bos=False)
    tokenizer.eos_token = None
    with pytest.raises(DihalError, match="neither a BOS nor an EOS"):
        start_token_id(tokenizer)
    with pytest.raises(DihalError, match="^tiny-llama: the tokenizer has neither"):
        skip_control(HFBackbone(tiny_models["llama"], tokenizer, "tiny-llama"), 2).generate(1, 2)


def test_prompted_generation_continues_the_prompt(backbone):
    hybrid = HybridLM(backbone, fitted_bridge(backbone, 2), 2)
    prompt = random_ids(2, 5, seed=9)
    continuation = hybrid.generate(2, 4, prompt_ids=prompt, temperature=0.0)

    def greedy(logits):  # the most likely token that is not a special one, which are never drawn
        return logits.index_fill(-1, torch.tensor(special_ids(backbone.tokenizer)), float("-inf")).argmax(-1)

    assert torch.equal(continuation[:, 0], greedy(hybrid.logits(prompt)[:, -1]))
    full = torch.cat([prompt, continuation], dim=1)
    assert torch.equal(continuation[:, -1], greedy(hybrid.logits(full[:, :-1])[:, -1]))


def test_bad_sampling_options_are_refused(backbone):
    hybrid = skip_control(backbone, 1)
    for options, message in (({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
                             ({"prompt_ids": random_ids(3, 4)}, "prompt_ids")):
        with pytest.raises(DihalError, match=message):
            hybrid.generate(2, 4, **options)


# -- the sampler --------------------------------------------------------------------------


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p():
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])  # sorted: 0.4, 0.3, 0.2, 0.1
    logits = probs.log().expand(4000, -1)
    generator = torch.Generator().manual_seed(0)

    half = sample_next_token(logits, 1.0, 0.5, generator)  # mass before: 0, .4, .7, .9
    assert set(half.tolist()) == {1, 3}
    assert abs((half == 1).float().mean().item() - 4 / 7) < 0.03  # renormalised 0.4 / 0.7

    assert set(sample_next_token(logits, 1.0, 0.75, generator).tolist()) == {1, 2, 3}
    assert set(sample_next_token(logits, 1.0, 1.0, generator).tolist()) == {0, 1, 2, 3}
    assert set(sample_next_token(logits, 1.0, 1e-6, generator).tolist()) == {1}
    assert set(sample_next_token(logits, 0.0, 1.0, generator).tolist()) == {1}


def test_temperature_sharpens_the_distribution():
    logits = torch.tensor([0.0, 1.0]).expand(4000, -1)
    generator = torch.Generator().manual_seed(0)
    share = {t: sample_next_token(logits, t, 1.0, generator).float().mean().item() for t in (0.5, 1.0, 2.0)}
    expected = {t: torch.sigmoid(torch.tensor(1.0 / t)).item() for t in share}  # p(token 1) = σ(1/T)
    for t, drawn in share.items():
        assert abs(drawn - expected[t]) < 0.03


def test_banned_ids_are_never_drawn_even_when_most_likely():
    logits = torch.tensor([5.0, 0.0, 0.0, 4.0]).expand(2000, -1)  # ids 0 and 3 carry almost all the mass
    generator = torch.Generator().manual_seed(0)
    for temperature, top_p in ((1.0, 1.0), (1.0, 0.5), (0.0, 1.0)):
        drawn = sample_next_token(logits, temperature, top_p, generator, banned=[0, 3])
        assert set(drawn.tolist()) <= {1, 2}
    assert set(sample_next_token(logits, 0.0, 1.0, generator, banned=[0]).tolist()) == {3}
    assert logits[0, 0] == 5.0  # the caller's logits are left alone
