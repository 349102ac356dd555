"""Held-out likelihoods (docs/method.md#test-nll) against known answers: a uniform model's NLL is
log V per token; the intact backbone's through the hybrid's path is the backbone's own; MDLM's bound
with the chain's exact posterior is the chain's NLL, with a denoiser that ignores its input the
unigram NLL; and on the chain (entropy rate known) an autoregressive model trained from scratch
approaches the rate while MDLM's bound stays above the exact NLL of the same windows. Diffusion-LM's
Gaussian bound, with the exact posterior mean of a three-token mixture as its denoiser, falls to the
mixture's NLL as its steps grow."""

from __future__ import annotations

import math

import pytest
import torch
from dihal_builtin.baselines.ar_scratch import ARScratch
from dihal_builtin.baselines.mdlm import MDLM

from dihal_builtin.baselines.schedules import sqrt_alpha_bar

from dihal_bench.api.likelihood import (
    HeldOutNLL,
    gaussian_diffusion_bound,
    masked_diffusion_bound,
    next_token_nll,
    with_start,
)
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import hybrid_test_nll, teacher_forced_nll
from dihal_bench.hybrid.model import HybridLM, intact_control, start_token_id
from dihal_bench.numerics.markov import MarkovChain
from dihal_bench.training.budget import Budget

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: 16 states, 3 successors each: entropy rate 1.5 log 2 = 1.040 nats per token
CHAIN = MarkovChain(16, (0.5, 0.25, 0.25), seed=0)
#: the character tokenizer's first ordinary id: chain state s is token FIRST + s
FIRST = 3


def chain_nll(windows: torch.Tensor) -> torch.Tensor:
    """The chain's exact −log p of each window of states (n,): log 16 for the first state (the
    stationary law is uniform here), then each transition's cost."""
    costs = -CHAIN.log_transition[windows[:, :-1], windows[:, 1:]].sum(1)
    return math.log(CHAIN.states) + costs.double()


def test_a_uniform_model_costs_log_v_per_token_at_any_batch_size():
    windows = torch.randint(0, 7, (5, 4), generator=torch.Generator().manual_seed(0))
    uniform = lambda batch: torch.zeros(*batch.shape, 7)  # noqa: E731
    for batch_size in (1, 2, 16):
        scored = next_token_nll(uniform, windows, batch_size)
        assert scored.tokens == 20 and not scored.bound
        assert scored.nats_per_token == pytest.approx(math.log(7), rel=1e-6)  # float32 log-softmax of 7 zeros
    assert scored.to_dict()["kind"] == "exact"


def test_a_sum_that_is_not_a_number_or_no_tokens_is_refused():
    with pytest.raises(DihalError, match="at least one token"):
        HeldOutNLL(float("nan"), 10, bound=False)
    with pytest.raises(DihalError, match="at least one token"):
        HeldOutNLL(1.0, 0, bound=True)


def test_logits_that_do_not_match_the_windows_are_refused():
    with pytest.raises(DihalError, match="one row per window token"):
        next_token_nll(lambda batch: torch.zeros(len(batch), 3, 7), torch.zeros(2, 4, dtype=torch.long))


def test_the_intact_backbone_through_the_hybrid_path_is_the_backbone_itself(llama_backbone):
    """Scored from the start token, every window token predicted: the same sum as the backbone's
    teacher-forced NLL of the windows with the start token before them (float32 logits, float64 sums)."""
    windows = torch.randint(FIRST, 60, (6, 9), generator=torch.Generator().manual_seed(1))
    scored = hybrid_test_nll(intact_control(llama_backbone), windows, batch_size=4)
    direct = teacher_forced_nll(llama_backbone.logits, with_start(windows, start_token_id(llama_backbone.tokenizer)))
    assert not scored.bound and scored.tokens == direct["tokens"] == 54
    assert scored.nll_sum == pytest.approx(direct["nll_sum"], rel=1e-5)


class NoisyBridge:
    """A stand-in lower stack whose output depends on the noise seed, as an ancestral bridge's does."""

    def __init__(self):
        self.target_mean = torch.zeros(1)

    def sample(self, cond, steps=None, *, sink=None, generator=None):
        return cond + torch.randn(cond.shape, generator=generator)


def test_a_bridge_whose_states_follow_its_noise_is_labelled_a_bound(llama_backbone, monkeypatch):
    import dihal_bench.hybrid.model as model

    monkeypatch.setattr(model, "HiddenStateBridge", NoisyBridge)  # given a generator, as a real bridge is
    noisy = HybridLM(llama_backbone, NoisyBridge(), 1, sink_passthrough=False)
    windows = torch.randint(FIRST, 60, (2, 5), generator=torch.Generator().manual_seed(2))
    assert hybrid_test_nll(noisy, windows).bound


