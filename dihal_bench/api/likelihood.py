"""Held-out likelihoods (docs/method.md#test-nll): what a method says its test windows cost.

Every method that has a likelihood scores the same windows the same way: all T tokens of each
window, in nats, an autoregressive method predicting the first from its start (the start token,
or a learned start vector), a diffusion method bounding −log p(window) by its own ELBO. The sum
over windows divided by the tokens scored is the row's ``test_nll`` in nats per token of the
backbone's tokenizer, labelled ``exact`` or ``bound`` (an upper bound on the NLL).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dihal_bench.errors import DihalError

#: windows (n, T) -> logits (n, T, V) whose row t predicts token t of the window from the tokens before it
NextTokenLogits = Callable[[Tensor], Tensor]
#: draws per held-out window of a masked-diffusion bound (`masked_diffusion_bound`)
BOUND_DRAWS = 8


@dataclass(frozen=True)
class HeldOutNLL:
    """Σ −log p over the scored tokens (``nll_sum``, nats), how many tokens that is, and whether the
    sum is an upper bound (an ELBO, or one fixed draw of a noisy model's noise) or exact."""

    nll_sum: float
    tokens: int
    bound: bool

    def __post_init__(self) -> None:
        if self.tokens < 1 or not self.nll_sum >= 0:  # `not >=` also refuses NaN
            raise DihalError(f"a held-out NLL needs at least one token and a sum ≥ 0, got {self.nll_sum} "
                             f"over {self.tokens} tokens")

    @property
    def nats_per_token(self) -> float:
        return self.nll_sum / self.tokens

    def to_dict(self) -> dict:
        return {"nats_per_token": self.nats_per_token, "nll_sum": self.nll_sum, "tokens": self.tokens,
                "kind": "bound" if self.bound else "exact"}


def with_start(windows: Tensor, start: int) -> Tensor:
    """``windows`` (n, T) with the token ``start`` before each: (n, T + 1)."""
    return torch.cat([torch.full_like(windows[:, :1], start), windows], dim=1)


@torch.no_grad()
def next_token_nll(logits_of: NextTokenLogits, windows: Tensor, batch_size: int = 16, *,
                   bound: bool = False) -> HeldOutNLL:
    """Σ_t −log p(x_t | x_<t) over every token of every window, accumulated in float64 so that
    the sum does not depend on the batch size beyond each batch's float32 rounding."""
    total = torch.zeros((), dtype=torch.float64)
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size]
        logits = logits_of(batch).float()
        if logits.shape[:2] != batch.shape:
            raise DihalError(f"next-token logits of shape {tuple(logits.shape)} for windows {tuple(batch.shape)}: "
                             f"one row per window token is needed")
        nll = F.cross_entropy(logits.flatten(0, 1), batch.to(logits.device).flatten(), reduction="none")
        total += nll.double().sum().cpu()
    return HeldOutNLL(total.item(), windows.numel(), bound)


