"""Teacher-forced NLL, KL to the backbone and bridge reconstruction against known answers:
a direct torch cross-entropy and KL on tiny random models, and predictors whose standardised
error is known in closed form."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from dihal_builtin.bridge import DihalBridge
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench.api.bridge import HiddenStateBridge, training_loss
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import (
    backbone_log_probs,
    bridge_reconstruction,
    hybrid_against_backbone,
    kl_to_backbone,
    steps_axis,
    teacher_forced_nll,
)
from dihal_bench.hybrid.model import HybridLM, OracleBridge, skip_control
from dihal_bench.hybrid.training import (
    BridgeSpec,
    SplitTensors,
    evaluate_layer,
    validation_subset,
)
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import train

FAMILIES = ("llama", "gemma3")
VOCAB = 128  # the tiny models' (conftest.py)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=FAMILIES)
def backbone(request, tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models[request.param], char_tokenizer, f"tiny-{request.param}")


def random_ids(n: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n, length), generator=torch.Generator().manual_seed(seed))


def sink_free_mask(n: int, length: int) -> torch.Tensor:
    mask = torch.ones(n, length, dtype=torch.bool)
    mask[:, 0] = False
    return mask


# -- perplexity and KL --------------------------------------------------------------------


def test_teacher_forced_nll_equals_direct_cross_entropy(backbone):
    ids = random_ids(5, 12)
    logits = backbone.model(input_ids=ids).logits.double()
    log_probs = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])
    expected = -log_probs.sum().item()

    for batch_size in (2, 5):
        result = teacher_forced_nll(backbone.logits, ids, batch_size)
        assert result["tokens"] == 5 * 11
        assert result["nll_sum"] == pytest.approx(expected, rel=1e-6)
        assert result["ppl"] == pytest.approx(math.exp(expected / 55), rel=1e-6)


def test_oracle_hybrid_has_the_backbones_perplexity(backbone):
    ids = random_ids(4, 12)
    hybrid = HybridLM(backbone, OracleBridge(backbone, 2), 2)
    ours = teacher_forced_nll(hybrid.logits, ids, 3)
    assert ours["nll_sum"] == pytest.approx(teacher_forced_nll(backbone.logits, ids, 3)["nll_sum"], rel=1e-6)


def test_kl_is_zero_for_the_oracle_and_matches_torch_for_the_skip_control(backbone):
    ids = random_ids(4, 10)
    oracle = HybridLM(backbone, OracleBridge(backbone, 2), 2)
    assert abs(kl_to_backbone(backbone, oracle, ids, 3)) < 1e-6

    control = skip_control(backbone, 2)
    log_p = backbone.logits(ids)[:, :-1].double().log_softmax(-1)
    log_q = control.logits(ids)[:, :-1].double().log_softmax(-1)
    expected = F.kl_div(log_q, log_p, log_target=True, reduction="sum").item() / (4 * 9)
    kl = kl_to_backbone(backbone, control, ids, 3)
    assert kl > 1e-2
    assert kl == pytest.approx(expected, rel=1e-5)


def test_the_backbone_pass_is_memoised_across_hybrids_and_recomputed_for_new_windows(backbone, monkeypatch):
    ids = random_ids(4, 10, seed=7)
    first = hybrid_against_backbone(backbone, skip_control(backbone, 1), ids, 3)
    calls = []
    original = backbone.logits
    monkeypatch.setattr(backbone, "logits", lambda batch: calls.append(batch.shape[0]) or original(batch))
    # another hybrid on the same windows reads the memo: exactly the uncached numbers, no backbone pass
    second = hybrid_against_backbone(backbone, skip_control(backbone, 2), ids, 3)
    assert calls == []
    monkeypatch.undo()
    fresh = [F.log_softmax(backbone.logits(ids[i:i + 3])[:, :-1].float(), dim=-1) for i in (0, 3)]
    assert all(torch.equal(a, b) for a, b in zip(backbone_log_probs(backbone, ids, 3), fresh, strict=True))
    assert second["kl"] == kl_to_backbone(backbone, skip_control(backbone, 2), ids, 3)
    assert first["kl"] != second["kl"]
    # other windows or another batching are a new pass
    monkeypatch.setattr(backbone, "logits", lambda batch: calls.append(batch.shape[0]) or original(batch))
    backbone_log_probs(backbone, ids.flip(0), 3)
    backbone_log_probs(backbone, ids.flip(0), 4)
    assert calls == [3, 1, 4]


def test_log_probabilities_over_the_memory_bound_are_recomputed_with_the_same_numbers(backbone, monkeypatch):
    from dihal_bench.hybrid import evaluation

    ids = random_ids(4, 10, seed=11)
    memoised = hybrid_against_backbone(backbone, skip_control(backbone, 1), ids, 3)
    monkeypatch.setattr(evaluation, "LOG_PROBS_MEMO_BYTES", 0)
    calls = []
    original = backbone.logits
    monkeypatch.setattr(backbone, "logits", lambda batch: calls.append(batch.shape[0]) or original(batch))
    assert hybrid_against_backbone(backbone, skip_control(backbone, 1), ids, 3) == memoised
    # over the bound every call is a fresh backbone pass (batches of 3 and 1), none is kept
    hybrid_against_backbone(backbone, skip_control(backbone, 1), ids, 3)
    assert calls == [3, 1, 3, 1]


def test_sequences_too_short_to_predict_are_refused(backbone):
    with pytest.raises(DihalError, match="T ≥ 2"):
        teacher_forced_nll(backbone.logits, random_ids(3, 1), 2)


# -- bridge reconstruction ----------------------------------------------------------------


class ShrunkPredictor(HiddenStateBridge):
    """Predicts the standardised target times ``factor`` from a condition that *is* the
    target: factor 1 is perfect, 0 predicts the mean. In standardised units, with the
    standardiser fitted on the scored tokens, MSE = (1−factor)² and R² = 1 − (1−factor)²."""

    def __init__(self, width: int, factor: float):
        super().__init__(width)
        self.factor, self.sinks = factor, []

    def sample(self, cond, steps=None, generator=None, stochastic=False, sink=None):
        self.sinks.append(sink)
        return self.destandardize_target(self.factor * self.standardize_target(cond))

    def loss(self, cond, target, mask, generator):
        return torch.zeros(())

    def config(self) -> dict:
        return {"width": self.width, "factor": self.factor}


@pytest.mark.parametrize("factor", [1.0, 0.5, 0.0])
def test_reconstruction_of_known_predictors(factor):
    generator = torch.Generator().manual_seed(0)
    target = 3 + 2 * torch.randn(10, 7, 6, generator=generator)
    target[:, 0] = 1e4  # an attention-sink-like outlier the mask leaves out
    mask = sink_free_mask(10, 7)
    predictor = ShrunkPredictor(6, factor)
    predictor.fit_standardizer(target, target, mask)

    for batch_size in (3, 10):
        predictor.sinks.clear()
        result = bridge_reconstruction(predictor, target, target, mask, batch_size=batch_size)
        assert result["tokens"] == 10 * 6
        assert result["mse"] == pytest.approx((1 - factor) ** 2, abs=1e-6)  # float32 standardiser
        assert result["r2"] == pytest.approx(1 - (1 - factor) ** 2, abs=1e-6)
        # each batch is given its exact position-0 state, the target's
        assert torch.equal(torch.cat(predictor.sinks), target[:, :1])
    bridge_reconstruction(predictor, target, target, mask, sink=False)
    assert predictor.sinks[-1] is None


def test_reconstruction_refuses_an_empty_mask():
    target = torch.randn(2, 4, 3)
    with pytest.raises(DihalError, match="no tokens"):
        bridge_reconstruction(ShrunkPredictor(3, 1.0), target, target, torch.zeros(2, 4, dtype=torch.bool))


def test_trained_dihal_bridge_reconstructs_better_than_untrained(tiny_models, char_tokenizer):
    backbone = HFBackbone(tiny_models["llama"], char_tokenizer, "tiny-llama")
    layer, length = 1, 12
    train_ids, valid_ids = random_ids(256, length, seed=1), random_ids(8, length, seed=2)
    train_states, valid_states = backbone.hidden_states(train_ids), backbone.hidden_states(valid_ids)
    train_mask, valid_mask = sink_free_mask(256, length), sink_free_mask(8, length)

    torch.manual_seed(0)
    bridge = DihalBridge(backbone.width, d_model=32, layers=1, heads=2, steps=4)
    bridge.fit_standardizer(train_states[0], train_states[layer], train_mask)

    def score() -> dict:
        return bridge_reconstruction(bridge, valid_states[0], valid_states[layer], valid_mask, batch_size=4)

    before = score()
    budget = Budget(steps=200, batch_size=16, seq_len=length, lr=3e-3, epochs=13, seed=0)
    data = {"cond": train_states[0], "target": train_states[layer], "mask": train_mask}
    train(bridge, training_loss, data, budget, progress=False)
    after = score()

    # A random-weight model's h_ℓ is mostly a random mix of the prefix (even a per-token
    # lookup table explains only ~10% of its variance), so training mainly removes the
    # untrained bridge's bias: from R² ≈ −0.46 to about 0.
    assert math.isfinite(after["mse"]) and math.isfinite(after["r2"])
    assert after["mse"] < 0.8 * before["mse"]
    assert after["r2"] > before["r2"] + 0.3


# -- the sampling-steps axis ----------------------------------------------------------------


def fitted_toy_bridge(steps: int = 4) -> tuple[DihalBridge, torch.Tensor, torch.Tensor, torch.Tensor]:
    """An untrained tiny DiHAL bridge fitted to a toy condition/target pair, whose sampled
    states move with K (the linear path given weights so that they are not all near 0)."""
    generator = torch.Generator().manual_seed(0)
    cond = torch.randn(6, 9, 8, generator=generator)
    target = cond @ torch.randn(8, 8, generator=generator) + 0.5 * torch.randn(6, 9, 8, generator=generator)
    mask = sink_free_mask(6, 9)
    torch.manual_seed(0)
    bridge = DihalBridge(8, d_model=16, layers=1, heads=2, steps=steps)
    torch.nn.init.normal_(bridge.cond_skip.weight, std=0.3)
    bridge.fit_standardizer(cond, target, mask)
    return bridge, cond, target, mask


def test_steps_axis_measures_each_k_with_the_same_weights():
    bridge, cond, target, mask = fitted_toy_bridge()
    weights = {name: tensor.clone() for name, tensor in bridge.state_dict().items()}

    axis = steps_axis(bridge, cond, target, mask, steps=(1, 2, 8), batch_size=4)

    assert list(axis) == [1, 2, 8]
    for k, measured in axis.items():
        assert measured == {key: value for key, value in bridge_reconstruction(bridge, cond, target, mask, k, 4).items()
                            if key in ("mse", "mse_trace", "r2")}
    assert len({measured["mse"] for measured in axis.values()}) == 3  # K changes the samples
    assert all(torch.equal(tensor, weights[name]) for name, tensor in bridge.state_dict().items())
    assert list(steps_axis(bridge, cond, target, mask)) == [1, 2, 4, 8, 16]
    for bad in ((), (0, 4), (2.0,)):
        with pytest.raises(DihalError, match="sampling steps ≥ 1"):
            steps_axis(bridge, cond, target, mask, steps=bad)


def tiny_bridge_at_layer_1(tiny_models, char_tokenizer, windows: int, seed: int):
    """The tiny Llama, ``windows`` random windows with their states at 0 and 1, and an untrained
    bridge for layer 1 whose standardiser is fitted on them."""
    backbone = HFBackbone(tiny_models["llama"], char_tokenizer, "tiny-llama")
    ids = random_ids(windows, 10, seed=seed)
    states = backbone.hidden_states(ids)
    valid = SplitTensors(ids, {0: states[0], 1: states[1]})
    torch.manual_seed(0)
    bridge = DihalBridge(backbone.width, d_model=16, layers=1, heads=2, steps=2)
    bridge.fit_standardizer(states[0], states[1], valid.mask)
    return backbone, ids, states, valid, bridge


def test_evaluate_layer_gives_the_bridge_the_sink_as_the_hybrid_does(tiny_models, char_tokenizer):
    layer = 1
    backbone, ids, states, valid, bridge = tiny_bridge_at_layer_1(tiny_models, char_tokenizer, 4, seed=3)

    for sink in (True, False):
        measured = evaluate_layer(backbone, bridge, layer, BridgeSpec(sink_passthrough=sink), valid, batch_size=2)
        expected = bridge_reconstruction(bridge, states[0], states[layer], valid.mask, None, 2, sink=sink)
        assert (measured["bridge_mse"], measured["bridge_mse_trace"], measured["bridge_r2"]) == \
               (expected["mse"], expected["mse_trace"], expected["r2"])
        hybrid = HybridLM(backbone, bridge, layer, sink_passthrough=sink)
        assert measured["hybrid_ppl"] == pytest.approx(teacher_forced_nll(hybrid.logits, ids, 2)["ppl"], rel=1e-9)
    with_sink = bridge_reconstruction(bridge, states[0], states[layer], valid.mask)
    assert with_sink["mse"] != bridge_reconstruction(bridge, states[0], states[layer], valid.mask, sink=False)["mse"]


def test_evaluate_layer_takes_every_window_for_bridgeability_and_a_subset_for_the_lm(tiny_models, char_tokenizer):
    layer = 1
    backbone, ids, states, valid, bridge = tiny_bridge_at_layer_1(tiny_models, char_tokenizer, 6, seed=4)

    measured = evaluate_layer(backbone, bridge, layer, BridgeSpec(), valid, batch_size=2, lm_windows=3, skip=False)
    subset = validation_subset(ids, 3)
    assert len(subset) == 3 and not torch.equal(subset, ids[:3])  # seeded, not the first windows
    assert measured["bridge_mse"] == bridge_reconstruction(bridge, states[0], states[layer], valid.mask, None, 2)["mse"]
    hybrid = HybridLM(backbone, bridge, layer)
    assert measured["hybrid_ppl"] == pytest.approx(teacher_forced_nll(hybrid.logits, subset, 2)["ppl"], rel=1e-9)
    assert measured["kl_to_backbone"] == pytest.approx(kl_to_backbone(backbone, hybrid, subset, 2), rel=1e-9)
    assert "skip_ppl" not in measured
    with_skip = evaluate_layer(backbone, bridge, layer, BridgeSpec(), valid, batch_size=2, lm_windows=3)
    skip = skip_control(backbone, layer).logits
    assert with_skip["skip_ppl"] == pytest.approx(teacher_forced_nll(skip, subset, 2)["ppl"], rel=1e-9)
