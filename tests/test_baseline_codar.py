"""CoDAR on a tiny random-weight Llama backbone: joint training overfits two sentences, the
decoder turns denoised sequences back into them, and the contract's bookkeeping holds."""

from __future__ import annotations

import math

import pytest
import torch
from dihal_builtin.baselines.codar import CoDAR, CoDARNoiseInput, register_baselines
from dihal_builtin.baselines.common import CompactVocabulary

from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

SENTENCES = ["cats nap", "dogs run"]  # 8 characters, 8 tokens each
# temperature 0: the decoder is then a function of the denoised sequence, so which sentence comes
# out is decided by the diffusion alone
TINY = {"embed_dim": 8, "d_model": 32, "heads": 2, "denoiser_layers": 2, "decoder_layers": 1, "steps": 10,
        "temperature": 0.0}
STEPS = 300
BUDGET = Budget(steps=STEPS, batch_size=8, seq_len=8, lr=3e-3, epochs=STEPS)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def corpus(encode_sentences) -> torch.Tensor:
    """The two sentences, eight times each: (16, 8) token ids."""
    return encode_sentences(SENTENCES, copies=8)


@pytest.fixture(scope="module")
def trained(llama_backbone, corpus, one_torch_thread):
    """(model, its TrainResult), trained once for the module."""
    model = CoDAR(llama_backbone, BUDGET, seed=0, **TINY)
    return model, model.fit(corpus, progress=False)


@pytest.fixture(scope="module")
def vocabulary(corpus, llama_backbone) -> CompactVocabulary:
    """The 12 distinct tokens of the two sentences."""
    return CompactVocabulary.from_sequences(corpus, llama_backbone.vocab_size)


def test_the_diffusion_space_is_the_pca_table_at_norm_sqrt_d(llama_backbone, vocabulary):
    model = CoDAR(llama_backbone, BUDGET, **TINY)
    model.build(vocabulary)
    assert model.embeddings.shape == (12, 8) and model.table.shape == (12, llama_backbone.width)
    torch.testing.assert_close(model.embeddings.norm(dim=-1), torch.full((12,), math.sqrt(8)))
    # the decoder's table: the backbone's own embedding rows of the vocabulary's tokens
    torch.testing.assert_close(model.table, llama_backbone.embed(vocabulary.full_ids[None])[0])


def test_joint_loss_falls_from_chance(trained):
    _, result = trained
    assert len(result.losses) == STEPS
    # the MSE (≈1 per dimension) plus a near-uniform cross-entropy over the 12 tokens, ≈ log 12, with slack
    assert result.losses[0] > 1.0 + math.log(6)
    assert sum(result.losses[-20:]) / 20 < 0.15


def test_samples_regenerate_the_training_sentences(trained, char_tokenizer):
    model, _ = trained
    texts = char_tokenizer.batch_decode(model.sample(12, 8, seed=3, batch_size=5))
    assert set(texts) == set(SENTENCES)  # every sample is one of them, and both modes are found


def test_sampling_is_reproducible_from_the_seed(trained):
    model, _ = trained
    first = model.sample(6, 8, seed=7)
    assert first.dtype == torch.long and first.shape == (6, 8)
    assert torch.equal(first, model.sample(6, 8, seed=7))


def test_save_load_round_trip_gives_identical_samples(trained, llama_backbone, tmp_path):
    model, _ = trained
    model.save(tmp_path)
    restored = CoDAR(llama_backbone, BUDGET, seed=0, **TINY)
    with pytest.raises(DihalError, match="not trained"):
        restored.sample(2, 8, seed=0)
    restored.load(tmp_path)
    assert restored.vocabulary == model.vocabulary
    assert torch.equal(restored.sample(6, 8, seed=5), model.sample(6, 8, seed=5))


def test_missing_checkpoint_is_refused(llama_backbone, tmp_path):
    with pytest.raises(DihalError, match="no trained checkpoint"):
        CoDAR(llama_backbone, BUDGET, **TINY).load(tmp_path)


def test_parameter_counts_match_what_the_optimizer_updates(llama_backbone, vocabulary):
    model = CoDAR(llama_backbone, BUDGET, **TINY)
    model.build(vocabulary)
    counts = model.parameter_counts()
    assert set(counts) == {"denoiser", "decoder"}
    assert sum(counts.values()) == count_trainable(model.module())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())


