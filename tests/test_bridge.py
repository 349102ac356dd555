"""The bridge contract's standardiser and the built-in DiHAL bridge, on toy tensors."""

import itertools
import math

import pytest
import torch
from dihal_builtin.bridge import (
    DihalBridge,
    RegressorBridge,
    register_bridges,
    timestep_embedding,
)
from safetensors.torch import load_file, save_file

from dihal_bench.api.bridge import (
    HiddenStateBridge,
    SampleCache,
    masked_moments,
    training_loss,
)
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import train

D, T = 8, 12


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def tiny_bridge(**options) -> DihalBridge:
    torch.manual_seed(0)
    return DihalBridge(D, **{"d_model": 32, "layers": 1, "heads": 2, **options})


def toy_pair(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """cond ~ N(2, 3²); target = a fixed linear map of cond plus an offset; mask drops position 0."""
    generator = torch.Generator().manual_seed(seed)
    cond = 2 + 3 * torch.randn(n, T, D, generator=generator)
    mixing = torch.randn(D, D, generator=torch.Generator().manual_seed(100))
    mask = torch.ones(n, T, dtype=torch.bool)
    mask[:, 0] = False
    return cond, cond @ mixing - 5, mask


# -- the standardiser -------------------------------------------------------------------


def test_standardizer_uses_only_masked_tokens():
    cond, target, mask = toy_pair(16)
    cond[:, 0] = 1e4  # an attention-sink-like outlier the mask excludes
    target[:, 0] = -1e4
    bridge = tiny_bridge()
    bridge.fit_standardizer(cond, target, mask)
    torch.testing.assert_close(bridge.cond_mean, cond[:, 1:].reshape(-1, D).mean(0))
    torch.testing.assert_close(bridge.cond_std, cond[:, 1:].reshape(-1, D).std(0, correction=0))
    torch.testing.assert_close(bridge.target_mean, target[:, 1:].reshape(-1, D).mean(0))
    standardized = bridge.standardize_target(target)[mask]
    torch.testing.assert_close(standardized.mean(0), torch.zeros(D), atol=1e-5, rtol=0)
    torch.testing.assert_close(standardized.std(0, correction=0), torch.ones(D), atol=1e-5, rtol=0)
    torch.testing.assert_close(bridge.destandardize_target(bridge.standardize_target(target)), target)
    mean, std = masked_moments(cond, mask, "cond", chunk=3)  # chunk boundaries change nothing
    torch.testing.assert_close(mean.float(), bridge.cond_mean)
    torch.testing.assert_close(std.float(), bridge.cond_std)


def test_standardizer_survives_constant_dimensions_and_is_saved(tmp_path):
    cond, target, mask = toy_pair(4)
    target[..., 3] = 7.0
    bridge = tiny_bridge()
    bridge.fit_standardizer(cond, target, mask)
    assert bridge.target_std[3] == 1.0 and bridge.target_mean[3] == 7.0  # centred, not scaled
    assert torch.isfinite(bridge.standardize_target(target)).all()
    save_file(bridge.state_dict(), tmp_path / "bridge.safetensors")
    restored = DihalBridge(**bridge.config())
    restored.load_state_dict(load_file(tmp_path / "bridge.safetensors"))
    torch.testing.assert_close(restored.target_std, bridge.target_std, rtol=0, atol=0)
    assert torch.equal(restored.sample(cond), bridge.sample(cond))


def test_standardizer_rejects_empty_mask_and_nan():
    cond, target, mask = toy_pair(2)
    with pytest.raises(DihalError, match="selects no tokens"):
        tiny_bridge().fit_standardizer(cond, target, torch.zeros_like(mask))
    target[1, 4, 0] = float("nan")
    with pytest.raises(DihalError, match="target hidden states contain NaN"):
        tiny_bridge().fit_standardizer(cond, target, mask)


# -- the DiHAL bridge -------------------------------------------------------------------


class Recording(DihalBridge):
    """A bridge whose denoiser is replaced by a known function, recording what it is given."""

    def __init__(self, predict, **options):
        super().__init__(D, d_model=16, layers=1, heads=2, **options)
        self.predict, self.calls = predict, []

    def denoise(self, x_t, t, c):
        self.calls.append((x_t.clone(), t.clone(), c.clone()))
        return self.predict(x_t, t, c)


def test_exact_denoiser_walks_the_straight_bridge_back_to_x0():
    cond, target, mask = toy_pair(3)
    bridge = Recording(predict=None, steps=5)
    bridge.fit_standardizer(cond, target, mask)
    c, x0 = bridge.standardize_cond(cond), bridge.standardize_target(target)
    bridge.predict = lambda x_t, t, c_: x0

    sampled = bridge.sample(cond)

    torch.testing.assert_close(sampled, target, atol=1e-4, rtol=1e-5)
    assert torch.equal(bridge.calls[0][0], c)  # starts at x_1 = c
    for k, (x_t, t, _) in zip(range(5, 0, -1), bridge.calls):
        assert torch.allclose(t, torch.full((3,), k / 5))
        torch.testing.assert_close(x_t, (1 - k / 5) * x0 + (k / 5) * c)  # the posterior mean path
    assert len(bridge.calls) == 5

    bridge.calls.clear()
    stochastic = bridge.sample(cond, steps=3, stochastic=True, generator=torch.Generator().manual_seed(0))
    assert len(bridge.calls) == 3
    torch.testing.assert_close(stochastic, target, atol=1e-4, rtol=1e-5)  # last step lands on x̂0


def test_loss_draws_the_brownian_bridge_and_averages_masked_tokens():
    cond, target, mask = toy_pair(64)
    mask[:, -3:] = False  # padding
    bridge = Recording(predict=lambda x_t, t, c: torch.zeros_like(x_t), sigma=0.5)
    bridge.fit_standardizer(cond, target, mask)
    c, x0 = bridge.standardize_cond(cond), bridge.standardize_target(target)

    loss = bridge.loss(cond, target, mask, torch.Generator().manual_seed(0))

    # a zero prediction scores the mean square of standardised x0 over the counted tokens
    torch.testing.assert_close(loss, x0.pow(2).mean(-1)[mask].mean())
    x_t, t, c_seen = bridge.calls[0]
    assert torch.equal(c_seen, c) and t.shape == (64,) and 0 < t.min() and t.max() < 1
    assert torch.equal(x_t[:, 0], x0[:, 0])  # the sink is given clean at every t, as sampling holds it
    tt = t[:, None, None]
    noise = (x_t - (1 - tt) * x0 - tt * c)[:, 1:] / (0.5 * torch.sqrt(tt * (1 - tt)))
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05


def test_loss_ignores_position_0_even_where_the_mask_selects_it():
    cond, target, mask = toy_pair(8)
    bridge = Recording(predict=lambda x_t, t, c: torch.zeros_like(x_t))
    bridge.fit_standardizer(cond, target, mask)
    everywhere = torch.ones_like(mask)
    base = bridge.loss(cond, target, everywhere, torch.Generator().manual_seed(0))

    def off_at_sink(x_t, t, c):
        prediction = torch.zeros_like(x_t)
        prediction[:, 0] = 1e3
        return prediction

    bridge.predict = off_at_sink
    assert torch.equal(bridge.loss(cond, target, everywhere, torch.Generator().manual_seed(0)), base)
    only_sink = torch.zeros_like(mask)
    only_sink[:, 0] = True
    with pytest.raises(DihalError, match="no token after position 0"):
        bridge.loss(cond, target, only_sink, torch.Generator().manual_seed(0))


def test_loss_decreases_on_a_learnable_toy():
    cond, target, mask = toy_pair(200)
    bridge = tiny_bridge()
    bridge.fit_standardizer(cond, target, mask)
    budget = Budget(steps=60, batch_size=8, seq_len=T, lr=1e-2, epochs=4)
    result = train(bridge, training_loss, {"cond": cond, "target": target, "mask": mask}, budget, progress=False)
    first, last = sum(result.losses[:10]) / 10, sum(result.losses[-10:]) / 10
    assert last < 0.25 * first

    held_out, held_target, held_mask = toy_pair(16, seed=1)
    error = (bridge.standardize_target(bridge.sample(held_out)) - bridge.standardize_target(held_target)).pow(2)
    assert error.mean(-1)[held_mask].mean() < 0.3  # an untrained bridge sits near 1 or above


@pytest.mark.parametrize("stochastic", [False, True], ids=["deterministic", "stochastic"])
def test_sampling_holds_the_given_sink_at_every_step(stochastic):
    """Position 0 of x_t is the standardised sink at every denoiser call, and the sample's
    position 0 is the given state itself, at any number of steps."""
    cond, target, mask = toy_pair(3)
    bridge = Recording(predict=lambda x_t, t, c: x_t + 1.0)  # wrong everywhere, the sink included
    bridge.fit_standardizer(cond, target, mask)
    sink = target[:, :1]
    held = bridge.standardize_target(sink)
    for steps in (1, 2, 8, 32):
        bridge.calls.clear()
        sampled = bridge.sample(cond, steps=steps, sink=sink, stochastic=stochastic,
                                generator=torch.Generator().manual_seed(0))
        assert len(bridge.calls) == steps
        assert all(torch.equal(x_t[:, :1], held) for x_t, _, _ in bridge.calls)
        assert torch.equal(sampled[:, :1], sink)
        assert (sampled[:, 1:] - target[:, 1:]).abs().amax() > 1  # the others are the bridge's own
    unheld = bridge.sample(cond, steps=2)
    assert not torch.equal(unheld[:, :1], sink)  # without a sink, position 0 is estimated too


def test_the_sink_conditions_the_other_positions():
    bridge = tiny_bridge(layers=2, steps=4)
    cond, target, mask = toy_pair(2)
    bridge.fit_standardizer(cond, target, mask)
    with_sink, without = bridge.sample(cond, sink=target[:, :1]), bridge.sample(cond)
    assert (with_sink[:, 1:] - without[:, 1:]).abs().amax() > 1e-3  # later positions attend to it
    with pytest.raises(DihalError, match=r"sink state must have shape \(2, 1, 8\)"):
        bridge.sample(cond, sink=target[:, :2])
    with pytest.raises(DihalError, match=r"sink state must have shape \(1, 1, 8\), got \(2, 1, 8\)"):
        bridge.sample_step(cond[:1], bridge.new_sample_cache(sink=target[:, :1]))


def test_sampling_is_causal_in_positions():
    bridge = tiny_bridge(layers=2, steps=4)
    cond, target, mask = toy_pair(2)
    bridge.fit_standardizer(cond, target, mask)
    changed = cond.clone()
    changed[:, 6] += 10.0
    before, after = bridge.sample(cond), bridge.sample(changed)
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=1e-6)
    assert (after[:, 6:] - before[:, 6:]).abs().amax() > 1e-3


