"""Each continuous baseline's own sampler, run with the exact x̂₀ (docs/known-answers.md#oracle-tests).

The data are a small Markov chain's sequences written as rows of the table each method builds
itself (Diffusion-LM: its learned table at initialisation, N(0, 1) rows; SED: the backbone's
rows by PCA, norm √d, with R = E), and the denoiser is replaced by E[x₀ | x_t], exact by
forward–backward. Everything else is the method's: `sample`, its schedule, reverse chain,
clamping, self-conditioning and readout. With the exact x̂₀ the reverse chain is exact as its
steps grow, so at the largest step count the samples must score like the chain's own samples:
a sampler that fails here has a bug (or, as clamping does, a bias) that no training can fix.

Bounds, for N = n·(L − 1) transitions (docs/known-answers.md#oracle-tests):
- NLL: the chain picks each step's permutation i.i.d. ~ w, so a transition's cost under P_ε is
  i.i.d. with the exact variance s² of −log P_ε over w. Two independent sample sets' mean NLLs
  differ by at most Z·√2·s/√N (Z = 5);
- forbidden rate: the chain's own is exactly 0. One forbidden transition raises the mean NLL by
  at least (log(V/ε) − c_max)/N, c_max the costliest allowed transition, so a rate within the NLL
  bound is at most Z·√2·s/√N / (log(V/ε) − c_max);
- bigram TV: its sampling spread has no simple closed form, so the bound is the mean + Z·std of
  the TV of 20 seeded chain sample sets of the same size.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import pytest
import torch
from dihal_builtin.baselines.common import CompactVocabulary
from dihal_builtin.baselines.diffusion_lm import DiffusionLM
from dihal_builtin.baselines.schedules import cosine_alpha_bar, sqrt_alpha_bar
from dihal_builtin.baselines.sed import SED
from torch import Tensor, nn

from dihal_bench.numerics.markov import (
    DEFAULT_SMOOTHING,
    MarkovChain,
    ddpm_oracle,
    oracle_x0,
)
from dihal_bench.training.budget import Budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")

STATES, WIDTH, SEQUENCES, LENGTH = 16, 16, 64, 32
#: the step counts each sampler runs at: one step (no chance) and the largest
FEW_STEPS, MANY_STEPS = 1, 64
#: the chain's states are the backbone ids 3..18 (the character tokenizer's 0..2 are special)
FIRST_ID = 3
Z = 5.0
CHAIN = MarkovChain(STATES, [0.5, 0.3, 0.2], seed=0)


@dataclass(frozen=True)
class Bounds:
    """How far a sample set of SEQUENCES × LENGTH may score from the chain's own (module docstring)."""

    chain_nll: float  # the mean NLL of one seeded chain sample set, the anchor
    nll: float
    forbidden: float
    bigram_tv: float


@pytest.fixture(scope="module")
def bounds() -> Bounds:
    transitions = SEQUENCES * (LENGTH - 1)
    smoothed = (1 - DEFAULT_SMOOTHING) * CHAIN.weights + DEFAULT_SMOOTHING / STATES
    costs = -smoothed.log()
    spread = math.sqrt(float((CHAIN.weights * costs**2).sum() - (CHAIN.weights * costs).sum() ** 2))
    nll = Z * math.sqrt(2) * spread / math.sqrt(transitions)
    forbidden = nll / (math.log(STATES / DEFAULT_SMOOTHING) - float(costs.max()))
    generator = torch.Generator().manual_seed(1)
    tvs = [CHAIN.bigram_tv(CHAIN.sample(SEQUENCES, LENGTH, generator)) for _ in range(20)]
    anchor = CHAIN.sample(SEQUENCES, LENGTH, generator)
    return Bounds(float(CHAIN.nll_per_token(anchor).mean()), nll, forbidden,
                  statistics.mean(tvs) + Z * statistics.stdev(tvs))


@dataclass(frozen=True)
class Scores:
    nll: float
    forbidden: float
    bigram_tv: float

    def within(self, bounds: Bounds) -> bool:
        return (abs(self.nll - bounds.chain_nll) <= bounds.nll and self.forbidden <= bounds.forbidden
                and self.bigram_tv <= bounds.bigram_tv)


def scores(ids: Tensor) -> Scores:
    states = ids - FIRST_ID
    assert states.min() >= 0 and states.max() < STATES  # only the chain's tokens: no special id
    return Scores(float(CHAIN.nll_per_token(states).mean()), CHAIN.forbidden_rate(states), CHAIN.bigram_tv(states))


def built(method, backbone, steps: int, **options):
    """The method over the chain's tokens, its modules built as it builds them, untrained."""
    baseline = method(backbone, Budget(), 0, embed_dim=WIDTH, steps=steps, **options)
    baseline.build(CompactVocabulary(tuple(range(FIRST_ID, FIRST_ID + STATES)), backbone.vocab_size))
    return baseline


