"""The compact vocabulary: its id maps, its file form, and the diffusion baselines built over it,
which read and write only the tokens of their training sequences, never a special one."""

from __future__ import annotations

import json

import pytest
import torch
from dihal_builtin.baselines.codar import CoDAR
from dihal_builtin.baselines.common import CompactVocabulary
from dihal_builtin.baselines.diffusion_lm import DiffusionLM
from dihal_builtin.baselines.ld4lg import LD4LG
from dihal_builtin.baselines.sed import SED

from dihal_bench.api.baseline import CONFIG_FILE
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget

#: 10 of the tiny backbone's 128 ids; 1 is the character tokenizer's <eos>, a special token
USED_IDS = [1, 5, 17, 30, 44, 58, 71, 88, 99, 102]
EOS = 1
BUDGET = Budget(steps=4, batch_size=8, seq_len=8, lr=3e-3, seed=0)
#: the four baselines with vocabulary-sized tables, each at a tiny size and 5 sampling steps
TINY = {
    DiffusionLM: {"embed_dim": 8, "d_model": 32, "layers": 1, "heads": 2, "steps": 5},
    SED: {"embed_dim": 8, "d_model": 32, "layers": 1, "heads": 2, "steps": 5},
    LD4LG: {"d_model": 32, "heads": 2, "latents": 2, "latent_dim": 8, "compressor_layers": 1, "decoder_layers": 1,
            "denoiser_layers": 1, "negatives": 4, "steps": 5},
    CoDAR: {"embed_dim": 8, "d_model": 32, "heads": 2, "denoiser_layers": 1, "decoder_layers": 1, "negatives": 4,
            "steps": 5},
}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sequences() -> torch.Tensor:
    """(32, 8) token ids drawn uniformly from USED_IDS: every one of them occurs."""
    draws = torch.randint(len(USED_IDS), (32, 8), generator=torch.Generator().manual_seed(0))
    sequences = torch.tensor(USED_IDS)[draws]
    assert set(sequences.flatten().tolist()) == set(USED_IDS)
    return sequences


# -- the id maps --------------------------------------------------------------------------


def test_ids_are_the_sorted_tokens_present_whatever_their_order(sequences):
    vocabulary = CompactVocabulary.from_sequences(sequences, 128)
    assert vocabulary.ids == tuple(USED_IDS) and len(vocabulary) == 10
    assert CompactVocabulary.from_sequences(sequences.flip(0).T, 128) == vocabulary


def test_the_id_maps_round_trip(sequences):
    vocabulary = CompactVocabulary.from_sequences(sequences, 128)
    compact = vocabulary.to_compact(sequences)
    assert compact.shape == sequences.shape and compact.min() == 0 and compact.max() == 9
    assert torch.equal(vocabulary.to_full(compact), sequences)
    every = torch.arange(10)
    assert torch.equal(vocabulary.to_compact(vocabulary.to_full(every)), every)
    assert torch.equal(vocabulary.to_full(every), torch.tensor(USED_IDS))


def test_ids_outside_the_vocabulary_are_refused(sequences):
    vocabulary = CompactVocabulary.from_sequences(sequences, 128)
    with pytest.raises(DihalError, match="token id 6 is not in the compact vocabulary"):
        vocabulary.to_compact(torch.tensor([[5, 6]]))
    with pytest.raises(DihalError, match=r"token ids must lie in 0..127, got 5..128"):
        vocabulary.to_compact(torch.tensor([5, 128]))
    with pytest.raises(DihalError, match=r"compact ids must lie in 0..9, got 0..10"):
        vocabulary.to_full(torch.tensor([0, 10]))
    with pytest.raises(DihalError, match="token id 200, outside the backbone's vocabulary 0..127"):
        CompactVocabulary.from_sequences(torch.tensor([[3, 200]]), 128)
    with pytest.raises(DihalError, match="no training tokens"):
        CompactVocabulary.from_sequences(torch.zeros(0, 8, dtype=torch.long), 128)