def test_sampling_is_deterministic_unless_stochastic():
    bridge = tiny_bridge()
    cond, _, _ = toy_pair(2)
    assert torch.equal(bridge.sample(cond), bridge.sample(cond))
    one = bridge.sample(cond, stochastic=True, generator=torch.Generator().manual_seed(1))
    same = bridge.sample(cond, stochastic=True, generator=torch.Generator().manual_seed(1))
    assert torch.equal(one, same) and not torch.equal(one, bridge.sample(cond))


# Incremental and whole-sequence sampling run the same float32 operations on the same
# numbers, batched differently (new positions against the whole sequence), which changes the
# summation order in matrix products and attention. Rounding then differs by ~√m·2^-24
# relative per sum of length m ≤ 128 and compounds over the ~10² products in sequence of K ≤ 8
# two-block denoiser passes: ~1e-5 relative on standardised values of size ≲ 10, so 1e-3
# absolute leaves a wide margin, while a wrong position or mask moves them by O(1).
INCREMENTAL_ATOL = 1e-3


@pytest.mark.parametrize("held", [True, False], ids=["sink", "no-sink"])
@pytest.mark.parametrize("steps", [1, 8], ids=["K1", "K8"])
@pytest.mark.parametrize("first", [4, 1], ids=["prompt", "one-token"])
def test_incremental_sampling_equals_whole_sequence_sampling(steps, held, first):
    bridge = tiny_bridge(layers=2)
    torch.nn.init.normal_(bridge.cond_skip.weight, std=0.3)  # zero at initialisation
    cond, target, mask = toy_pair(3)
    bridge.fit_standardizer(cond, target, mask)
    sink = target[:, :1] if held else None
    whole = bridge.sample(cond, steps=steps, sink=sink)
    cache = bridge.new_sample_cache(steps, sink)
    # a prompt or one token, single positions, and chunks that start mid-sequence (an offset causal mask)
    bounds = [0, first, 5, 6, 9, 10, T]
    parts = torch.cat([bridge.sample_step(cond[:, start:end], cache) for start, end in itertools.pairwise(bounds)],
                      dim=1)
    assert cache.length == T and cache.steps == steps
    torch.testing.assert_close(bridge.standardize_target(parts), bridge.standardize_target(whole),
                               atol=INCREMENTAL_ATOL, rtol=0)
    assert bridge.standardize_target(whole).abs().amax() > 1  # not trivially small
    if held:
        assert torch.equal(parts[:, :1], sink) and torch.equal(whole[:, :1], sink)