def sampled(baseline) -> Tensor:
    baseline.trained = True  # the oracle stands in for training
    return baseline.sample(SEQUENCES, LENGTH, seed=0, batch_size=SEQUENCES)


# -- Diffusion-LM -------------------------------------------------------------------------------


class DiffusionLMOracle(nn.Module):
    """E[x₀ | x_t] for Diffusion-LM's x₀ = Emb(w) + σ₀·ε₀ and x_t = √ᾱ·x₀ + √(1 − ᾱ)·ε.

    Given w, x_t ~ N(√ᾱ·e_w, v·I) with v = ᾱσ₀² + 1 − ᾱ, so the token posterior γ is the oracle's
    with std √v, and E[x₀ | x_t, w] = e_w + c·(x_t − √ᾱ·e_w) with c = σ₀²√ᾱ/v (Gaussian
    conditioning); averaged over γ: (1 − c√ᾱ)·Σ_v γ(v)·e_v + c·x_t.
    """

    def __init__(self, table: Tensor, sigma_0: float):
        super().__init__()
        self.table, self.sigma_0 = table.detach().double(), sigma_0

    def forward(self, x_t: Tensor, t: Tensor) -> Tensor:
        alpha = sqrt_alpha_bar(t).double()
        variance = alpha * self.sigma_0**2 + 1 - alpha
        tokens_mean = oracle_x0(CHAIN, self.table, x_t, alpha.sqrt(), None, variance.sqrt()).double()
        pull = (self.sigma_0**2 * alpha.sqrt() / variance)[:, None, None]
        return ((1 - pull * alpha.sqrt()[:, None, None]) * tokens_mean + pull * x_t.double()).to(x_t.dtype)


def diffusion_lm_with_oracle(backbone, steps: int, **options) -> DiffusionLM:
    baseline = built(DiffusionLM, backbone, steps, **options)
    baseline.parts["denoiser"] = DiffusionLMOracle(baseline.parts["embeddings"].weight, baseline.sigma_0)
    return baseline


def test_diffusion_lm_sampler_with_the_oracle_reaches_the_chain(llama_backbone, bounds):
    one_step = scores(sampled(diffusion_lm_with_oracle(llama_backbone, FEW_STEPS)))
    assert one_step.forbidden > 10 * bounds.forbidden  # from pure noise in one step: far off, so the bounds bite
    many = scores(sampled(diffusion_lm_with_oracle(llama_backbone, MANY_STEPS)))  # clamping on, its default
    assert abs(many.nll - bounds.chain_nll) <= bounds.nll, (many, bounds)
    assert many.forbidden <= bounds.forbidden, (many, bounds)


def test_diffusion_lm_clamping_distorts_word_frequencies_under_the_oracle(llama_backbone, bounds):
    """A measured property, not a bug of the port: the clamping trick (Li et al. 2022, kept) moves
    each step towards the nearest row, which favours rows near the centre of the table (small
    norms), so the samples' word frequencies leave the chain's uniform law although every
    transition is allowed. Without clamping the same sampler is within every bound."""
    clamped = scores(sampled(diffusion_lm_with_oracle(llama_backbone, MANY_STEPS, clamp=True)))
    free = scores(sampled(diffusion_lm_with_oracle(llama_backbone, MANY_STEPS, clamp=False)))
    assert clamped.bigram_tv > bounds.bigram_tv, (clamped, bounds)
    assert free.within(bounds), (free, bounds)


# -- SED ------------------------------------------------------------------------------------------


def sed_with_oracle(backbone, steps: int) -> SED:
    baseline = built(SED, backbone, steps)
    assert baseline.settings.self_condition > 0  # sampled self-conditioned; the oracle needs no previous x̂₀
    assert torch.equal(baseline.parts["readout"].weight, baseline.embeddings)  # R = E, its initialisation
    oracle = ddpm_oracle(CHAIN, baseline.embeddings, cosine_alpha_bar)
    baseline.denoise = lambda x_t, t, previous: oracle(x_t, t, previous).to(x_t.dtype)
    return baseline


def test_sed_sampler_with_the_oracle_reaches_the_chain(llama_backbone, bounds):
    one_step = scores(sampled(sed_with_oracle(llama_backbone, FEW_STEPS)))
    # one step reads out the prior mean: one word everywhere, its bigrams nothing like the chain's
    assert one_step.bigram_tv > 5 * bounds.bigram_tv
    many = scores(sampled(sed_with_oracle(llama_backbone, MANY_STEPS)))
    assert many.within(bounds), (many, bounds)
