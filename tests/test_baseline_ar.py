"""The intact-backbone reference on a tiny random-weight Llama: it samples like transformers'
own generate, trains and stores nothing but its configuration, and is flagged outside the budget."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from dihal_builtin.baselines.ar_backbone import ARBackbone, register_baselines
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench.api.baseline import CONFIG_FILE
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

BUDGET = Budget(steps=10, batch_size=4, seq_len=12, param_allowance=1_000)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("bos", [None, "<unk>"])
def test_greedy_samples_are_transformers_greedy_generate_from_the_start_token(tiny_models, char_tokenizer, bos):
    """The start is the BOS token where the tokenizer has one, else EOS (the character tokenizer
    has no BOS; giving it one, any token, must move the start there)."""
    tokenizer = copy.deepcopy(char_tokenizer)
    tokenizer.bos_token = bos
    backbone = HFBackbone(copy.deepcopy(tiny_models["llama"]), tokenizer, "tiny-llama")
    model = ARBackbone(backbone, BUDGET, temperature=0.0)
    start = tokenizer.eos_token_id if bos is None else tokenizer.convert_tokens_to_ids(bos)
    assert model.sampling_options() == {"temperature": 0.0, "top_p": 1.0, "start_token": start}
    ours = model.sample(3, 12, seed=0, batch_size=2)
    theirs = backbone.model.generate(torch.full((3, 1), start), max_new_tokens=12, do_sample=False)
    assert ours.shape == (3, 12) and ours.dtype == torch.long
    assert torch.equal(ours, theirs[:, 1:])  # the start token is not returned


def test_same_seed_gives_same_tokens_and_another_seed_differs(llama_backbone):
    model = ARBackbone(llama_backbone, BUDGET, top_p=0.95)
    first = model.sample(4, 10, seed=11)
    assert torch.equal(first, model.sample(4, 10, seed=11))
    assert not torch.equal(first, model.sample(4, 10, seed=12))


def test_trains_nothing_and_stands_outside_the_budget(llama_backbone):
    model = ARBackbone(llama_backbone, BUDGET)
    before = model.sample(2, 6, seed=1)
    result = model.fit(torch.zeros(1, 12, dtype=torch.long), progress=False)  # far too few sequences: not checked
    assert (result.steps_done, result.losses, result.tokens_seen) == (0, [], 0)
    assert ARBackbone.in_budget is False
    assert model.components() == {} and model.parameter_counts() == {}
    assert count_trainable(model.module()) == 0
    assert torch.equal(model.sample(2, 6, seed=1), before)


def test_save_writes_only_the_configuration_and_load_checks_it(llama_backbone, tmp_path):
    model = ARBackbone(llama_backbone, BUDGET, temperature=0.8)
    model.save(tmp_path / "ar")
    assert [p.name for p in (tmp_path / "ar").iterdir()] == [CONFIG_FILE]
    restored = ARBackbone(llama_backbone, BUDGET, temperature=0.8)
    restored.load(tmp_path / "ar")
    assert torch.equal(restored.sample(2, 6, seed=4), model.sample(2, 6, seed=4))
    # temperature and top_p shape sampling only: the saved configuration serves any of them
    ARBackbone(llama_backbone, BUDGET, temperature=0.5).load(tmp_path / "ar")
    assert ARBackbone.token_sampling_options == ("temperature", "top_p")
    config = tmp_path / "ar" / CONFIG_FILE
    config.write_text(json.dumps({**json.loads(config.read_text()), "name": "sed"}))
    with pytest.raises(DihalError, match="holds 'sed' with options .* not 'ar-backbone' with"):
        restored.load(tmp_path / "ar")
    with pytest.raises(DihalError, match="holds no saved baseline"):
        restored.load(tmp_path / "elsewhere")


def test_bad_options_are_refused(llama_backbone):
    with pytest.raises(DihalError, match="temperature"):
        ARBackbone(llama_backbone, BUDGET, temperature=-0.1)
    with pytest.raises(DihalError, match="top_p"):
        ARBackbone(llama_backbone, BUDGET, top_p=0.0)
    with pytest.raises(DihalError, match="unknown option"):
        ARBackbone(llama_backbone, BUDGET, top_k=5)


def test_registers_under_its_name():
    registered = {}
    register_baselines(register=lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["ar-backbone"][0] is ARBackbone and registered["ar-backbone"][1]["description"]