def exact_log_probs(x_t: torch.Tensor) -> torch.Tensor:
    """log p(x₀ | x_t) of the chain's windows (mask id 16): its forward-backward posterior given
    nothing at the masked positions and the observed state at the others."""
    masked = x_t == CHAIN.states
    observed = torch.nn.functional.one_hot(x_t.clamp_max(CHAIN.states - 1), CHAIN.states).bool()
    evidence = torch.where(masked[..., None] | observed, 0.0, float("-inf")).double()
    return CHAIN.posterior(evidence).log()


def within_standard_errors(estimates: torch.Tensor, expected: torch.Tensor, errors: float = 4.0) -> bool:
    """Whether the mean of the per-window ``estimates`` is within ``errors`` standard errors of the
    mean of the per-window ``expected`` values (the windows are independent draws)."""
    difference = estimates - expected
    return abs(difference.mean().item()) <= errors * difference.std().item() / math.sqrt(len(difference))


def test_the_bound_with_the_exact_posterior_is_the_chains_nll():
    """The masked-diffusion bound is tight for the exact denoiser: its expectation over t and the
    masks is −log p(window) (the chain's exact NLL)."""
    windows = CHAIN.sample(256, 10, torch.Generator().manual_seed(3))
    bound = masked_diffusion_bound(exact_log_probs, windows, CHAIN.states, torch.Generator().manual_seed(0), 8)
    assert within_standard_errors(bound, chain_nll(windows))


def test_the_bound_of_a_denoiser_that_ignores_its_input_is_its_unigram_nll():
    """Given nothing but the mask, each masked token costs −log π(x): in expectation the 1/t weight
    undoes the masking rate t, and the bound is Σᵢ −log π(xᵢ) exactly, above the chain's own NLL."""
    log_pi = torch.log_softmax(torch.randn(CHAIN.states, generator=torch.Generator().manual_seed(4)).double(), 0)

    def unigram(x_t: torch.Tensor) -> torch.Tensor:
        observed = torch.nn.functional.one_hot(x_t.clamp_max(CHAIN.states - 1), CHAIN.states).bool()
        carried = torch.where(observed, 0.0, float("-inf")).double()
        return torch.where((x_t == CHAIN.states)[..., None], log_pi.expand(*x_t.shape, -1), carried)

    windows = CHAIN.sample(256, 10, torch.Generator().manual_seed(5))
    bound = masked_diffusion_bound(unigram, windows, CHAIN.states, torch.Generator().manual_seed(1), 8)
    expected = -log_pi[windows].sum(1)
    assert within_standard_errors(bound, expected)
    assert bound.mean() > chain_nll(windows).mean() + 1.0


# -- trained on the chain: the known entropy rate ------------------------------------------------

TINY = {"d_model": 32, "layers": 2, "heads": 2}
#: 320 training windows of 16 states, 15 passes in 300 steps of 16
CHAIN_BUDGET = Budget(steps=300, batch_size=16, seq_len=16, lr=3e-3, epochs=15, seed=0)


@pytest.fixture(scope="module")
def chain_windows() -> tuple[torch.Tensor, torch.Tensor]:
    """(training, test) windows of 16 chain states as token ids of the tiny backbone."""
    train = CHAIN.sample(CHAIN_BUDGET.distinct_sequences, 16, torch.Generator().manual_seed(6))
    test = CHAIN.sample(128, 16, torch.Generator().manual_seed(7))
    return train + FIRST, test + FIRST


