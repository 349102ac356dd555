"""The SED baseline, its PCA embeddings and the cosine schedule, on a tiny random-weight backbone."""

from __future__ import annotations

import dataclasses
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from dihal_builtin.baselines.common import CompactVocabulary, pca_embeddings
from dihal_builtin.baselines.schedules import cosine_alpha_bar, reverse_step
from dihal_builtin.baselines.sed import SED, SEDDetachedReadout, register_baselines
from torch import Tensor

from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

SENTENCES = ["cats run", "dogs sit"]  # 8 characters: 8 tokens of the character tokenizer
TINY = {"embed_dim": 8, "d_model": 32, "layers": 2, "heads": 2}
# a SmolLM2-scale allowance: the DiHAL bridge's size at width 576 before its linear condition path
SMOLLM2_ALLOWANCE = 2_285_888
# the 6,252 of SmolLM2's 49,152 token ids that a stdlib-docs training split holds (issue #10)
SMOLLM2_SPLIT_VOCABULARY = CompactVocabulary(tuple(range(0, 6252 * 7, 7)), 49_152)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(encode_sentences) -> torch.Tensor:
    """The two sentences, 16 copies each, as (32, 8) token ids."""
    ids = encode_sentences(SENTENCES, copies=16)
    assert ids.shape == (32, 8)
    return ids


def overfit_budget() -> Budget:
    return Budget(steps=300, batch_size=8, seq_len=8, lr=3e-3, epochs=75, seed=0)


@pytest.fixture(scope="module")
def trained(llama_backbone, corpus, one_torch_thread):
    """(model, training result): SED trained to overfit the two sentences."""
    model = SED(llama_backbone, overfit_budget(), seed=0, **TINY)
    result = model.fit(corpus, progress=False)
    return model, result


def denoiser_calls(model: SED) -> tuple[list, object]:
    """Records (input, output) of every denoiser call; returns the list and the hook handle."""
    calls = []
    handle = model.parts["denoiser"].register_forward_hook(lambda _m, args, out: calls.append((args[0], out)))
    return calls, handle


# -- cosine schedule and PCA embeddings -------------------------------------------------