def test_allowance_sets_the_width(llama_backbone, vocabulary):
    allowance = 100_000
    model = CoDAR(llama_backbone, BUDGET.replace(param_allowance=allowance), **{**TINY, "d_model": None})
    model.build(vocabulary)
    assert abs(sum(model.parameter_counts().values()) - allowance) <= 0.1 * allowance
    with pytest.raises(DihalError, match="smallest configuration"):
        CoDAR(llama_backbone, BUDGET.replace(param_allowance=1_000), **{**TINY, "d_model": None})


def test_bad_options_are_refused(llama_backbone):
    with pytest.raises(DihalError, match="embed_dim must be in 1..32"):
        CoDAR(llama_backbone, BUDGET, **{**TINY, "embed_dim": 33})
    with pytest.raises(DihalError, match="temperature"):
        CoDAR(llama_backbone, BUDGET, **{**TINY, "temperature": -1.0})
    with pytest.raises(DihalError, match="unknown option"):
        CoDAR(llama_backbone, BUDGET, clamp=True)


def test_sampling_options_report_the_decoder_knobs(llama_backbone, vocabulary):
    model = CoDAR(llama_backbone, BUDGET, **{**TINY, "temperature": 0.7, "top_p": 0.9})
    model.build(vocabulary)
    assert model.sampling_options() == {"steps": 10, "eta": 1.0, "temperature": 0.7, "top_p": 0.9,
                                        "vocabulary_size": 12, "decoder_input": "denoised"}
    assert CoDAR.token_sampling_options == ("temperature", "top_p")


def test_a_checkpoint_samples_at_another_temperature(trained, llama_backbone, tmp_path):
    """Temperature and steps shape sampling only: a model trained under others loads."""
    model, _ = trained
    model.save(tmp_path)
    warm = CoDAR(llama_backbone, BUDGET, seed=0, **{**TINY, "temperature": 1.0, "steps": 20})
    warm.load(tmp_path)
    assert warm.sampling_options()["temperature"] == 1.0 and warm.steps == 20
    with pytest.raises(DihalError, match="holds 'codar' with options"):
        CoDAR(llama_backbone, BUDGET, seed=0, **{**TINY, "negatives": 8}).load(tmp_path)


# -- the noise-input control ------------------------------------------------------------


@pytest.fixture
def control(trained, llama_backbone, tmp_path) -> CoDARNoiseInput:
    """The control row loaded from the trained CoDAR's checkpoint (decoder_input shapes sampling only)."""
    trained[0].save(tmp_path)
    loaded = CoDARNoiseInput(llama_backbone, BUDGET, seed=0, **TINY)
    loaded.load(tmp_path)
    assert loaded.sampling_options()["decoder_input"] == "noise"
    return loaded


def test_the_noise_input_decoder_reads_the_chains_starting_draw_and_samples_otherwise(trained, control,
                                                                                      monkeypatch):
    """The control's decoder reads exactly the x₁ ~ N(0, I) that CoDAR's chain of the same seed starts
    from, and its samples differ from CoDAR's."""
    read = []
    generate = control.parts["decoder"].generate

    def recording(memory, *args, **kwargs):
        read.append(memory)
        return generate(memory, *args, **kwargs)

    monkeypatch.setattr(control.parts["decoder"], "generate", recording)
    noise_samples = control.sample(4, 8, seed=5, batch_size=4)
    x1 = torch.randn((4, 8, TINY["embed_dim"]), generator=torch.Generator().manual_seed(5))
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
    """Same seed, same training, same weights: the control's decoder is CoDAR's own."""
    short = BUDGET.replace(steps=4, epochs=4)
    weights = []
    for cls in (CoDAR, CoDARNoiseInput):
        model = cls(llama_backbone, short, seed=0, **TINY)
        model.fit(corpus, progress=False)
        weights.append(model.module().state_dict())
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    with pytest.raises(DihalError, match="decoder_input must be one of denoised, noise"):
        CoDAR(llama_backbone, BUDGET, **TINY, decoder_input="zeros")
    with pytest.raises(DihalError, match="noise-input control"):
        CoDARNoiseInput(llama_backbone, BUDGET, **TINY, decoder_input="denoised")


def test_registers_under_its_name():
    registered = {}
    register_baselines(register=lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["codar"][0] is CoDAR and registered["codar"][1]["description"]
    assert registered["codar-noise-input"][0] is CoDARNoiseInput and CoDARNoiseInput.name == "codar-noise-input"
