"""ar-scratch: a causal transformer from scratch on the compact vocabulary. Its loss against a hand
computation, its causality and key/value cache against the full forward pass, and the baseline
contract on a tiny random-weight backbone."""

from __future__ import annotations

import math

import pytest
import torch
from dihal_builtin.baselines.ar_scratch import ARScratch, CausalLM, register_baselines
from dihal_builtin.baselines.common import CompactVocabulary
from torch import nn

from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

SENTENCE = "cats run"  # 8 characters: 8 tokens of the character tokenizer, all distinct
TINY = {"d_model": 32, "layers": 2, "heads": 2}
# the diagnostic suite's allowance on SmolLM2 (the DiHAL bridge's size at width 576)
DIAGNOSTIC_ALLOWANCE = 2_618_240
# the 6,252 of SmolLM2's 49,152 token ids that a stdlib-docs training split holds (issue #10)
SMOLLM2_SPLIT_VOCABULARY = CompactVocabulary(tuple(range(0, 6252 * 7, 7)), 49_152)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def window_budget(steps: int, checkpoint_every: int = 50) -> Budget:
    return Budget(steps=steps, batch_size=8, seq_len=8, lr=3e-3, epochs=steps, seed=0,
                  checkpoint_every=checkpoint_every)


@pytest.fixture(scope="module")
def window(encode_sentences) -> torch.Tensor:
    """The sentence 8 times: (8, 8) token ids."""
    return encode_sentences([SENTENCE], copies=8)


@pytest.fixture(scope="module")
def trained(llama_backbone, window, one_torch_thread) -> ARScratch:
    """ar-scratch overfit to the one window."""
    model = ARScratch(llama_backbone, window_budget(100), seed=0, **TINY)
    model.fit(window, progress=False)
    return model


def random_lm(seed: int = 0) -> CausalLM:
    torch.manual_seed(seed)
    lm = CausalLM(vocab_size=11, d_model=16, layers=2, heads=2, max_len=6, dropout=0.0).eval()
    with torch.no_grad():  # O(1) embeddings, so that every position moves the logits visibly
        lm.token.weight.normal_()
        lm.position.weight.normal_()
        lm.start.normal_()
    return lm


# -- the network ------------------------------------------------------------------------------


def test_loss_is_the_mean_next_token_cross_entropy_by_hand(llama_backbone, window):
    """A stand-in network whose logits give the target token probability 1/2 at even positions
    and 1/4 at odd ones: the loss is the mean of −log p, (log 2 + log 4)/2, and the network was
    fed each window without its last token."""
    model = ARScratch(llama_backbone, window_budget(1), **TINY)
    model.build(CompactVocabulary.from_sequences(window, llama_backbone.vocab_size))
    ids = model.training_data(window[:2])["ids"]
    seen = []

    class StandIn(nn.Module):
        def forward(self, previous):
            seen.append(previous)
            target_probability = torch.tensor([0.5, 0.25] * 4)[None, :, None]
            # the target gets p, the other 7 tokens (1 − p)/7 each
            probs = ((1 - target_probability) / 7).expand(2, 8, 8).clone()
            probs.scatter_(-1, ids[..., None], target_probability.expand(2, 8, 1))
            return probs.log()

    model.parts["decoder"] = StandIn()
    loss = model.loss({"ids": ids}, torch.Generator().manual_seed(0))
    assert loss.item() == pytest.approx((math.log(2) + math.log(4)) / 2, rel=1e-6)
    assert torch.equal(seen[0], ids[:, :-1])


def test_each_prediction_reads_earlier_tokens_only():
    lm = random_lm()
    previous = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(0))
    logits = lm(previous)
    assert logits.shape == (3, 6, 11)
    changed = previous.clone()
    changed[:, 2] = (changed[:, 2] + 1) % 11  # token 2 may move only the predictions of tokens 3..5
    moved = (lm(changed) - logits).abs().amax(dim=(0, 2))
    assert moved[:3].max() == 0 and moved[3:].min() > 1e-3


def test_cached_steps_give_the_full_forward_logits():
    """One position at a time through the key/value cache: the same logits as the full causal pass,
    to float32 rounding of a different summation order."""
    lm = random_lm()
    previous = torch.randint(0, 11, (3, 5), generator=torch.Generator().manual_seed(1))
    full = lm(previous)
    with torch.no_grad():
        cache = [(torch.empty(0), torch.empty(0)) for _ in lm.blocks]
        stepped = [lm.step(lm.inputs(previous[:, :0]), cache)]
        for position in range(5):
            stepped.append(lm.step(lm.inputs(previous[:, position:position + 1], offset=position + 1), cache))
    torch.testing.assert_close(torch.stack(stepped, dim=1), full, atol=1e-5, rtol=1e-5)