def stratified(n: int, draws: int, high: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """(n, draws) integers in 1..``high``, each row one draw from each of ``draws`` equal strata of
    [0, 1) scaled to 1..high: averaged over a row, an unbiased estimate of a mean over k uniform in
    1..high, with less variance than as many independent draws."""
    u = torch.rand((n, draws), generator=generator, device=device, dtype=torch.float64)
    return ((torch.arange(draws, device=device) + u) / draws * high).floor().long() + 1


def masked_diffusion_bound(log_probs_of: Callable[[Tensor], Tensor], x0: Tensor, mask_id: int, generator: torch.Generator,
                           draws: int) -> Tensor:
    """Each window's continuous-time bound on −log p_θ(x₀) (n,), float64, in nats, estimated with
    ``draws`` draws per window.

    The bound is ∫₀¹ (1/t)·E[Σ over the masked positions of −log p_θ(x₀ᵢ | x_t)] dt, each of the L
    positions masked with probability t. Given that k positions are masked they are a uniform
    k-subset, and ∫₀¹ (1/t)·C(L, k)·tᵏ(1 − t)^(L−k) dt = 1/k, so the same bound is

        E over k uniform in 1..L and a uniform k-subset S of (L/k)·Σ_{i∈S} −log p_θ(x₀ᵢ | x₀ with S masked),

    which is what is drawn here (k stratified over the draws): the 1/t weight's heavy tail near t = 0
    becomes a weight of at most L. With the exact posterior as denoiser its expectation is −log p(x₀)
    itself (the bound is tight); with a denoiser that ignores its input, that denoiser's NLL."""
    n, length = x0.shape
    counts = stratified(n, draws, length, generator, x0.device)
    total = torch.zeros(n, dtype=torch.float64, device=x0.device)
    for k in range(draws):
        count = counts[:, k]
        # the ranks of a uniform random permutation: the `count` lowest are a uniform count-subset
        ranks = torch.rand((n, length), generator=generator, device=x0.device).argsort(-1).argsort(-1)
        masked = ranks < count[:, None]
        log_p = log_probs_of(x0.masked_fill(masked, mask_id)).gather(-1, x0[..., None])[..., 0].double()
        total += torch.where(masked, -log_p, 0.0).sum(-1) * length / count
    return (total / draws).cpu()


@torch.no_grad()
def bound_nll(bound_of: Callable[[Tensor, torch.Generator], Tensor], windows: Tensor, seed: int,
              batch_size: int = 16) -> HeldOutNLL:
    """A diffusion method's bound summed over ``windows`` (n, T): ``bound_of``(batch, generator) gives
    each window's bound (as `masked_diffusion_bound` or `gaussian_diffusion_bound` do), ``batch_size``
    windows at a time, all draws from one generator seeded with ``seed``."""
    generator = torch.Generator(device=windows.device).manual_seed(seed)
    total = sum(bound_of(windows[first:first + batch_size], generator).sum().item()
                for first in range(0, len(windows), batch_size))
    return HeldOutNLL(total, windows.numel(), bound=True)


def masked_diffusion_nll(log_probs_of: Callable[[Tensor], Tensor], windows: Tensor, mask_id: int, seed: int,
                         batch_size: int = 16) -> HeldOutNLL:
    """The bound of `masked_diffusion_bound` summed over ``windows`` (n, T), `BOUND_DRAWS` draws per window."""
    return bound_nll(lambda batch, generator: masked_diffusion_bound(log_probs_of, batch, mask_id, generator,
                                                                     BOUND_DRAWS), windows, seed, batch_size)


def gaussian_diffusion_bound(predict_x0: Callable[[Tensor, Tensor], Tensor],
                             decoder_log_probs: Callable[[Tensor], Tensor], ids: Tensor, embeddings: Tensor,
                             alpha_bar: Callable[[Tensor], Tensor], sigma_0: float, steps: int,
                             generator: torch.Generator, draws: int) -> Tensor:
    """Each window's bound on −log p_θ(w) (n,), float64, in nats, for a Gaussian diffusion over
    token embeddings with x̂₀-prediction, estimated with ``draws`` draws per window.

    The forward process is the method's own: x₀ ~ N(Emb(w), σ₀²I), z_t ~ N(√ᾱ(t)·x₀, (1 − ᾱ(t))I),
    so given w, z_t ~ N(a_t·e, s_t²I) with e = Emb(w) (``embeddings``, (n, L, d)), a_t = √ᾱ(t) and
    s_t² = 1 − ᾱ(t) + ᾱ(t)σ₀². The model is the ``steps``-step chain from z₁ ~ N(0, I) down to
    z₀ at t = k/steps, each step the posterior q(z_s | z_t, e = ê) (Kingma et al. 2021, VDM), where
    ê is E[e | z_t] implied by the denoiser's x̂₀ = ``predict_x0``(z_t, t) ≈ E[x₀ | z_t]:

        E[x₀ | z_t] = (b²/s²)·E[e | z_t] + (a·σ₀²/s²)·z_t,  b² = 1 − ᾱ(t),  so  ê = (s²·x̂₀ − a·σ₀²·z_t)/b²;

    then w from z₀ by ``decoder_log_probs`` (n, L, V) of x̂₀(z₀, 0), the method's rounding. The bound is

        KL(q(z₁ | w) ‖ N(0, I))  +  (steps/2)·E_k[(SNR(s) − SNR(t))·‖e − ê(z_t, t)‖²]  +  E[−log p(w | z₀)],

    SNR = a²/s², k uniform in 1..steps (stratified over the draws), t = k/steps, s = (k − 1)/steps.
    With the exact posterior mean as denoiser and a decoder that reads w exactly, it approaches
    −log p(w) as the steps grow (the reverse chain then is the forward one reversed)."""
    n = len(embeddings)
    e = embeddings.double()
    device = e.device

    def at(t: float | Tensor) -> tuple[Tensor, Tensor]:
        """ᾱ(t) and s_t² at a time or at each row's time (n,)."""
        signal = alpha_bar(torch.as_tensor(t, dtype=torch.float64, device=device))
        return signal, 1.0 - signal + signal * sigma_0 ** 2

    def noisy(signal: Tensor, variance: Tensor) -> Tensor:
        noise = torch.randn(e.shape, generator=generator, device=device, dtype=torch.float64)
        return signal.sqrt() * e + variance.sqrt() * noise

    signal_1, variance_1 = at(1.0)
    prior = 0.5 * (variance_1 + signal_1 * e.pow(2) - 1.0 - variance_1.log()).sum((1, 2))
    ks = stratified(n, draws, steps, generator, device)
    diffusion = torch.zeros(n, dtype=torch.float64, device=device)
    for draw in range(draws):
        t = ks[:, draw].double() / steps
        (signal_t, variance_t), (signal_s, variance_s) = at(t), at(t - 1.0 / steps)
        z = noisy(signal_t[:, None, None], variance_t[:, None, None])
        x0_hat = predict_x0(z.to(embeddings.dtype), t.to(embeddings.dtype)).double()
        b2, a = (1.0 - signal_t)[:, None, None], signal_t.sqrt()[:, None, None]
        e_hat = (variance_t[:, None, None] * x0_hat - a * sigma_0 ** 2 * z) / b2
        weight = signal_s / variance_s - signal_t / variance_t
        diffusion += steps / 2 * weight * (e - e_hat).pow(2).sum((1, 2))
    signal_0, variance_0 = at(0.0)
    reconstruction = torch.zeros(n, dtype=torch.float64, device=device)
    for _ in range(draws):
        z0 = noisy(signal_0, variance_0).to(embeddings.dtype)
        x0_hat = predict_x0(z0, torch.zeros(n, device=device, dtype=embeddings.dtype))
        log_p = decoder_log_probs(x0_hat).gather(-1, ids[..., None])[..., 0].double()
        reconstruction -= log_p.sum(-1)
    return (prior + diffusion / draws + reconstruction / draws).cpu()