def test_cosine_schedule_known_values():
    alpha = cosine_alpha_bar(torch.tensor([0.0, 1 / 3, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(alpha[:3], torch.tensor([1.0, 0.75, 0.5], dtype=torch.float64))
    assert alpha[3] == 1e-6  # cos²(π/2) is ~0: clipped
    shifted = cosine_alpha_bar(torch.tensor([0.0, 0.5], dtype=torch.float64), s=0.008)
    assert shifted[0] == 1.0 and 0.48 < shifted[1] < 0.5  # the offset only slows the start


def test_pca_embeddings_known_answer():
    """Rows m ± 3u, m ± 2u, m ± w with orthonormal u = (0.8, 0, 0.6), w = (0, 1, 0): the
    principal axes are u (variance 26/6) and w (2/6), each signed so that its largest loading
    is positive (LAPACK returns −u and −w here); every row then projects on one axis only,
    to ±√2 after the rescaling to norm √2."""
    mean = torch.tensor([5.0, -2.0, 1.0])
    u, w = torch.tensor([0.8, 0.0, 0.6]), torch.tensor([0.0, 1.0, 0.0])
    table = mean + torch.stack([3 * u, -3 * u, 2 * u, -2 * u, w, -w])
    backbone = SimpleNamespace(vocab_size=6, width=3, device=torch.device("cpu"), embed=lambda ids: table[ids])
    r = math.sqrt(2)
    expected = torch.tensor([[r, 0], [-r, 0], [r, 0], [-r, 0], [0, r], [0, -r]])
    torch.testing.assert_close(pca_embeddings(backbone, 2, "sed", torch.arange(6)), expected, atol=1e-6, rtol=0)
    with pytest.raises(DihalError, match="sed: embed_dim must be in 1..3"):
        pca_embeddings(backbone, 4, "sed", torch.arange(6))


def test_pca_embeddings_fit_the_given_rows_only():
    """Rows 0-3 vary along u only, rows 4-5 along w only: the PCA of rows 0..3 has the single
    axis u, whatever the other rows hold, and returns their rows in the order asked."""
    u, w = torch.tensor([0.6, 0.8, 0.0]), torch.tensor([0.0, 0.0, 1.0])
    table = torch.stack([3 * u, -3 * u, u, -u, 50 * w, -50 * w])
    backbone = SimpleNamespace(vocab_size=6, width=3, device=torch.device("cpu"), embed=lambda ids: table[ids])
    projected = pca_embeddings(backbone, 1, "sed", torch.tensor([0, 1, 2, 3]))
    torch.testing.assert_close(projected, torch.tensor([[1.0], [-1.0], [1.0], [-1.0]]), atol=1e-6, rtol=0)


# -- the baseline -----------------------------------------------------------------------


def test_registers_under_its_name():
    registered = {}
    register_baselines(lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["sed"][0] is SED
    assert "Strudel et al. 2022" in registered["sed"][1]["description"]
    # the detached-readout variant is a row of its own, SED with one default changed
    variant = registered["sed-detached-readout"][0]
    assert variant is SEDDetachedReadout and issubclass(variant, SED) and variant.name == "sed-detached-readout"
    changed = {field.name for field in dataclasses.fields(variant.options_class)
               if getattr(variant.options_class(), field.name) != getattr(SED.options_class(), field.name)}
    assert changed == {"detach_readout"}


def test_fixed_embeddings_and_readout_initialised_to_their_transpose(llama_backbone, corpus):
    model = SED(llama_backbone, overfit_budget(), **TINY)
    model.build(CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size))
    torch.testing.assert_close(model.embeddings.norm(dim=-1), torch.full((12,), math.sqrt(8)))  # 12 distinct tokens
    readout = model.parts["readout"].weight
    assert torch.equal(readout, model.embeddings)  # weight = Rᵀ = E
    assert readout.requires_grad
    assert all(p is not model.embeddings for p in model.module().parameters())


def test_loss_decreases(trained):
    _, result = trained
    first, last = sum(result.losses[:20]) / 20, sum(result.losses[-20:]) / 20
    assert last < 0.3 * first


def test_overfit_model_regenerates_the_training_sentences(trained, llama_backbone):
    model, _ = trained
    texts = llama_backbone.tokenizer.batch_decode(model.sample(16, 8, seed=0, batch_size=8))
    assert set(texts) == set(SENTENCES)  # every sample is a training sentence, and both occur


def test_sampling_is_reproducible_from_the_seed(trained):
    model, _ = trained
    first = model.sample(5, 8, seed=3, batch_size=2)
    assert first.shape == (5, 8) and first.dtype == torch.long
    assert torch.equal(first, model.sample(5, 8, seed=3, batch_size=2))
    assert not torch.equal(model.sample(16, 8, seed=3), model.sample(16, 8, seed=4))


def test_sampling_conditions_each_step_on_the_previous_estimate(trained):
    model, _ = trained
    calls, handle = denoiser_calls(model)
    try:
        model.sample(2, 8, seed=0)
    finally:
        handle.remove()
    assert len(calls) == 50
    assert not calls[0][0][..., 8:].any()  # no estimate yet: zeros
    for (_, before), (after, _) in itertools.pairwise(calls):
        assert torch.equal(after[..., 8:], before)


def test_training_self_conditions_with_the_given_probability(llama_backbone, corpus):
    vocabulary = CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size)
    batch = {"ids": vocabulary.to_compact(corpus[:4])}
    always = SED(llama_backbone, overfit_budget(), **TINY, self_condition=1.0)
    always.build(vocabulary)
    calls, _ = denoiser_calls(always)
    always.loss(batch, torch.Generator().manual_seed(0))
    assert len(calls) == 2
    (_, first), (second_input, second) = calls
    assert not first.requires_grad and second.requires_grad  # the first pass is under stop-gradient
    assert torch.equal(second_input[..., 8:], first)

    never = SED(llama_backbone, overfit_budget(), **TINY, self_condition=0.0)
    never.build(vocabulary)
    calls, _ = denoiser_calls(never)
    never.loss(batch, torch.Generator().manual_seed(0))
    assert len(calls) == 1 and not calls[0][0][..., 8:].any()


def test_detached_readout_trains_the_readout_but_sends_no_gradient_into_the_denoiser(llama_backbone, corpus):
    """Hypothesis (a) of issue 20: with ``detach_readout`` the cross-entropy's gradient reaches R
    only, so x̂₀ is trained by the squared error alone; without it, the denoiser gets both."""
    vocabulary = CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size)
    batch = {"ids": vocabulary.to_compact(corpus[:4])}
    gradients = {}
    for detach in (False, True):
        model = SED(llama_backbone, overfit_budget(), **TINY, self_condition=0.0, detach_readout=detach)
        model.build(vocabulary)
        terms = model.loss_terms(batch, torch.Generator().manual_seed(0))
        denoiser = list(model.parts["denoiser"].parameters())
        into_denoiser = torch.autograd.grad(terms["readout"], denoiser, allow_unused=True, retain_graph=True)
        into_readout = torch.autograd.grad(terms["readout"], model.parts["readout"].weight)[0]
        gradients[detach] = ([g for g in into_denoiser if g is not None], into_readout)
        torch.testing.assert_close(model.loss(batch, torch.Generator().manual_seed(0)), sum(terms.values()))
    assert not gradients[True][0]  # no path from the cross-entropy back to the denoiser
    assert any(g.abs().sum() > 0 for g in gradients[False][0])
    # the same x̂₀ either way (same init, same draws): R's gradient does not depend on the detach
    torch.testing.assert_close(gradients[True][1], gradients[False][1])


def test_clamping_moves_each_step_towards_the_nearest_fixed_row(trained):
    """With ``clamp`` the first reverse step moves from x₁ towards the nearest row of E to x̂₀, not
    towards x̂₀ itself: replayed by hand from the same generator draws."""
    model, _ = trained
    table = model.embeddings
    ids = torch.tensor([[3, 4, 7], [0, 3, 1]])
    nudged = table[ids] + 0.01 * torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.nearest_row(nudged), table[ids])

    def second_input(clamp: bool) -> tuple[Tensor, Tensor]:
        original = model.settings
        model.settings = dataclasses.replace(original, clamp=clamp)
        calls, handle = denoiser_calls(model)
        try:
            model.sample(2, 8, seed=0)
        finally:
            handle.remove()
            model.settings = original
        return calls[0][1], calls[1][0][..., :8]

    generator = torch.Generator().manual_seed(0)
    x_1, z = torch.randn(2, 8, 8, generator=generator), torch.randn(2, 8, 8, generator=generator)
    alpha_t, alpha_s = cosine_alpha_bar(torch.tensor(1.0)), cosine_alpha_bar(torch.tensor(49 / 50))
    for clamp in (True, False):
        x0_hat, x_s = second_input(clamp)
        target = model.nearest_row(x0_hat) if clamp else x0_hat
        torch.testing.assert_close(x_s, reverse_step(x_1, target, alpha_t, alpha_s, 1.0, z))
    assert not torch.equal(model.nearest_row(x0_hat), x0_hat)