def test_incremental_sampling_validates_its_inputs():
    bridge = tiny_bridge(max_len=8)
    with pytest.raises(DihalError, match="at least 1 step"):
        bridge.new_sample_cache(steps=0)
    cache = bridge.new_sample_cache()
    bridge.sample_step(torch.zeros(2, 6, D), cache)
    with pytest.raises(DihalError, match="sequence of 9 tokens exceeds the bridge's max_len 8"):
        bridge.sample_step(torch.zeros(2, 3, D), cache)
    with pytest.raises(DihalError, match="for batches of 2 sequences, got 1"):
        bridge.sample_step(torch.zeros(1, 1, D), cache)
    assert cache.length == 6  # refused steps leave the cache as it was
    assert bridge.sample_step(torch.zeros(2, 2, D), cache).shape == (2, 2, D)


def test_bridges_without_a_sample_cache_say_so():
    class WholeSequences(HiddenStateBridge):
        def loss(self, cond, target, mask, generator):
            return torch.zeros(())

        def sample(self, cond, steps=None, generator=None, stochastic=False):
            return cond

        def config(self):
            return {"width": self.width}

    bridge = WholeSequences(D)
    assert bridge.new_sample_cache() is None
    with pytest.raises(NotImplementedError, match="whole sequences only"):
        bridge.sample_step(torch.zeros(1, 1, D), SampleCache(steps=1))


