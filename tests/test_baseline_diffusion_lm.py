"""The Diffusion-LM baseline and the schedule helpers it uses, on a tiny random-weight backbone."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from dihal_builtin.baselines.common import CompactVocabulary
from dihal_builtin.baselines.diffusion_lm import DiffusionLM, register_baselines
from dihal_builtin.baselines.schedules import noised, reverse_step, sqrt_alpha_bar
from torch import Tensor
from tqdm.auto import tqdm

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
    """(model, training result): Diffusion-LM trained to overfit the two sentences."""
    model = DiffusionLM(llama_backbone, overfit_budget(), seed=0, **TINY)
    result = model.fit(corpus, progress=False)
    return model, result


# -- schedule helpers -------------------------------------------------------------------


def test_sqrt_schedule_known_values():
    alpha = sqrt_alpha_bar(torch.tensor([0.0, 0.25, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(alpha[:3], torch.tensor([0.99, 1 - math.sqrt(0.2501), 1 - math.sqrt(0.5001)],
                                                      dtype=torch.float64))
    assert alpha[3] == 1e-6  # 1 − √1.0001 < 0: clipped, so that √ᾱ and 1/ᾱ stay defined


def test_reverse_step_is_ddim_at_eta_0_and_the_ddpm_posterior_at_eta_1():
    generator = torch.Generator().manual_seed(0)
    x0, eps, z = (torch.randn(3, 5, generator=generator, dtype=torch.float64) for _ in range(3))
    alpha_t, alpha_s = torch.tensor(0.3, dtype=torch.float64), torch.tensor(0.8, dtype=torch.float64)
    x_t = noised(x0, alpha_t, eps)
    # η = 0 with the true x₀ retraces the same ε to time s
    torch.testing.assert_close(reverse_step(x_t, x0, alpha_t, alpha_s, 0.0, z), noised(x0, alpha_s, eps))
    # η = 1: mean and std of q(x_s | x_t, x₀) (Ho et al. 2020, eqs. 6-7)
    alpha_step = alpha_t / alpha_s
    mean = (alpha_s.sqrt() * (1 - alpha_step) * x0 + alpha_step.sqrt() * (1 - alpha_s) * x_t) / (1 - alpha_t)
    std = ((1 - alpha_step) * (1 - alpha_s) / (1 - alpha_t)).sqrt()
    torch.testing.assert_close(reverse_step(x_t, x0, alpha_t, alpha_s, 1.0, torch.zeros_like(z)), mean)
    torch.testing.assert_close(reverse_step(x_t, x0, alpha_t, alpha_s, 1.0, z), mean + std * z)


# -- the baseline -----------------------------------------------------------------------


def test_registers_under_its_name():
    registered = {}
    register_baselines(lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["diffusion-lm"][0] is DiffusionLM
    assert "Li et al. 2022" in registered["diffusion-lm"][1]["description"]


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


def test_parameter_counts_match_the_optimizer_and_the_backbone_stays_frozen(trained, llama_backbone, corpus):
    model, _ = trained
    counts = model.parameter_counts()
    assert counts["embeddings"] == len(set(corpus.flatten().tolist())) * 8  # a row per token of the two sentences
    assert sum(counts.values()) == count_trainable(model.module())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())
    assert model.sampling_options() == {"steps": 50, "eta": 1.0, "clamp": True, "clamp_final": True,
                                        "vocabulary_size": len(set(corpus.flatten().tolist()))}


def test_allowance_sizes_the_denoiser_over_the_compact_vocabulary(smollm2_sized_backbone):
    model = DiffusionLM(smollm2_sized_backbone, Budget(param_allowance=SMOLLM2_ALLOWANCE))
    with pytest.raises(DihalError, match="not built yet"):
        model.parameter_counts()  # its table's size comes from the training sequences
    model.build(SMOLLM2_SPLIT_VOCABULARY)
    # d_model 224: 3 blocks 1,815,072 + in/out projections 14,592 + time MLP 100,800 + 64 positions 14,336
    # + norm 448; the table 6,252 × 32
    assert model.parameter_counts() == {"denoiser": 1_945_248, "embeddings": 200_064}
    assert abs(model.budget.check_allowance(model.parameter_counts())) < 0.10
    # over all 49,152 ids the table would take 1.57M and leave the denoiser d_model 128
    model.build(CompactVocabulary(tuple(range(49_152)), 49_152))
    assert model.parameter_counts() == {"denoiser": 644_640, "embeddings": 1_572_864}
    explicit = DiffusionLM(smollm2_sized_backbone, Budget(param_allowance=SMOLLM2_ALLOWANCE), d_model=64)
    explicit.build(SMOLLM2_SPLIT_VOCABULARY)
    assert explicit.parts["denoiser"].in_proj.out_features == 64


def test_impossible_allowance_names_the_smallest_count(smollm2_sized_backbone):
    model = DiffusionLM(smollm2_sized_backbone, Budget(param_allowance=1_000_000))
    with pytest.raises(DihalError, match=r"diffusion-lm .*allowance 1,000,000.* 1,617,312 trainable"):
        model.build(CompactVocabulary(tuple(range(49_152)), 49_152))  # the 49,152×32 table alone is 1.57M


def test_clamping_maps_to_the_nearest_embedding(trained):
    model, _ = trained
    table = model.parts["embeddings"].weight.detach()
    ids = torch.tensor([[3, 4, 7], [0, 3, 1]])  # compact ids: the two sentences hold 12 distinct tokens
    nudged = table[ids] + 0.01 * torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.nearest_embedding(nudged), table[ids])


def test_tokens_are_read_from_the_clamped_last_estimate(trained):
    """As in the reference code, whose chain ends at t = 0 on the clamped x̂₀: with clamping the
    last estimate is a row of Emb and the tokens are read from it; without ``clamp_final`` the
    same chain (same draws) returns the raw estimate, whose row is the nearest one."""
    model, _ = trained
    table = model.parts["embeddings"].weight.detach()

    def last_estimate(**change) -> Tensor:
        original = model.settings
        model.settings = dataclasses.replace(original, **change)
        try:
            with torch.no_grad(), tqdm(disable=True) as bar:
                return model.final_estimate(3, 8, torch.Generator().manual_seed(5), bar)
        finally:
            model.settings = original

    clamped, raw = last_estimate(), last_estimate(clamp_final=False)
    assert (torch.cdist(clamped.reshape(-1, 8), table).min(-1).values < 1e-5).all()  # every vector is a row
    assert not (torch.cdist(raw.reshape(-1, 8), table).min(-1).values < 1e-5).all()
    torch.testing.assert_close(clamped, model.nearest_embedding(raw), rtol=0, atol=0)
    samples = model.sample(3, 8, seed=5, batch_size=3)
    assert torch.equal(samples, model.built().to_full(model.read_out(clamped)).cpu())


def test_save_load_round_trip_gives_identical_samples(trained, llama_backbone, tmp_path):
    model, _ = trained
    model.save(tmp_path)
    # another init: the weights must come from disk
    restored = DiffusionLM(llama_backbone, overfit_budget(), seed=1, **TINY)
    restored.load(tmp_path)
    assert restored.vocabulary == model.vocabulary
    assert torch.equal(restored.sample(6, 8, seed=2), model.sample(6, 8, seed=2))


def test_sampling_needs_training_or_a_checkpoint(llama_backbone, tmp_path):
    model = DiffusionLM(llama_backbone, overfit_budget(), **TINY)
    with pytest.raises(DihalError, match="not trained"):
        model.sample(2, 8, seed=0)
    with pytest.raises(DihalError, match="no trained checkpoint"):
        model.load(tmp_path / "missing")


def test_rejects_bad_options_and_lengths(trained, llama_backbone):
    with pytest.raises(DihalError, match="unknown option.*embedding_dim"):
        DiffusionLM(llama_backbone, overfit_budget(), embedding_dim=8)
    with pytest.raises(DihalError, match="positions for 8"):
        trained[0].sample(1, 9, seed=0)