def test_parameter_counts_match_the_optimizer_and_the_backbone_stays_frozen(trained, llama_backbone):
    model, _ = trained
    counts = model.parameter_counts()
    assert counts["readout"] == 12 * 8  # a row per distinct token of the two sentences
    assert sum(counts.values()) == count_trainable(model.module())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())
    assert model.sampling_options() == {"steps": 50, "eta": 1.0, "self_condition": True, "clamp": False,
                                        "vocabulary_size": 12}


def test_allowance_sizes_the_denoiser_over_the_compact_vocabulary(smollm2_sized_backbone):
    model = SED(smollm2_sized_backbone, Budget(param_allowance=SMOLLM2_ALLOWANCE))
    model.build(SMOLLM2_SPLIT_VOCABULARY)
    # d_model 224: 3 blocks 1,815,072 + in/out projections 21,760 + time MLP 100,800 + 64 positions 14,336
    # + norm 448; the readout 32 × 6,252
    assert model.parameter_counts() == {"denoiser": 1_952_416, "readout": 200_064}
    assert abs(model.budget.check_allowance(model.parameter_counts())) < 0.10
    model.build(CompactVocabulary(tuple(range(49_152)), 49_152))  # all ids: the readout leaves d_model 128
    assert model.parameter_counts() == {"denoiser": 648_736, "readout": 1_572_864}


