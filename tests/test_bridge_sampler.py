"""The DiHAL bridge's three samplers (docs/method.md#bridge): each update rule against its closed
form, where each leaves x_t with an exact denoiser, position-keyed noise, incremental sampling
and the hybrid's cached decode under a noisy sampler."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from dihal_builtin.bridge import (
    SAMPLER_STEPS,
    DihalBridge,
    PositionNoise,
    ancestral_step,
    implicit_step,
    posterior_mean_step,
)
from dihal_builtin.hf_backbone import HFBackbone

from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import bridge_reconstruction
from dihal_bench.hybrid.model import HybridLM
from dihal_bench.numerics.markov import MarkovChain, bridge_oracle

D, T, SIGMA = 8, 12, 0.5
NOISY = ("ddim", "ancestral")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def gaussian(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def never() -> torch.Tensor:
    raise AssertionError("this step must not draw noise")


# -- the update rules against their closed forms ---------------------------------------------


@pytest.mark.parametrize(("t", "s"), [(1.0, 0.75), (0.75, 0.5), (0.5, 0.125), (0.25, 0.0)])
def test_each_step_is_its_closed_form(t, s):
    x_t, x0_hat, c, z = (gaussian(3, T, D, seed=seed) for seed in range(4))
    if t == 1:
        x_t = c  # where every walk starts
    mean = x0_hat + (s / t) * (x_t - x0_hat)
    torch.testing.assert_close(posterior_mean_step(x_t, x0_hat, c, t, s, SIGMA, never), mean)
    spread = SIGMA * math.sqrt(s * (t - s) / t)
    torch.testing.assert_close(ancestral_step(x_t, x0_hat, c, t, s, SIGMA, (lambda: z) if s else never),
                               mean + spread * z)
    marginal = (1 - s) * x0_hat + s * c
    if t == 1:  # nothing to infer: the booting noise, i.e. the ancestral step
        expected = marginal + SIGMA * math.sqrt(s * (1 - s)) * z
        torch.testing.assert_close(implicit_step(x_t, x0_hat, c, t, s, SIGMA, lambda: z),
                                   ancestral_step(x_t, x0_hat, c, t, s, SIGMA, lambda: z))
    else:
        inferred = (x_t - (1 - t) * x0_hat - t * c) / (SIGMA * math.sqrt(t * (1 - t)))
        expected = marginal + SIGMA * math.sqrt(s * (1 - s)) * inferred
    torch.testing.assert_close(implicit_step(x_t, x0_hat, c, t, s, SIGMA, (lambda: z) if t == 1 else never),
                               expected, atol=1e-5, rtol=1e-5)


def test_ddim_keeps_a_marginal_point_on_its_noise_with_the_exact_x0():
    """x_t = (1−t)x₀ + t·c + σ√(t(1−t))·ε and x̂₀ = x₀ give x_s with the same ε, for any s < t."""
    x0, c, epsilon = (gaussian(4, T, D, seed=seed) for seed in range(3))
    for t, s in [(0.9, 0.6), (0.5, 0.49), (0.3, 0.01)]:
        x_t = (1 - t) * x0 + t * c + SIGMA * math.sqrt(t * (1 - t)) * epsilon
        torch.testing.assert_close(implicit_step(x_t, x0, c, t, s, SIGMA, never),
                                   (1 - s) * x0 + s * c + SIGMA * math.sqrt(s * (1 - s)) * epsilon,
                                   atol=1e-5, rtol=1e-5)


# -- where x_t goes with an exact denoiser ---------------------------------------------------


class ExactDenoiser(DihalBridge):
    """A bridge whose denoiser returns the true standardised x₀, recording every x_t it sees."""

    def __init__(self, x0: torch.Tensor, **options):
        super().__init__(D, d_model=16, layers=1, heads=2, sigma=SIGMA, **options)
        self.x0, self.seen = x0, []

    def denoise(self, x_t, t, c):
        self.seen.append((t[0].item(), x_t.clone()))
        return self.x0


@pytest.mark.parametrize("sampler", list(SAMPLER_STEPS))
def test_with_the_exact_x0_every_sampler_ends_on_it_and_only_noisy_ones_stay_on_the_marginal(sampler):
    """The normalised residual (x_t − (1−t)x₀ − t·c)/(σ√(t(1−t))) is ε on the training marginal:
    0 along the mean sampler's path, the booting noise itself along DDIM's, and fresh N(0, 1)
    draws along the ancestral one (64·12·8 entries: its rms within 0.05 of 1 is > 5 standard errors)."""
    c, x0 = gaussian(64, T, D, seed=0), gaussian(64, T, D, seed=1)
    bridge = ExactDenoiser(x0, steps=8, sampler=sampler)
    sampled = bridge.sample(c, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(sampled, x0)  # identity standardiser: x̂₀ itself
    booting = PositionNoise.from_generator(torch.Generator().manual_seed(3))(8, 0, c)
    for t, x_t in bridge.seen[1:]:  # t < 1
        residual = (x_t - (1 - t) * x0 - t * c) / (SIGMA * math.sqrt(t * (1 - t)))
        if sampler == "mean":
            assert residual.abs().max() < 1e-4
        elif sampler == "ddim":
            torch.testing.assert_close(residual, booting, atol=1e-4, rtol=1e-4)
        else:
            assert abs(residual.pow(2).mean().sqrt().item() - 1) < 0.05 and abs(residual.mean().item()) < 0.05
    assert [round(t, 6) for t, _ in bridge.seen] == [k / 8 for k in range(8, 0, -1)]


# -- noise keyed by position -----------------------------------------------------------------


def test_position_noise_depends_on_seed_step_and_position_only():
    like = torch.zeros(3, 10, D)
    noise = PositionNoise(7)
    whole = noise(2, 0, like)
    assert whole.shape == like.shape
    torch.testing.assert_close(noise(2, 4, like[:, :3]), whole[:, 4:7], rtol=0, atol=0)
    assert not torch.equal(noise(3, 0, like), whole) and not torch.equal(PositionNoise(8)(2, 0, like), whole)
    assert not torch.equal(whole[:, 0], whole[:, 1])  # positions apart
    assert abs(whole.std().item() - 1) < 0.2
    same = PositionNoise.from_generator(torch.Generator().manual_seed(1)).seed
    assert same == PositionNoise.from_generator(torch.Generator().manual_seed(1)).seed != \
        PositionNoise.from_generator(torch.Generator().manual_seed(2)).seed
    assert PositionNoise.from_generator(None).seed == 0


def tiny_bridge(**options) -> DihalBridge:
    torch.manual_seed(0)
    bridge = DihalBridge(D, d_model=32, layers=2, heads=2, **options)
    torch.nn.init.normal_(bridge.cond_skip.weight, std=0.3)  # zero at initialisation
    return bridge


@pytest.mark.parametrize("sampler", NOISY)
def test_noisy_samplers_repeat_for_a_seed_and_are_causal(sampler):
    bridge = tiny_bridge(steps=4, sampler=sampler)
    cond = 2 * gaussian(3, T, D, seed=0)

    def sample(cond, seed):
        return bridge.sample(cond, generator=torch.Generator().manual_seed(seed))

    one = sample(cond, 1)
    assert torch.equal(one, sample(cond, 1)) and not torch.equal(one, sample(cond, 2))
    assert not torch.equal(one, bridge.sample(cond, sampler="mean"))
    # a position's noise is its own: a shorter prefix samples the same states
    torch.testing.assert_close(sample(cond[:, :5], 1), one[:, :5], atol=1e-5, rtol=0)


# as tests/test_bridge.py's INCREMENTAL_ATOL: the same float32 operations batched differently
INCREMENTAL_ATOL = 1e-3


@pytest.mark.parametrize("sampler", list(SAMPLER_STEPS))
def test_incremental_sampling_equals_whole_sequence_sampling_under_every_sampler(sampler):
    bridge = tiny_bridge()
    cond = 2 * gaussian(3, T, D, seed=0)
    sink = gaussian(3, 1, D, seed=1)
    whole = bridge.sample(cond, steps=8, sink=sink, generator=torch.Generator().manual_seed(5), sampler=sampler)
    cache = bridge.new_sample_cache(8, sink, generator=torch.Generator().manual_seed(5), sampler=sampler)
    parts = torch.cat([bridge.sample_step(cond[:, start:end], cache)
                       for start, end in itertools.pairwise([0, 1, 5, 6, 9, T])], dim=1)
    torch.testing.assert_close(parts, whole, atol=INCREMENTAL_ATOL, rtol=0)
    assert torch.equal(parts[:, :1], sink)
    if sampler != "mean":  # the noise reaches the sample
        other = bridge.sample(cond, steps=8, sink=sink, generator=torch.Generator().manual_seed(6), sampler=sampler)
        assert (other - whole).abs().max() > 10 * INCREMENTAL_ATOL


def test_the_sampler_option_is_checked_and_travels_with_the_config():
    with pytest.raises(DihalError, match=r"unknown bridge sampler 'euler': choose one of mean, ddim, ancestral"):
        DihalBridge(D, d_model=16, heads=2, sampler="euler")
    bridge = tiny_bridge(sampler="ancestral")
    assert DihalBridge(**bridge.config()).sampler == "ancestral"
    with pytest.raises(DihalError, match="unknown bridge sampler"):
        bridge.sample(torch.zeros(1, 3, D), sampler="euler")
    with pytest.raises(DihalError, match="stochastic sampling is the ancestral sampler, not 'ddim'"):
        bridge.sample(torch.zeros(1, 3, D), stochastic=True, sampler="ddim")
    with pytest.raises(DihalError, match="unknown bridge sampler"):
        bridge.new_sample_cache(sampler="euler")
    # stochastic=True is the ancestral sampler of the contract
    cond = gaussian(2, T, D, seed=0)
    torch.testing.assert_close(tiny_bridge().sample(cond, stochastic=True, generator=torch.Generator().manual_seed(1)),
                               bridge.sample(cond, generator=torch.Generator().manual_seed(1)), rtol=0, atol=0)


def test_bridge_reconstruction_takes_the_sampler_and_its_seed():
    bridge = tiny_bridge(steps=4)
    cond, target = 2 * gaussian(6, T, D, seed=0), gaussian(6, T, D, seed=1)
    mask = torch.ones(6, T, dtype=torch.bool)
    mask[:, 0] = False
    bridge.fit_standardizer(cond, target, mask)

    def mse(**options):
        return bridge_reconstruction(bridge, cond, target, mask, batch_size=4, **options)["mse"]

    assert mse(sampler="ancestral", seed=1) == mse(sampler="ancestral", seed=1) != mse(sampler="ancestral", seed=2)
    assert mse() == mse(sampler="mean") != mse(sampler="ddim")


# -- the hybrid under a noisy sampler ---------------------------------------------------------


@pytest.fixture(scope="module")
def backbone(tiny_models, char_tokenizer) -> HFBackbone:
    return HFBackbone(tiny_models["llama"], char_tokenizer, "tiny-llama")


def hybrid_bridge(backbone: HFBackbone, layer: int) -> DihalBridge:
    torch.manual_seed(1)
    bridge = DihalBridge(backbone.width, d_model=32, layers=2, heads=2, steps=4)
    torch.nn.init.normal_(bridge.cond_skip.weight, std=0.2)
    ids = torch.randint(3, 100, (8, 12), generator=torch.Generator().manual_seed(1))
    states = backbone.hidden_states(ids)
    mask = torch.ones(ids.shape, dtype=torch.bool)
    mask[:, 0] = False
    bridge.fit_standardizer(states[0], states[layer], mask)
    return bridge


# as tests/test_hybrid.py's LOGITS_ATOL: cached and uncached decodes differ in batching only
LOGITS_ATOL = 1e-3


@pytest.mark.parametrize("sampler", NOISY)
def test_cached_decode_equals_uncached_decode_under_a_noisy_sampler(backbone, sampler):
    hybrid = HybridLM(backbone, hybrid_bridge(backbone, 2), 2, sampler=sampler)
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(4))
    cached, uncached = hybrid.decoder(noise_seed=9), hybrid.decoder(use_cache=False, noise_seed=9)
    for start, end in itertools.pairwise([0, 3, 4, 7, 10]):
        torch.testing.assert_close(cached.append(ids[:, start:end]), uncached.append(ids[:, start:end]),
                                   atol=LOGITS_ATOL, rtol=0)
    whole = hybrid.logits(ids, noise_seed=9)
    torch.testing.assert_close(uncached.append(ids[:, :1])[:, 0], HybridLM(
        backbone, hybrid.bridge, 2, sampler=sampler).logits(torch.cat([ids, ids[:, :1]], 1), noise_seed=9)[:, -1])
    assert (whole - hybrid.logits(ids, noise_seed=10)).abs().max() > 1e-2  # the noise matters
    assert torch.equal(whole, hybrid.logits(ids, noise_seed=9))
    options = {"seed": 3, "batch_size": 2}
    tokens = hybrid.generate(3, 12, **options)
    assert torch.equal(tokens, hybrid.generate(3, 12, use_cache=False, **options))
    assert torch.equal(tokens, hybrid.generate(3, 12, **options))


def test_a_hybrid_without_a_sampler_samples_as_before(backbone):
    """No sampler given: the bridge's own (here the mean), and the tokens of the default decode."""
    bridge = hybrid_bridge(backbone, 2)
    plain, named = HybridLM(backbone, bridge, 2), HybridLM(backbone, bridge, 2, sampler="mean")
    ids = torch.randint(3, 100, (2, 10), generator=torch.Generator().manual_seed(4))
    assert torch.equal(plain.logits(ids), named.logits(ids))
    assert torch.equal(plain.logits(ids, noise_seed=1), plain.logits(ids, noise_seed=2))  # nothing noisy
    assert torch.equal(plain.generate(2, 6, seed=1), named.generate(2, 6, seed=1))