# -- the baseline ----------------------------------------------------------------------------


def test_registers_under_its_name():
    registered = {}
    register_baselines(lambda name, obj, **meta: registered.update({name: (obj, meta)}))
    assert registered["ar-scratch"][0] is ARScratch
    assert ARScratch.steps_option is None and ARScratch.token_sampling_options == ("temperature", "top_p")


def test_allowance_sizes_the_network_within_ten_percent(smollm2_sized_backbone):
    model = ARScratch(smollm2_sized_backbone, Budget(param_allowance=DIAGNOSTIC_ALLOWANCE))
    with pytest.raises(DihalError, match="not built yet"):
        model.parameter_counts()  # its table's size comes from the training sequences
    model.build(SMOLLM2_SPLIT_VOCABULARY)
    counts = model.parameter_counts()
    assert abs(model.budget.check_allowance(counts)) <= 0.10
    assert model.lm.token.weight.shape[0] == 6252
    assert sum(counts.values()) == count_trainable(model.module())


def test_overfit_window_is_sampled_back(trained, llama_backbone, tmp_path):
    """Greedy, so that the tokens are the model's choice, not the luck of a tail draw."""
    trained.save(tmp_path)
    greedy = ARScratch(llama_backbone, window_budget(100), seed=0, **TINY, temperature=0.0)
    greedy.load(tmp_path)
    assert llama_backbone.tokenizer.batch_decode(greedy.sample(4, 8, seed=0)) == [SENTENCE] * 4


def test_resume_is_bitwise_identical(llama_backbone, window, tmp_path):
    budget = window_budget(12, checkpoint_every=4)
    uninterrupted = ARScratch(llama_backbone, budget, seed=0, **TINY)
    reference = uninterrupted.fit(window, progress=False)

    class Killed(Exception):
        pass

    killed = ARScratch(llama_backbone, budget, seed=0, **TINY)
    steps = []
    original = killed.loss

    def dies_at_step_6(batch, generator):
        steps.append(1)
        if len(steps) == 7:
            raise Killed
        return original(batch, generator)

    killed.loss = dies_at_step_6
    with pytest.raises(Killed):
        killed.fit(window, checkpoint_dir=tmp_path, progress=False)
    resumed = ARScratch(llama_backbone, budget, seed=1, **TINY)  # another init: everything comes from the checkpoint
    result = resumed.fit(window, checkpoint_dir=tmp_path, progress=False)
    assert result.resumed_from_step == 4 and result.losses == reference.losses
    for (name, a), (_, b) in zip(uninterrupted.module().state_dict().items(), resumed.module().state_dict().items()):
        assert torch.equal(a, b), name


def test_samples_hold_no_special_token(llama_backbone, char_tokenizer):
    """Training windows half <eos> (id 1), the first token always: one step of training already
    puts mass on it, yet no sample holds it."""
    rows = torch.randint(3, 30, (16, 8), generator=torch.Generator().manual_seed(0))
    rows[:, ::2] = char_tokenizer.eos_token_id
    model = ARScratch(llama_backbone, window_budget(1), seed=0, **TINY)
    model.fit(rows, progress=False)
    samples = model.sample(16, 8, seed=0)
    assert not set(samples.flatten().tolist()) & set(char_tokenizer.all_special_ids)
    model.banned = []
    assert (model.sample(16, 8, seed=0) == char_tokenizer.eos_token_id).any()  # it would, unbanned


def test_sampling_is_reproducible_and_survives_save_and_load(trained, llama_backbone, tmp_path):
    first = trained.sample(5, 8, seed=3, batch_size=2)
    assert first.shape == (5, 8) and torch.equal(first, trained.sample(5, 8, seed=3, batch_size=2))
    trained.save(tmp_path)
    restored = ARScratch(llama_backbone, window_budget(100), seed=1, **TINY)
    restored.load(tmp_path)
    assert restored.vocabulary == trained.vocabulary
    assert torch.equal(restored.sample(5, 8, seed=3, batch_size=2), first)
    assert trained.sampling_options() == {"temperature": 1.0, "top_p": 1.0, "kv_cache": True, "vocabulary_size": 8}


def test_rejects_bad_options(llama_backbone, trained):
    for options, message in [({"d_model": 30, "heads": 4}, "multiple of heads"), ({"temperature": -1.0}, "temperature"),
                             ({"layers": 0}, "at least 1"), ({"steps": 3}, "unknown option")]:
        with pytest.raises(DihalError, match=message):
            ARScratch(llama_backbone, window_budget(1), **options)
    with pytest.raises(DihalError, match="positions for 8"):
        trained.sample(1, 9, seed=0)
    with pytest.raises(DihalError, match="not trained"):
        ARScratch(llama_backbone, window_budget(1), **TINY).sample(1, 8, seed=0)
