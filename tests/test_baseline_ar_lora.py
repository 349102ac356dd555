"""AR-LoRA: rank and targets from the allowance, a loss equal to the hand-computed next-token
cross-entropy of the intact backbone, a shared backbone that no training or sampling changes, the
baseline contract (resume, checkpoints, samples) and an overfit window sampled back, on a tiny
random-weight Llama."""

from __future__ import annotations

import pytest
import torch
from dihal_builtin.baselines.ar_lora import ARLoRA, register_baselines
from dihal_builtin.baselines.lora import (
    adapter_size,
    choose_adapter,
    decoder_linears,
    target_names,
)
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM

from dihal_bench.api.baseline import WEIGHTS_FILE
from dihal_bench.api.sampling import special_ids
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import count_trainable

SENTENCE = "the cat sat on the mat"  # 22 characters, 22 tokens of the character tokenizer
# the tiny Llama's LoRA count per unit of rank: per layer q 32+32, k 32+16, v 32+16, o 32+32,
# gate 32+64, up 32+64, down 64+32 = 512 over all linear maps, 224 over attention, 112 over q and v
PER_RANK = {"all-linear": 3 * 512, "attention": 3 * 224, "query-value": 3 * 112}
# the diagnostic suite's allowance on SmolLM2 (the DiHAL bridge's size at width 576)
DIAGNOSTIC_ALLOWANCE = 2_618_240
PROBE = torch.tensor([[3 + i for i in range(0, 60, 3)], [90 - i for i in range(20)]])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def window_budget(steps: int, lr: float = 1e-2, checkpoint_every: int = 50) -> Budget:
    return Budget(steps=steps, batch_size=4, seq_len=len(SENTENCE), lr=lr, epochs=steps, warmup_frac=0.0,
                  checkpoint_every=checkpoint_every)


@pytest.fixture(scope="module")
def window(encode_sentences) -> torch.Tensor:
    return encode_sentences([SENTENCE], 4)


@pytest.fixture(scope="module")
def trained(llama_backbone, window, one_torch_thread) -> ARLoRA:
    """AR-LoRA overfit on one window: 60 steps at lr 1e-2, rank 8 on every linear map."""
    baseline = ARLoRA(llama_backbone, window_budget(60), seed=0, rank=8, temperature=0.0)
    baseline.fit(window, progress=False)
    return baseline


@pytest.mark.parametrize(("allowance", "targets", "rank"), [
    (12_288, "all-linear", 8),  # 8 x 1,536 exactly
    (700, "attention", 1),  # all-linear rank 1 is 1,536 (+119%); attention rank 1 is 672 (-4%)
    (330, "query-value", 1),  # attention rank 1 is +104%; q and v rank 1 is 336 (+1.8%)
])
def test_rank_and_targets_are_chosen_from_the_allowance(llama_backbone, allowance, targets, rank):
    budget = Budget(param_allowance=allowance)
    baseline = ARLoRA(llama_backbone, budget)
    assert (baseline.targets, baseline.rank) == (targets, rank)
    total = sum(baseline.parameter_counts().values())
    assert total == PER_RANK[targets] * rank == count_trainable(baseline.module())
    assert abs(total - allowance) <= 0.10 * allowance
    budget.check_allowance(baseline.parameter_counts())


def test_an_allowance_no_rank_fits_is_refused(llama_backbone):
    with pytest.raises(DihalError, match="no LoRA rank and target set lands within"):
        ARLoRA(llama_backbone, Budget(param_allowance=100))


def test_the_diagnostic_allowance_on_smollm2_takes_rank_9_on_every_linear_map():
    """SmolLM2-135M's shapes (30 layers, width 576, MLP 1536, 9 query and 3 key/value heads of 64),
    built on the meta device: per rank 30 x (2·1152 + 2·768 + 3·2112) = 305,280."""
    config = LlamaConfig(vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64)
    with torch.device("meta"):
        linears = decoder_linears(LlamaForCausalLM(config))
    targets, rank = choose_adapter("ar-lora", Budget(param_allowance=DIAGNOSTIC_ALLOWANCE), linears, None, None)
    assert (targets, rank) == ("all-linear", 9)
    assert adapter_size(linears, target_names(linears, targets), rank) == 9 * 305_280 == 2_747_520


def test_loss_is_the_next_token_cross_entropy_of_the_backbone_from_the_start_token(llama_backbone, window):
    """Untrained, the adapters add exactly zero (B = 0): the loss is −mean log p(w_i | start, w_<i)
    under the intact backbone's own forward pass, computed here by hand."""
    baseline = ARLoRA(llama_backbone, window_budget(1), seed=3)
    ids = window[:2]
    start = llama_backbone.tokenizer.eos_token_id  # the character tokenizer has no BOS
    inputs = torch.cat([torch.full((2, 1), start), ids[:, :-1]], dim=1)
    log_probs = torch.log_softmax(llama_backbone.logits(inputs).double(), dim=-1)
    expected = -log_probs.gather(-1, ids[..., None]).mean()
    loss = baseline.loss({"ids": ids}, torch.Generator())
    # float32 logits of O(1) through a softmax over 128 tokens: 1e-5 relative is far above rounding
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_training_and_sampling_leave_the_shared_backbone_unchanged(trained, llama_backbone, tiny_models):
    """The runner hands one backbone object to every method and (when it is the evaluator) to the
    metrics: after training and sampling it still computes exactly what it did, has no adapter in
    it and trains nothing, while the adapted copy computes something else."""
    with torch.no_grad():
        fresh = tiny_models["llama"](input_ids=PROBE).logits  # the pristine model the fixture copied
    trained.sample(2, 8, seed=0)
    assert torch.equal(llama_backbone.logits(PROBE), fresh)
    assert not any("lora" in name for name, _ in llama_backbone.model.named_modules())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())
    adapted = trained.lm(input_ids=PROBE).logits
    assert (adapted - fresh).abs().max() > 1.0
    # the copy shares the backbone's weights rather than duplicating them
    original = {p.data_ptr() for p in llama_backbone.model.parameters()}
    assert {p.data_ptr() for p in trained.lm.parameters() if not p.requires_grad} == original


