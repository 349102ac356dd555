"""LD4LG on a tiny random-weight Llama backbone: its pieces have the stated properties, the split
training overfits two sentences and regenerates them, and the contract's bookkeeping holds."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from dihal_builtin.baselines.common import (
    CompactVocabulary,
    TokenDecoder,
    sampled_cross_entropy,
)
from dihal_builtin.baselines.ld4lg import (
    LD4LG,
    Compressor,
    LD4LGNoiseInput,
    register_baselines,
    x0_from_v,
)
from dihal_builtin.baselines.schedules import noised

from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

SENTENCES = ["cats nap", "dogs run"]  # 8 characters, 8 tokens each, 12 distinct
# temperature 0: the decoder is then a function of the latents, so which sentence comes out is decided
# by the diffusion alone
TINY = {"d_model": 32, "heads": 2, "latents": 2, "latent_dim": 8, "compressor_layers": 1, "decoder_layers": 1,
        "denoiser_layers": 2, "autoencoder_fraction": 0.2, "steps": 10, "temperature": 0.0}
STEPS = 600  # the autoencoder converges within its 120; the denoiser needs the rest
BUDGET = Budget(steps=STEPS, batch_size=8, seq_len=8, lr=3e-3, epochs=STEPS, checkpoint_every=100)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(encode_sentences) -> torch.Tensor:
    """The two sentences, eight times each: (16, 8) token ids."""
    return encode_sentences(SENTENCES, copies=8)


@pytest.fixture(scope="module")
def trained(llama_backbone, corpus, one_torch_thread, tmp_path_factory):
    """(model, its TrainResult, its checkpoint directory), trained once for the module."""
    directory = tmp_path_factory.mktemp("ld4lg-checkpoints")
    model = LD4LG(llama_backbone, BUDGET, seed=0, **TINY)
    return model, model.fit(corpus, checkpoint_dir=directory, progress=False), directory


# -- the pieces -------------------------------------------------------------------------


def test_sampled_cross_entropy_is_exact_when_every_token_is_scored():
    generator = torch.Generator().manual_seed(0)
    hidden, table = torch.randn(3, 5, 4, generator=generator), torch.randn(20, 4, generator=generator)
    targets = torch.randint(0, 20, (3, 5), generator=generator)
    exact = F.cross_entropy(hidden.reshape(-1, 4) @ table.T, targets.reshape(-1))
    estimate = sampled_cross_entropy(hidden, targets, lambda rows: table[rows], 20, 20, generator)
    torch.testing.assert_close(estimate, exact)


def test_sampled_cross_entropy_weights_the_sampled_remainder():
    """Tokens outside the batch's targets all score 0: any 3 of them, each weighted (V − |U|)/3,
    sum to exactly what all V − |U| contribute, so the estimate equals the full softmax."""
    generator = torch.Generator().manual_seed(1)
    targets = torch.tensor([[0, 1, 1, 2]])
    table = torch.zeros(50, 4)
    table[:3] = torch.randn(3, 4, generator=generator)
    hidden = torch.randn(1, 4, 4, generator=generator)
    exact = F.cross_entropy(hidden.reshape(-1, 4) @ table.T, targets.reshape(-1))
    estimate = sampled_cross_entropy(hidden, targets, lambda rows: table[rows], 50, 3, generator)
    torch.testing.assert_close(estimate, exact)


def test_x0_from_v_inverts_the_v_target():
    generator = torch.Generator().manual_seed(0)
    x0, noise = torch.randn(4, 3, 2, generator=generator), torch.randn(4, 3, 2, generator=generator)
    alpha_bar = torch.tensor([0.01, 0.3, 0.7, 0.99])[:, None, None]
    v = alpha_bar.sqrt() * noise - (1 - alpha_bar).sqrt() * x0
    torch.testing.assert_close(x0_from_v(noised(x0, alpha_bar, noise), alpha_bar, v), x0)


def test_compressor_latents_have_norm_sqrt_latent_dim():
    torch.manual_seed(0)
    compressor = Compressor(width=12, latents=3, latent_dim=5, d_model=16, layers=1, heads=2, max_len=6, dropout=0.0)
    latents = compressor(100 * torch.randn(2, 6, 12))
    assert latents.shape == (2, 3, 5)
    torch.testing.assert_close(latents.norm(dim=-1), torch.full((2, 3), math.sqrt(5)))


def test_token_decoder_samples_with_the_suites_sampler_and_never_a_banned_token():
    """At temperature 1 the decoder draws: another generator seed, other tokens; the same seed,
    the same tokens; at temperature 0 it is greedy, whatever the seed. Banned rows never come out."""
    torch.manual_seed(0)
    decoder = TokenDecoder(width=12, memory_dim=5, memory_len=3, d_model=16, layers=1, heads=2, max_len=16, dropout=0.0)
    table, memory = torch.randn(10, 12), torch.randn(4, 3, 5)

    def draw(temperature: float, seed: int, banned: list[int] | None = None) -> torch.Tensor:
        return decoder.generate(memory, table, 16, temperature, 1.0, torch.Generator().manual_seed(seed), banned)

    assert torch.equal(draw(1.0, 0), draw(1.0, 0)) and not torch.equal(draw(1.0, 0), draw(1.0, 1))
    assert torch.equal(draw(0.0, 0), draw(0.0, 1))
    assert not set(draw(1.0, 2, banned=[0, 3, 7]).flatten().tolist()) & {0, 3, 7}
    assert set(draw(1.0, 2).flatten().tolist()) & {0, 3, 7}  # they would, unbanned (64 draws over 10 rows)


def test_token_decoder_predicts_each_token_from_earlier_tokens_only():
    torch.manual_seed(0)
    decoder = TokenDecoder(width=12, memory_dim=5, memory_len=3, d_model=16, layers=2, heads=2, max_len=6, dropout=0.0)
    previous, memory = torch.randn(2, 5, 12), torch.randn(2, 3, 5)
    hidden = decoder(previous, memory)
    assert hidden.shape == (2, 6, 16)
    changed = previous.clone()
    changed[:, 3] += 1.0  # token 3 may move only the predictions of tokens 4 and 5
    moved = (decoder(changed, memory) - hidden).abs().amax(dim=(0, 2))
    assert moved[:4].max() == 0 and moved[4:].min() > 1e-3
    assert (decoder(previous, memory + 1.0) - hidden).abs().amax() > 1e-3  # the memory is read


# -- training and sampling ------------------------------------------------------------


def test_both_phases_learn_and_share_the_budget(trained):
    model, result, directory = trained
    first = round(model.settings.autoencoder_fraction * STEPS)
    assert result.steps_done == len(result.losses) == STEPS
    assert result.sequences_seen == STEPS * BUDGET.batch_size and result.resumed_from_step is None
    reconstruction, diffusion = result.losses[:first], result.losses[first:]
    assert reconstruction[0] > math.log(6)  # chance over the 12 tokens of the compact vocabulary is log 12
    assert sum(reconstruction[-10:]) / 10 < 0.05  # the two sentences are reconstructed
    assert sum(diffusion[-50:]) / 50 < 0.5 * sum(diffusion[:50]) / 50
    assert {p.name for p in directory.iterdir()} == {"autoencoder", "diffusion"}


def test_samples_regenerate_the_training_sentences(trained, char_tokenizer):
    model, _, _ = trained
    texts = char_tokenizer.batch_decode(model.sample(12, 8, seed=3, batch_size=5))
    assert set(texts) == set(SENTENCES)  # every sample is one of them, and both modes are found


def test_sampling_is_reproducible_from_the_seed(trained):
    model, _, _ = trained
    assert torch.equal(model.sample(6, 8, seed=7), model.sample(6, 8, seed=7))
    assert model.sample(6, 8, seed=7).dtype == torch.long


def test_at_temperature_1_the_seed_decides_the_samples(trained, llama_backbone, tmp_path):
    """The trained model loaded at temperature 1 (temperature shapes sampling only, so the
    checkpoint loads): same seed, same samples; other seeds, other samples."""
    model, _, _ = trained
    model.save(tmp_path)
    sampled = LD4LG(llama_backbone, BUDGET, seed=0, **{**TINY, "temperature": 1.0})
    sampled.load(tmp_path)
    assert sampled.sampling_options() == {"steps": 10, "eta": 1.0, "temperature": 1.0, "top_p": 1.0,
                                          "vocabulary_size": 12, "decoder_input": "denoised"}
    first = sampled.sample(8, 8, seed=11)
    assert torch.equal(first, sampled.sample(8, 8, seed=11))
    assert not torch.equal(first, sampled.sample(8, 8, seed=12))


def test_resuming_a_finished_run_trains_nothing(trained, llama_backbone, corpus):
    model, _, directory = trained
    again = LD4LG(llama_backbone, BUDGET, seed=0, **TINY)
    result = again.fit(corpus, checkpoint_dir=directory, progress=False)
    assert result.resumed_from_step == STEPS and result.wall_seconds < 1.0
    assert torch.equal(again.sample(6, 8, seed=1), model.sample(6, 8, seed=1))


def test_save_load_round_trip_gives_identical_samples(trained, llama_backbone, tmp_path):
    model, _, _ = trained
    model.save(tmp_path)
    restored = LD4LG(llama_backbone, BUDGET, seed=0, **TINY)
    with pytest.raises(DihalError, match="not trained"):
        restored.sample(2, 8, seed=0)
    restored.load(tmp_path)
    assert restored.vocabulary == model.vocabulary
    assert torch.equal(restored.sample(6, 8, seed=5), model.sample(6, 8, seed=5))


def test_missing_checkpoint_and_overlong_samples_are_refused(trained, llama_backbone, tmp_path):
    with pytest.raises(DihalError, match="no trained checkpoint"):
        LD4LG(llama_backbone, BUDGET, **TINY).load(tmp_path)
    with pytest.raises(DihalError, match="positions for 8"):
        trained[0].sample(1, 9, seed=0)


# -- the noise-input control ------------------------------------------------------------


@pytest.fixture
def control(trained, llama_backbone, tmp_path) -> LD4LGNoiseInput:
    """The control row loaded from the trained LD4LG's checkpoint (decoder_input shapes sampling only)."""
    trained[0].save(tmp_path)
    loaded = LD4LGNoiseInput(llama_backbone, BUDGET, seed=0, **TINY)
    loaded.load(tmp_path)
    assert loaded.sampling_options()["decoder_input"] == "noise"
    return loaded