def test_positions_are_the_compact_ids_of_the_covered_tokens(sequences):
    vocabulary = CompactVocabulary.from_sequences(sequences, 128)
    assert vocabulary.positions([102, 0, 1, 2, 300, 1]) == [0, 9]  # 0, 2 and 300 are not covered


def test_the_file_form_round_trips_and_bad_ones_are_refused(sequences):
    vocabulary = CompactVocabulary.from_sequences(sequences, 128)
    written = json.loads(json.dumps(vocabulary.to_dict()))
    assert written == {"full_size": 128, "ids": USED_IDS}
    assert CompactVocabulary.from_dict(written, "saved.json") == vocabulary
    for bad in (None, {"ids": USED_IDS}, {"full_size": 128, "ids": [1, "5"]}, {"full_size": 128, "ids": [True]}):
        with pytest.raises(DihalError, match="saved.json holds no compact vocabulary"):
            CompactVocabulary.from_dict(bad, "saved.json")
    for bad_ids in ([5, 5], [5, 3], [], [-1, 3], [3, 128]):
        with pytest.raises(DihalError, match="saved.json: a compact vocabulary needs"):
            CompactVocabulary.from_dict({"full_size": 128, "ids": bad_ids}, "saved.json")


# -- the baselines over it ---------------------------------------------------------------


@pytest.mark.parametrize("cls", list(TINY), ids=lambda cls: cls.name)
def test_a_baseline_emits_only_the_non_special_tokens_it_was_trained_on(cls, llama_backbone, sequences,
                                                                         char_tokenizer):
    assert char_tokenizer.eos_token_id == EOS
    model = cls(llama_backbone, BUDGET, seed=0, **TINY[cls])
    model.fit(sequences, progress=False)
    assert model.sampling_options()["vocabulary_size"] == 10
    # barely trained: its choices spread over the vocabulary, so a wrong map would show
    emitted = set(model.sample(16, 8, seed=0, batch_size=8).flatten().tolist())
    assert emitted <= set(USED_IDS) - {EOS} and len(emitted) > 1


def test_the_vocabulary_is_saved_with_the_model_and_required_to_load(llama_backbone, sequences, tmp_path):
    model = DiffusionLM(llama_backbone, BUDGET, seed=0, **TINY[DiffusionLM])
    model.fit(sequences, progress=False)
    model.save(tmp_path)
    config = tmp_path / CONFIG_FILE
    saved = json.loads(config.read_text())
    assert saved["vocabulary"] == {"full_size": 128, "ids": USED_IDS}
    del saved["vocabulary"]  # as a checkpoint of the full-vocabulary version
    config.write_text(json.dumps(saved))
    with pytest.raises(DihalError, match=f"{CONFIG_FILE} holds no compact vocabulary"):
        DiffusionLM(llama_backbone, BUDGET, seed=0, **TINY[DiffusionLM]).load(tmp_path)


def test_building_needs_a_vocabulary_of_this_backbone_with_some_text(llama_backbone, tmp_path):
    model = SED(llama_backbone, BUDGET, **TINY[SED])
    with pytest.raises(DihalError, match="sed: a vocabulary of a 256-token backbone"):
        model.build(CompactVocabulary((3, 4), 256))
    with pytest.raises(DihalError, match="sed: the training sequences hold only special tokens"):
        model.build(CompactVocabulary((0, 1, 2), 128))  # <pad>, <eos>, <unk>
    with pytest.raises(DihalError, match="sed: not built yet"):
        model.save(tmp_path)  # nothing to save before it is built
    assert not any(tmp_path.iterdir())


def test_a_built_model_refuses_training_tokens_outside_its_vocabulary(llama_backbone, sequences):
    model = DiffusionLM(llama_backbone, BUDGET, **TINY[DiffusionLM])
    model.build(CompactVocabulary((5, 17), 128))
    with pytest.raises(DihalError, match="token id 44 is not in the compact vocabulary"):
        model.fit(sequences, progress=False)