def per_window(method, windows: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """The method's test NLL of each window alone (n,), in nats."""
    return torch.tensor([method.test_nll(window[None], seed).nll_sum for window in windows], dtype=torch.float64)


def test_an_ar_model_trained_on_the_chain_approaches_its_entropy_rate(llama_backbone, chain_windows):
    """Exact likelihood: never below the chain's own NLL of the same windows beyond noise (its excess
    is a KL divergence in expectation), and after 300 steps within 0.1 nats per token of it."""
    train, test = chain_windows
    model = ARScratch(llama_backbone, CHAIN_BUDGET, seed=0, **TINY)
    model.fit(train, progress=False)
    scored = model.test_nll(test, seed=0)
    assert not scored.bound and scored.tokens == test.numel()
    model_nll, exact = per_window(model, test), chain_nll(test - FIRST)
    assert scored.nll_sum == pytest.approx(model_nll.sum().item(), rel=1e-5)
    excess = (model_nll - exact) / test.shape[1]
    assert excess.mean() > -4 * excess.std() / math.sqrt(len(excess))
    assert excess.mean() < 0.1, f"{excess.mean():.3f} nats per token above the chain"


def test_mdlms_bound_on_the_chain_stays_above_the_exact_nll_and_falls_with_training(llama_backbone,
                                                                                     chain_windows):
    train, test = chain_windows
    exact = chain_nll(test - FIRST)
    untrained = MDLM(llama_backbone, CHAIN_BUDGET, seed=0, **TINY, steps=8)
    untrained.build_for(train)
    untrained.trained = True
    model = MDLM(llama_backbone, CHAIN_BUDGET, seed=0, **TINY, steps=8)
    model.fit(train, progress=False)
    before, after = per_window(untrained, test), per_window(model, test)
    assert model.test_nll(test, seed=0).bound
    excess = (after - exact) / test.shape[1]
    assert excess.mean() > -4 * excess.std() / math.sqrt(len(excess))
    # untrained it is log 16 = 2.77 nats per token (a uniform denoiser); 1.98 after 300 steps, measured
    assert after.mean() < before.mean() - 0.5 * test.shape[1]


def test_an_ar_rows_exact_nll_is_its_training_loss_on_the_same_windows(llama_backbone, chain_windows):
    """ar-scratch and ar-lora are trained on the mean next-token cross-entropy of all T tokens of a
    window, the first from their start: their test NLL of windows is that loss times the tokens
    (in eval mode; float32 logits, float64 sums)."""
    from dihal_builtin.baselines.ar_lora import ARLoRA

    train, test = chain_windows
    scratch = ARScratch(llama_backbone, CHAIN_BUDGET, seed=0, **TINY)
    scratch.build_for(train)
    lora = ARLoRA(llama_backbone, Budget(steps=1, batch_size=4, seq_len=16, param_allowance=20_000), seed=0)
    for model in (scratch, lora):
        model.module().eval()
        batch = {key: value[:8] for key, value in model.training_data(test).items()}
        with torch.no_grad():
            loss = model.loss(batch, torch.Generator().manual_seed(0)).item()
        scored = model.test_nll(test[:8], seed=0)
        assert not scored.bound and scored.nats_per_token == pytest.approx(loss, rel=1e-5), model.name


def test_ar2diff_loras_bound_is_log_v_when_its_head_says_nothing(llama_backbone):
    """With every logit 0 the denoiser is uniform over the V ids: each masked token costs log V, and each
    draw's (L/k)·k·log V is L·log V exactly, so the bound is log V per token whatever the draws (float32
    log-softmax of equal logits)."""
    from dihal_builtin.baselines.ar2diff_lora import AR2DiffLoRA

    model = AR2DiffLoRA(llama_backbone, Budget(steps=1, batch_size=4, seq_len=12, param_allowance=20_000), seed=0)
    head = model.lm.get_output_embeddings()
    kept = {name: value.detach().clone() for name, value in head.named_parameters()}
    windows = torch.randint(FIRST, 60, (5, 12), generator=torch.Generator().manual_seed(8))
    try:  # the rival's copy shares its weights with the module's backbone: put them back
        with torch.no_grad():
            for value in head.parameters():
                value.zero_()
        scored = model.test_nll(windows, seed=0, batch_size=2)
    finally:
        with torch.no_grad():
            for name, value in head.named_parameters():
                value.copy_(kept[name])
    assert scored.bound and scored.tokens == 60
    assert scored.nats_per_token == pytest.approx(math.log(head.weight.shape[0]), rel=1e-6)


# -- a Gaussian diffusion over embeddings: Diffusion-LM's bound -------------------------------------

#: three tokens drawn independently at each position, their embeddings orthogonal and far apart
MIXTURE = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
TABLE = 4.0 * torch.eye(3, dtype=torch.float64)
#: Diffusion-LM's σ₀ = √(1 − ᾱ(0)) under its sqrt schedule
SIGMA_0 = math.sqrt(1.0 - float(sqrt_alpha_bar(torch.tensor(0.0, dtype=torch.float64))))


def exact_x0(z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """E[x₀ | z_t] at each position of z (n, L, 3), x₀ ~ N(TABLE[w], σ₀²I), w ~ MIXTURE: given w,
    z_t ~ N(a·e_w, s²I) (a² = ᾱ, s² = 1 − ᾱ + ᾱσ₀²) and E[x₀ | z_t, w] = (b²·e_w + a·σ₀²·z_t)/s²
    with b² = 1 − ᾱ, weighted by the posterior over w."""
    z, alpha = z.double(), sqrt_alpha_bar(t.double())[:, None, None]
    a, b2 = alpha.sqrt(), 1.0 - alpha
    s2 = b2 + alpha * SIGMA_0 ** 2
    log_posterior = MIXTURE.log() - (z[:, :, None, :] - a[..., None] * TABLE).pow(2).sum(-1) / (2 * s2)
    return (b2 * (log_posterior.softmax(-1) @ TABLE) + a * SIGMA_0 ** 2 * z) / s2


def rounding(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.double() @ TABLE.T, -1)


def mixture_windows(n: int, length: int, seed: int) -> torch.Tensor:
    draws = torch.multinomial(MIXTURE, n * length, replacement=True, generator=torch.Generator().manual_seed(seed))
    return draws.view(n, length)


def test_the_gaussian_bound_with_the_exact_posterior_mean_falls_to_the_nll_as_steps_grow():
    """Tight in the limit: with the exact E[x₀ | z_t] and a rounding that reads w without error (the
    embeddings are 5.7 apart, σ₀ = 0.1) the chain's only slack is its discretisation, so the bound
    is above −log p(window) at 10 steps and within noise of it at 1,000 (measured: 0.59, 0.12, 0.03
    nats per window above it at 10, 50, 1,000 steps, with a standard error of 0.03)."""
    ids = mixture_windows(2000, 2, seed=0)
    nll = -MIXTURE.log()[ids].sum(1)

    def bound(steps: int) -> torch.Tensor:
        return gaussian_diffusion_bound(exact_x0, rounding, ids, TABLE[ids], sqrt_alpha_bar, SIGMA_0, steps,
                                        torch.Generator().manual_seed(1), 8)

    coarse, fine = bound(10), bound(1000)
    assert within_standard_errors(fine, nll)
    assert not within_standard_errors(coarse, nll) and coarse.mean() > fine.mean()


def test_the_gaussian_bound_of_a_denoiser_that_guesses_nothing_is_far_above_the_nll():
    """A denoiser that predicts x̂₀ = 0 everywhere: still a bound (every term is a KL divergence or a
    cross-entropy), so never below the NLL, and well above it."""
    ids = mixture_windows(500, 2, seed=2)
    bound = gaussian_diffusion_bound(lambda z, t: torch.zeros_like(z), rounding, ids, TABLE[ids], sqrt_alpha_bar,
                                     SIGMA_0, 100, torch.Generator().manual_seed(3), 8)
    assert bound.mean() > -MIXTURE.log()[ids].sum(1).mean() + 10.0


class ExactDenoiser(torch.nn.Module):
    def forward(self, z: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return exact_x0(z, t).to(z.dtype)


def test_diffusion_lms_bound_is_the_mixtures_nll_with_its_exact_denoiser(llama_backbone):
    """Through the baseline: backbone ids mapped to its compact vocabulary, its table as the
    embeddings and the rounding, its σ₀, schedule and steps. With the mixture's table and exact
    denoiser put in, 1,000 steps give the mixture's NLL per token (float32 denoiser outputs)."""
    from dihal_builtin.baselines.diffusion_lm import DiffusionLM

    tokens = torch.tensor([FIRST, FIRST + 1, FIRST + 2])
    model = DiffusionLM(llama_backbone, Budget(steps=1, batch_size=4, seq_len=2, param_allowance=50_000), seed=0,
                        embed_dim=3, d_model=8, layers=1, heads=2, steps=1000)
    model.build_for(tokens[None])
    model.trained = True
    with torch.no_grad():
        model.parts["embeddings"].weight.copy_(TABLE)
    model.parts["denoiser"] = ExactDenoiser()
    ids = mixture_windows(1000, 2, seed=4)
    scored = model.test_nll(tokens[ids], seed=5, batch_size=250)
    per_token = -MIXTURE.log()[ids].mean().item()
    assert scored.bound and scored.tokens == ids.numel()
    # the estimate's standard error is 0.021 nats per token here (0.03 per window at 2,000 windows, above),
    # and a 1,000-step chain's own slack 0.015: within 4 standard errors of that (measured: 0.042)
    excess = scored.nats_per_token - per_token
    assert -4 * 0.021 < excess < 0.015 + 4 * 0.021