def test_the_noise_input_decoder_reads_the_chains_starting_draw_and_samples_otherwise(trained, control,
                                                                                      monkeypatch):
    """The control's decoder reads exactly the x₁ ~ N(0, I) that LD4LG's chain of the same seed starts
    from, and its samples differ from LD4LG's."""
    read = []
    generate = control.parts["decoder"].generate

    def recording(memory, *args, **kwargs):
        read.append(memory)
        return generate(memory, *args, **kwargs)

    monkeypatch.setattr(control.parts["decoder"], "generate", recording)
    noise_samples = control.sample(4, 8, seed=5, batch_size=4)
    x1 = torch.randn((4, TINY["latents"], TINY["latent_dim"]), generator=torch.Generator().manual_seed(5))
    assert len(read) == 1 and torch.equal(read[0], x1)
    assert not torch.equal(noise_samples, trained[0].sample(4, 8, seed=5, batch_size=4))
    assert torch.equal(noise_samples, control.sample(4, 8, seed=5, batch_size=4))  # same seed, same samples


def test_the_noise_input_control_never_calls_the_denoiser(trained, control, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the denoiser was called")

    for model in (control, trained[0]):
        monkeypatch.setattr(model.parts["denoiser"], "forward", refuse)
    assert control.sample(3, 8, seed=0).shape == (3, 8)
    with pytest.raises(AssertionError, match="denoiser was called"):  # the patch does catch a call
        trained[0].sample(3, 8, seed=0)


def test_the_control_trains_the_same_weights_and_holds_to_its_input(llama_backbone, corpus):
    """Same seed, same training, same weights: the control's decoder is LD4LG's own."""
    short = BUDGET.replace(steps=4, epochs=4)
    weights = []
    for cls in (LD4LG, LD4LGNoiseInput):
        model = cls(llama_backbone, short, seed=0, **TINY)
        model.fit(corpus, progress=False)
        weights.append(model.module().state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    with pytest.raises(DihalError, match="decoder_input must be one of denoised, noise"):
        LD4LG(llama_backbone, BUDGET, **TINY, decoder_input="zeros")
    with pytest.raises(DihalError, match="noise-input control"):
        LD4LGNoiseInput(llama_backbone, BUDGET, **TINY, decoder_input="denoised")


# -- the contract's bookkeeping --------------------------------------------------------


def test_parameter_counts_match_what_the_optimizer_updates(llama_backbone, corpus):
    model = LD4LG(llama_backbone, BUDGET, **TINY)
    model.build(CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size))
    counts = model.parameter_counts()
    assert set(counts) == {"compressor", "decoder", "denoiser"}
    assert sum(counts.values()) == count_trainable(model.module())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())