# -- with the exact posterior of a Markov language -------------------------------------------

#: the chain the oracle tests sample: V states, three permutations; entropy rate H(w) = 0.898 nats
ORACLE_CHAIN = {"states": 16, "weights": [0.6, 0.3, 0.1], "seed": 0}
ORACLE_N, ORACLE_LENGTH, ORACLE_WIDTH = 64, 12, 8
ORACLE_STEPS = (1, 4, 32)


class OracleBridge(DihalBridge):
    """DiHAL's sampler, unchanged, with the exact E[x₀ | x_t] in place of the network: x₀'s rows
    are the chain's states written as rows of ``table`` (dihal_bench.numerics.markov.bridge_oracle)."""

    def __init__(self, chain, table: torch.Tensor, **options):
        super().__init__(ORACLE_WIDTH, d_model=8, layers=1, heads=2, sigma=SIGMA, **options)
        self.exact = bridge_oracle(chain, table, SIGMA)

    def denoise(self, x_t, t, c):
        return self.exact(x_t, t, c)


@pytest.fixture(scope="module")
def oracle_runs() -> dict:
    """Per sampler and K: the states read out (nearest row) from the final x̂₀ of ORACLE_N
    sequences sampled from conditions independent of the chain, and the chain's own samples."""
    chain = MarkovChain(**ORACLE_CHAIN)
    table = gaussian(chain.states, ORACLE_WIDTH, seed=1)
    condition = gaussian(ORACLE_N, ORACLE_LENGTH, ORACLE_WIDTH, seed=2)
    runs = {}
    for sampler, steps in itertools.product(SAMPLER_STEPS, ORACLE_STEPS):
        bridge = OracleBridge(chain, table, sampler=sampler, steps=steps)
        x0_hat = bridge.sample(condition, generator=torch.Generator().manual_seed(3))
        runs[sampler, steps] = torch.cdist(x0_hat.double(), table.double()).argmin(-1)
    own = chain.sample(ORACLE_N, ORACLE_LENGTH, torch.Generator().manual_seed(4))
    return {"chain": chain, "runs": runs, "own": own}