def test_bridge_validates_its_inputs():
    with pytest.raises(DihalError, match="not divisible"):
        DihalBridge(D, d_model=30, heads=4)
    bridge = tiny_bridge(max_len=8)
    with pytest.raises(DihalError, match="max_len 8"):
        bridge.sample(torch.zeros(1, 9, D))
    with pytest.raises(DihalError, match="at least 1 step"):
        bridge.sample(torch.zeros(1, 4, D), steps=0)


def test_config_rebuilds_the_architecture():
    bridge = DihalBridge(D, d_model=32, layers=3, heads=4, sigma=0.3, steps=6, max_len=64, sampler="ddim")
    assert bridge.config() == {
        "width": D, "d_model": 32, "layers": 3, "heads": 4, "sigma": 0.3, "steps": 6, "dropout": 0.0, "max_len": 64,
        "sampler": "ddim",
    }
    rebuilt = DihalBridge(**bridge.config())
    shapes = {name: tensor.shape for name, tensor in bridge.state_dict().items()}
    assert {name: tensor.shape for name, tensor in rebuilt.state_dict().items()} == shapes
    assert isinstance(rebuilt, HiddenStateBridge)


def test_timestep_embedding():
    embedding = timestep_embedding(torch.tensor([0.0, 0.5]), 7)
    assert embedding.shape == (2, 7)
    torch.testing.assert_close(embedding[0], torch.tensor([1.0, 1, 1, 0, 0, 0, 0]))
    assert embedding[1, 0] == pytest.approx(math.cos(500.0))