def test_two_instances_over_one_backbone_keep_their_own_adapters(llama_backbone):
    """Two LoRA rivals over one backbone (the runner's latency pass holds both at once) keep their
    own adapters."""
    first, second = ARLoRA(llama_backbone, window_budget(1), seed=0), ARLoRA(llama_backbone, window_budget(1), seed=1)
    a, b = first.adapters.maps, second.adapters.maps
    name = next(iter(a))
    assert a[name]["A"].weight is not b[name]["A"].weight
    assert not torch.equal(a[name]["A"].weight, b[name]["A"].weight)


def test_overfit_window_is_sampled_back(trained, llama_backbone):
    texts = llama_backbone.tokenizer.batch_decode(trained.sample(3, len(SENTENCE), seed=0, batch_size=2))
    assert texts == [SENTENCE] * 3


def test_samples_are_text_only_and_follow_the_seed(llama_backbone):
    """An untrained random model puts mass on the special ids; none is ever drawn."""
    baseline = ARLoRA(llama_backbone, window_budget(1), seed=0)
    ids = baseline.sample(6, 12, seed=5, batch_size=4)
    assert ids.shape == (6, 12) and ids.dtype == torch.long
    assert not set(ids.flatten().tolist()) & set(special_ids(llama_backbone.tokenizer))
    assert torch.equal(ids, baseline.sample(6, 12, seed=5, batch_size=4))
    assert not torch.equal(ids, baseline.sample(6, 12, seed=6, batch_size=4))


def test_checkpoint_holds_only_the_adapters_and_round_trips(trained, llama_backbone, tmp_path):
    trained.save(tmp_path)
    stored = load_file(tmp_path / WEIGHTS_FILE)
    assert stored and all(key.endswith((".A.weight", ".B.weight")) for key in stored)
    assert sum(t.numel() for t in stored.values()) == sum(trained.parameter_counts().values())
    loaded = ARLoRA(llama_backbone, window_budget(60), seed=0, rank=8, temperature=0.0)
    loaded.load(tmp_path)
    assert torch.equal(loaded.sample(2, 10, seed=1), trained.sample(2, 10, seed=1))
    with pytest.raises(DihalError, match="holds 'ar-lora' with options"):
        ARLoRA(llama_backbone, window_budget(60), seed=0, rank=4).load(tmp_path)


def test_resume_is_bitwise_identical(llama_backbone, window, tmp_path):
    budget = window_budget(6, lr=3e-3, checkpoint_every=2)
    uninterrupted = ARLoRA(llama_backbone, budget, seed=0, rank=2)
    reference = uninterrupted.fit(window, progress=False)

    class Killed(Exception):
        pass

    killed = ARLoRA(llama_backbone, budget, seed=0, rank=2)
    calls = []
    original = killed.loss

    def dies_at_step_3(batch, generator):
        calls.append(1)
        if len(calls) == 4:
            raise Killed
        return original(batch, generator)

    killed.loss = dies_at_step_3
    with pytest.raises(Killed):
        killed.fit(window, checkpoint_dir=tmp_path, progress=False)
    resumed = ARLoRA(llama_backbone, budget, seed=1, rank=2)  # another init: the checkpoint decides
    result = resumed.fit(window, checkpoint_dir=tmp_path, progress=False)
    assert result.resumed_from_step == 2 and result.losses == reference.losses
    for (name, a), (_, b) in zip(uninterrupted.module().state_dict().items(), resumed.module().state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_bad_options_are_refused(llama_backbone):
    for options, message in (({"rank": 0}, "rank must be at least 1"), ({"targets": "mlp"}, "targets must be one of"),
                             ({"top_p": 0.0}, "top_p"), ({"lora_rank": 4}, "unknown option")):
        with pytest.raises(DihalError, match=message):
            ARLoRA(llama_backbone, Budget(), **options)


def test_impossible_sample_requests_are_refused(llama_backbone):
    baseline = ARLoRA(llama_backbone, window_budget(1))
    for n, length, message in ((0, 8, "cannot sample 0 sequences"), (2, 0, "cannot sample 0 tokens"),
                               (2, 256, "at most 255 with the start token")):
        with pytest.raises(DihalError, match=message):
            baseline.sample(n, length, seed=0)


def test_registers_under_its_name():
    registered = {}
    register_baselines(lambda name, cls, description: registered.setdefault(name, cls))
    assert registered == {"ar-lora": ARLoRA}