def test_impossible_allowance_names_the_smallest_count(smollm2_sized_backbone):
    model = SED(smollm2_sized_backbone, Budget(param_allowance=1_000_000))
    with pytest.raises(DihalError, match=r"sed .*allowance 1,000,000.* 1,618,336 trainable"):
        model.build(CompactVocabulary(tuple(range(49_152)), 49_152))  # the 32×49,152 readout alone is 1.57M


def test_save_load_round_trip_gives_identical_samples(trained, llama_backbone, tmp_path):
    model, _ = trained
    model.save(tmp_path)
    restored = SED(llama_backbone, overfit_budget(), seed=1, **TINY)  # another init: the weights must come from disk
    restored.load(tmp_path)
    assert torch.equal(restored.parts["readout"].weight, model.parts["readout"].weight)
    assert torch.equal(restored.sample(6, 8, seed=2), model.sample(6, 8, seed=2))


def test_sampling_needs_training_or_a_checkpoint(llama_backbone, tmp_path):
    model = SED(llama_backbone, overfit_budget(), **TINY)
    with pytest.raises(DihalError, match="not trained"):
        model.sample(2, 8, seed=0)
    with pytest.raises(DihalError, match="no trained checkpoint"):
        model.load(tmp_path / "missing")


@pytest.mark.parametrize("method", ["sed", "diffusion-lm"])
def test_rotary_positions_replace_the_position_table_and_change_nothing_else(method, llama_backbone, corpus):
    """``positions = "rotary"`` (issue 20's diagnosis of MDLM, tried on the continuous denoisers):
    no position table, the same blocks' parameters, so the count falls by exactly max_len × d_model;
    the default is the learned table, drawn exactly as an explicit ``positions = "learned"``."""
    from dihal_builtin.baselines.diffusion_lm import DiffusionLM

    cls = {"sed": SED, "diffusion-lm": DiffusionLM}[method]
    vocabulary = CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size)
    built = {}
    for positions in ("learned", "rotary"):
        model = cls(llama_backbone, overfit_budget(), seed=0, **TINY, positions=positions)
        model.build(vocabulary)
        built[positions] = model.parts["denoiser"]
    learned, rotary = built["learned"], built["rotary"]
    assert not hasattr(rotary, "position") and learned.position.weight.shape == (8, TINY["d_model"])
    assert (sum(p.numel() for p in learned.parameters()) - sum(p.numel() for p in rotary.parameters())
            == 8 * TINY["d_model"])
    default = cls(llama_backbone, overfit_budget(), seed=0, **TINY)
    default.build(vocabulary)
    for (name, weight), (_, same) in zip(learned.state_dict().items(), default.parts["denoiser"].state_dict().items()):
        assert torch.equal(weight, same), name
    x = torch.randn(3, 8, learned.in_proj.in_features)
    assert rotary(x, torch.rand(3)).shape == (3, 8, TINY["embed_dim"])
    with pytest.raises(DihalError, match="positions must be one of rotary, learned"):
        cls(llama_backbone, overfit_budget(), **TINY, positions="alibi")
    with pytest.raises(DihalError, match="multiple of 4 .heads 2, an even width each"):
        cls(llama_backbone, overfit_budget(), **{**TINY, "d_model": 34}, positions="rotary")