def test_allowance_sets_the_width(llama_backbone, corpus):
    allowance = 100_000
    model = LD4LG(llama_backbone, BUDGET.replace(param_allowance=allowance), **{**TINY, "d_model": None})
    model.build(CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size))
    total = sum(model.parameter_counts().values())
    assert abs(total - allowance) <= 0.1 * allowance
    assert model.parts["denoiser"].in_proj.out_features % 4 == 0  # a multiple of 2·heads
    with pytest.raises(DihalError, match="smallest configuration"):
        LD4LG(llama_backbone, BUDGET.replace(param_allowance=1_000), **{**TINY, "d_model": None})


def test_bad_options_are_refused(llama_backbone):
    with pytest.raises(DihalError, match="unknown option"):
        LD4LG(llama_backbone, BUDGET, latent_size=8)
    with pytest.raises(DihalError, match="autoencoder_fraction"):
        LD4LG(llama_backbone, BUDGET, **{**TINY, "autoencoder_fraction": 1.0})
    with pytest.raises(DihalError, match="out of range"):
        LD4LG(llama_backbone, BUDGET, **TINY, feature_layer=9)
    with pytest.raises(DihalError, match="top_p"):
        LD4LG(llama_backbone, BUDGET, **{**TINY, "top_p": 1.5})


def test_registers_under_its_name():
    registered = {}
    register_baselines(register=lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["ld4lg"][0] is LD4LG and registered["ld4lg"][1]["description"]
    assert registered["ld4lg-noise-input"][0] is LD4LGNoiseInput and LD4LGNoiseInput.name == "ld4lg-noise-input"