def nll_bound(chain) -> float:
    """4 standard errors of the difference between two independent means of ORACLE_N·(L−1)
    transition costs: each cost is −log wₖ with k ~ w, whose variance is exact."""
    costs = -chain.weights.log()
    variance = float((chain.weights * costs**2).sum() - (chain.weights * costs).sum() ** 2)
    return 4 * math.sqrt(2 * variance / (ORACLE_N * (ORACLE_LENGTH - 1)))


@pytest.mark.parametrize("sampler", NOISY)
def test_with_the_oracle_noisy_samplers_sample_the_chain_as_steps_grow(oracle_runs, sampler):
    """One step lands on the posterior mean of every row (the same state everywhere: all
    transitions forbidden); at the largest K the forbidden rate is the chain's own, 0, and the
    NLL per token is the chain's own samples' within 4 standard errors; every sample differs."""
    chain, runs, own = oracle_runs["chain"], oracle_runs["runs"], oracle_runs["own"]
    assert chain.forbidden_rate(runs[sampler, 1]) == 1.0
    largest = runs[sampler, ORACLE_STEPS[-1]]
    assert chain.forbidden_rate(largest) == chain.forbidden_rate(own) == 0.0
    sampled, reference = chain.nll_per_token(largest).mean().item(), chain.nll_per_token(own).mean().item()
    assert abs(sampled - reference) < nll_bound(chain), (sampled, reference, chain.entropy_rate)
    assert abs(reference - chain.expected_nll()) < nll_bound(chain) / math.sqrt(2)
    assert len({tuple(row) for row in largest.tolist()}) == ORACLE_N


def test_with_the_oracle_the_mean_sampler_collapses_to_one_sequence(oracle_runs):
    """The posterior-mean walk adds no noise and the oracle subtracts t·c exactly, so whatever the
    condition every sequence is the same one: allowed transitions only, but a single sample whose
    NLL sits below the entropy rate (the mode, not a draw)."""
    chain, runs = oracle_runs["chain"], oracle_runs["runs"]
    largest = runs["mean", ORACLE_STEPS[-1]]
    assert chain.forbidden_rate(largest) == 0.0
    assert len({tuple(row) for row in largest.tolist()}) == 1
    assert chain.nll_per_token(largest).mean().item() < chain.entropy_rate - nll_bound(chain)


def test_the_suite_knows_every_sampler_of_the_bridge():
    # a suite's bridge.steps_axis_samplers is checked against this list before any model loads
    from dihal_bench.config.suite import BRIDGE_SAMPLERS

    assert BRIDGE_SAMPLERS == tuple(SAMPLER_STEPS)
