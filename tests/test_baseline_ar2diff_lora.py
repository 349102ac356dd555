"""AR2Diff-LoRA: the masked-diffusion bound against hand-computed values, the annealed attention
mask (causal at the start, full at the end, the stated mixture between) and that it reaches the
model, the shift, the random-order sampler's schedule, a shared backbone that no training or
sampling changes, the baseline contract (resume, checkpoints, samples) and an overfit window
sampled back, on tiny random-weight models."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from dihal_builtin.baselines.ar2diff_lora import (
    T_MIN,
    AR2DiffLoRA,
    anneal_ratio,
    annealed_attention,
    draw_masking,
    mask_token_id,
    masked_diffusion_loss,
    register_baselines,
)
from dihal_builtin.hf_backbone import HFBackbone
from safetensors.torch import load_file

from dihal_bench.api.baseline import WEIGHTS_FILE
from dihal_bench.api.sampling import special_ids
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget

SENTENCE = "the cat sat on"  # 14 characters, 14 tokens of the character tokenizer
PROBE = torch.tensor([[3 + i for i in range(0, 60, 3)], [90 - i for i in range(20)]])

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def window_budget(steps: int, lr: float = 1e-2, checkpoint_every: int = 50) -> Budget:
    return Budget(steps=steps, batch_size=8, seq_len=len(SENTENCE), lr=lr, epochs=steps, warmup_frac=0.0,
                  checkpoint_every=checkpoint_every)


@pytest.fixture(scope="module")
def window(encode_sentences) -> torch.Tensor:
    return encode_sentences([SENTENCE], 8)


@pytest.fixture(scope="module")
def trained(llama_backbone, window, one_torch_thread) -> AR2DiffLoRA:
    """AR2Diff-LoRA overfit on one window: 200 steps at lr 1e-2, rank 8 on every linear map,
    attention annealed over the first quarter; greedy unmasking, one position per step (160 steps
    already sample it back; 120 do not)."""
    baseline = AR2DiffLoRA(llama_backbone, window_budget(200), seed=0, rank=8, temperature=0.0,
                           steps=len(SENTENCE))
    baseline.fit(window, progress=False)
    return baseline


# -- the pieces against known answers ------------------------------------------------------------


def test_masked_diffusion_loss_is_the_hand_computed_bound():
    """Two sequences of 3 tokens over 4 token ids: the first masked at positions 0 and 2 (t = 1/2,
    uniform logits: −log p = ln 4 each), the second at position 1 (t = 1/4, logits ln(1..4),
    target 3: −log p = ln(10/4)). Bound = (2·2·ln 4 + 4·ln 2.5)/(2·3)."""
    masked = torch.tensor([[True, False, True], [False, True, False]])
    logits = torch.stack([torch.zeros(4), torch.zeros(4), torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0]))])
    targets = torch.tensor([0, 2, 3])
    loss = masked_diffusion_loss(logits, targets, torch.tensor([0.5, 0.25]), masked)
    assert loss.item() == pytest.approx((4 * math.log(4) + 4 * math.log(2.5)) / 6, rel=1e-6)


def test_masking_draws_t_then_masks_each_token_with_probability_t():
    t, masked = draw_masking(64, 4096, torch.Generator().manual_seed(0))
    assert t.min() >= T_MIN and t.max() < 1
    # each row's masked share is Binomial(4096, t)/4096: its std is at most 0.5/64, so 6 of them bound it
    assert ((masked.double().mean(1) - t.double()).abs() < 6 * 0.5 / 64).all()
    again = draw_masking(64, 4096, torch.Generator().manual_seed(0))
    assert torch.equal(again[0], t) and torch.equal(again[1], masked)


def test_the_ratio_rises_linearly_to_one_over_the_annealing_steps():
    assert [anneal_ratio(step, 4) for step in (0, 1, 2, 4, 9)] == [0.0, 0.25, 0.5, 1.0, 1.0]
    assert anneal_ratio(0, 0) == 1.0  # no annealing: full attention from the first step


def test_annealed_attention_is_causal_at_the_start_full_at_the_end_and_the_stated_mixture_between():
    generator = torch.Generator().manual_seed(0)
    causal = torch.ones(64, 64).tril().bool()
    assert torch.equal(annealed_attention(8, 64, 0.0, generator), causal.expand(8, -1, -1))
    assert annealed_attention(8, 64, 1.0, generator).all()
    mixed = annealed_attention(8, 64, 0.3, generator)
    assert mixed[:, causal].all()
    future = mixed[:, ~causal].double()  # 8 x 2,016 Bernoulli(0.3) links: std 0.0036
    assert abs(future.mean().item() - 0.3) < 6 * math.sqrt(0.3 * 0.7 / future.numel())
    assert not torch.equal(mixed[0], mixed[1])  # drawn per sequence


@pytest.fixture(scope="module")
def gemma_backbone(tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(copy.deepcopy(tiny_models["gemma3"]), char_tokenizer, "tiny-gemma3")


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_first_loss_is_the_hand_computed_bound_of_the_backbone_under_causal_attention(
        family, llama_backbone, gemma_backbone, window):
    """Step 0 anneals nothing (causal attention) and the untrained adapters add exactly zero: the
    loss is the bound computed by hand from the intact backbone's own causal forward pass (the
    library's masks, Gemma3's sliding window and soft cap included) on the start token and the
    masked window, position i scored on token i (the shift)."""
    backbone = llama_backbone if family == "llama" else gemma_backbone
    baseline = AR2DiffLoRA(backbone, window_budget(8), seed=0, anneal_fraction=0.5)
    ids = window[:4]
    loss = baseline.loss({"ids": ids}, torch.Generator().manual_seed(7))
    assert int(baseline.adapters.anneal_step) == 1

    t, masked = draw_masking(4, ids.shape[1], torch.Generator().manual_seed(7))
    noisy = ids.masked_fill(masked, baseline.mask_id)
    start = torch.full((4, 1), backbone.tokenizer.eos_token_id)  # the character tokenizer has no BOS
    log_probs = torch.log_softmax(backbone.logits(torch.cat([start, noisy], dim=1))[:, :-1].double(), -1)
    by_hand = sum(-log_probs[b, i, ids[b, i]] / t[b].double()
                  for b in range(4) for i in range(ids.shape[1]) if masked[b, i])
    assert masked.any() and not masked.all()
    # float32 hidden states of O(1): 1e-5 relative is far above rounding, far below any real difference
    assert loss.item() == pytest.approx(by_hand.item() / ids.numel(), rel=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_attention_mask_reaches_the_model(family, llama_backbone, gemma_backbone):
    """Under causal links no output depends on the last input token; under full links every one does."""
    backbone = llama_backbone if family == "llama" else gemma_backbone
    baseline = AR2DiffLoRA(backbone, window_budget(8), seed=0)
    ids = PROBE.clone()
    changed = ids.clone()
    changed[:, -1] = 50
    length = ids.shape[1] + 1
    causal = annealed_attention(2, length, 0.0, torch.Generator())
    full = torch.ones(2, length, length, dtype=torch.bool)
    with torch.no_grad():
        assert torch.allclose(baseline.predict(ids, causal), baseline.predict(changed, causal), rtol=0, atol=1e-6)
        moved = (baseline.predict(ids, full) - baseline.predict(changed, full)).abs().amax(-1)
    assert (moved > 1e-4).all()


# -- the sampler ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("steps", "length"), [(5, 12), (30, 12)])
def test_sampling_reveals_floor_t_k_over_steps_positions_after_step_k(llama_backbone, steps, length):
    """The model is called once per step that reveals something, on a sequence holding exactly
    T − ⌊T·(k−1)/steps⌋ masks; the result holds no mask and no special token."""
    baseline = AR2DiffLoRA(llama_backbone, window_budget(8), seed=0, steps=steps)
    seen, original = [], baseline.predict

    def counting(noisy, allowed):
        assert allowed.all()  # sampling attends everywhere
        seen.append((noisy == baseline.mask_id).sum(1).tolist())
        return original(noisy, allowed)

    baseline.predict = counting
    ids = baseline.sample(3, length, seed=0)
    revealed = sorted({length * k // steps for k in range(steps)})
    assert seen == [[length - r] * 3 for r in revealed]
    assert ids.shape == (3, length)
    assert not set(ids.flatten().tolist()) & set(special_ids(llama_backbone.tokenizer))


def test_samples_are_text_only_and_follow_the_seed(llama_backbone):
    baseline = AR2DiffLoRA(llama_backbone, window_budget(8), seed=0, steps=6)
    ids = baseline.sample(5, 12, seed=3, batch_size=2)
    assert ids.shape == (5, 12) and ids.dtype == torch.long
    assert baseline.mask_id in special_ids(llama_backbone.tokenizer)
    assert not set(ids.flatten().tolist()) & set(special_ids(llama_backbone.tokenizer))
    assert torch.equal(ids, baseline.sample(5, 12, seed=3, batch_size=2))
    assert not torch.equal(ids, baseline.sample(5, 12, seed=4, batch_size=2))


def test_the_mask_token_is_the_tokenizers_mask_else_unknown_else_another_special_token(char_tokenizer):
    assert mask_token_id(char_tokenizer, start=1) == char_tokenizer.unk_token_id == 2
    assert mask_token_id(SimpleNamespace(mask_token_id=7, unk_token_id=2, all_special_ids=[0, 1, 2, 7]), 1) == 7
    assert mask_token_id(SimpleNamespace(unk_token_id=1, all_special_ids=[1, 4]), start=1) == 4
    with pytest.raises(DihalError, match="needs a special token other than the start token"):
        mask_token_id(SimpleNamespace(unk_token_id=None, all_special_ids=[1]), start=1)


# -- the baseline contract -----------------------------------------------------------------------


def test_rank_and_targets_fit_the_allowance(llama_backbone):
    budget = Budget(param_allowance=12_000)
    baseline = AR2DiffLoRA(llama_backbone, budget)
    assert (baseline.targets, baseline.rank) == ("all-linear", 8)  # 8 x 1,536 = 12,288: +2.4%
    assert budget.check_allowance(baseline.parameter_counts()) == pytest.approx(0.024)


def test_training_and_sampling_leave_the_shared_backbone_unchanged(trained, llama_backbone, tiny_models):
    with torch.no_grad():
        pristine = tiny_models["llama"](input_ids=PROBE).logits
    trained.sample(2, 8, seed=0)
    assert torch.equal(llama_backbone.logits(PROBE), pristine)
    assert not any("lora" in name for name, _ in llama_backbone.model.named_modules())
    assert not any(p.requires_grad for p in llama_backbone.model.parameters())
    assert (trained.lm(input_ids=PROBE).logits - pristine).abs().max() > 1.0


def test_overfit_window_is_sampled_back(trained, llama_backbone):
    texts = llama_backbone.tokenizer.batch_decode(trained.sample(3, len(SENTENCE), seed=0, batch_size=2))
    assert texts == [SENTENCE] * 3


def test_checkpoint_holds_only_the_adapters_and_round_trips(trained, llama_backbone, tmp_path):
    trained.save(tmp_path)
    stored = load_file(tmp_path / WEIGHTS_FILE)
    assert stored and all(key.endswith((".A.weight", ".B.weight")) for key in stored)
    assert sum(t.numel() for t in stored.values()) == sum(trained.parameter_counts().values())
    loaded = AR2DiffLoRA(llama_backbone, window_budget(200), seed=0, rank=8, temperature=1.0, steps=4)
    loaded.load(tmp_path)  # options that only shape sampling may differ
    assert not torch.equal(loaded.sample(2, 10, seed=1), trained.sample(2, 10, seed=1))
    loaded = AR2DiffLoRA(llama_backbone, window_budget(200), seed=0, rank=8, temperature=0.0,
                         steps=len(SENTENCE))
    loaded.load(tmp_path)
    assert torch.equal(loaded.sample(2, 10, seed=1), trained.sample(2, 10, seed=1))


def test_resume_is_bitwise_identical_annealing_included(llama_backbone, window, tmp_path):
    """Killed during the annealing (6 steps, ratio s/3): the resumed run takes the checkpoint's
    step count for the ratio and ends exactly where the uninterrupted one does."""
    budget = window_budget(6, lr=3e-3, checkpoint_every=2)
    options = {"rank": 2, "anneal_fraction": 0.5}
    uninterrupted = AR2DiffLoRA(llama_backbone, budget, seed=0, **options)
    reference = uninterrupted.fit(window, progress=False)

    class Killed(Exception):
        pass

    killed = AR2DiffLoRA(llama_backbone, budget, seed=0, **options)
    calls, original = [], killed.loss

    def dies_at_step_3(batch, generator):
        calls.append(1)
        if len(calls) == 4:
            raise Killed
        return original(batch, generator)

    killed.loss = dies_at_step_3
    with pytest.raises(Killed):
        killed.fit(window, checkpoint_dir=tmp_path, progress=False)
    resumed = AR2DiffLoRA(llama_backbone, budget, seed=1, **options)  # another init: the checkpoint decides
    result = resumed.fit(window, checkpoint_dir=tmp_path, progress=False)
    assert result.resumed_from_step == 2 and result.losses == reference.losses
    assert int(resumed.adapters.anneal_step) == 6
    for (name, a), (_, b) in zip(uninterrupted.module().state_dict().items(), resumed.module().state_dict().items(),
                                 strict=True):
        assert torch.equal(a, b), name


def test_bad_options_are_refused(llama_backbone):
    for options, message in (({"steps": 0}, "steps must be at least 1"),
                             ({"anneal_fraction": 1.5}, "anneal_fraction in"),
                             ({"temperature": -1.0}, "temperature"), ({"mask": 3}, "unknown option")):
        with pytest.raises(DihalError, match=message):
            AR2DiffLoRA(llama_backbone, Budget(), **options)


def test_registers_under_its_name_as_a_cheap_adaptation():
    registered = {}
    register_baselines(lambda name, cls, description: registered.setdefault(name, (cls, description)))
    assert registered["ar2diff-lora"][0] is AR2DiffLoRA and "cheap adaptation" in registered["ar2diff-lora"][1]