def test_plugin_registers_the_bridge_and_the_regressor_control():
    registered = []
    register_bridges(lambda name, obj, **meta: registered.append((name, obj, meta)))
    assert [(name, obj) for name, obj, _ in registered] == [("dihal-bridge", DihalBridge),
                                                           ("regressor", RegressorBridge)]
    assert all(meta["description"] for _, _, meta in registered)


# -- the regressor control ----------------------------------------------------------------


class RecordingRegressor(RegressorBridge):
    def __init__(self, predict):
        super().__init__(D, d_model=16, layers=1, heads=2)
        self.predict, self.calls = predict, []

    def denoise(self, x_t, t, c):
        self.calls.append((x_t.clone(), t.clone(), c.clone()))
        return self.predict(x_t, t, c)


def test_regressor_trains_at_t1_on_the_condition_and_samples_in_one_step():
    cond, target, mask = toy_pair(16)
    bridge = RecordingRegressor(predict=lambda x_t, t, c: torch.zeros_like(x_t))
    bridge.fit_standardizer(cond, target, mask)
    c, x0 = bridge.standardize_cond(cond), bridge.standardize_target(target)
    sink = target[:, :1]

    bridge.loss(cond, target, mask, torch.Generator().manual_seed(0))
    x_t, t, _ = bridge.calls[0]
    assert torch.equal(t, torch.ones(16))
    assert torch.equal(x_t[:, 1:], c[:, 1:]) and torch.equal(x_t[:, 0], x0[:, 0])  # no noise; the sink held

    bridge.calls.clear()
    sampled = bridge.sample(cond, sink=sink)
    ((x_t, t, _),) = bridge.calls  # one denoiser call, at t = 1, from the condition
    assert torch.equal(t, torch.ones(16)) and torch.equal(x_t[:, 1:], c[:, 1:])
    assert torch.equal(sampled[:, :1], sink)
    torch.testing.assert_close(sampled[:, 1:], bridge.destandardize_target(torch.zeros_like(c))[:, 1:])
    assert bridge.new_sample_cache().steps == 1
    with pytest.raises(DihalError, match="one step, got steps=8"):
        bridge.sample(cond, steps=8)


def test_regressor_learns_a_toy_map():
    cond, target, mask = toy_pair(200)
    torch.manual_seed(0)
    bridge = RegressorBridge(D, d_model=32, layers=1, heads=2)
    bridge.fit_standardizer(cond, target, mask)
    budget = Budget(steps=60, batch_size=8, seq_len=T, lr=1e-2, epochs=4)
    result = train(bridge, training_loss, {"cond": cond, "target": target, "mask": mask}, budget, progress=False)
    assert sum(result.losses[-10:]) / 10 < 0.25 * sum(result.losses[:10]) / 10

    held_out, held_target, held_mask = toy_pair(16, seed=1)
    sampled = bridge.sample(held_out, sink=held_target[:, :1])
    error = (bridge.standardize_target(sampled) - bridge.standardize_target(held_target)).pow(2)
    assert error.mean(-1)[held_mask].mean() < 0.3  # an untrained network sits near 1 or above
    cache = bridge.new_sample_cache(sink=held_target[:, :1])
    stepped = torch.cat([bridge.sample_step(held_out[:, :3], cache), bridge.sample_step(held_out[:, 3:], cache)], 1)
    torch.testing.assert_close(bridge.standardize_target(stepped), bridge.standardize_target(sampled),
                               atol=INCREMENTAL_ATOL, rtol=0)


def test_regressor_is_the_dihal_network_and_accepts_its_options():
    options = {"d_model": 32, "layers": 2, "heads": 4, "max_len": 64}
    # DiHAL's diffusion options do not apply
    regressor = RegressorBridge(D, sigma=0.3, steps=6, sampler="ancestral", **options)
    assert regressor.config() == {"width": D, "dropout": 0.0, **options}
    rebuilt = RegressorBridge(**regressor.config())
    assert {k: v.shape for k, v in rebuilt.state_dict().items()} == \
           {k: v.shape for k, v in DihalBridge(D, **options).state_dict().items()}
