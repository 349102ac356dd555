"""Noise schedules of continuous time t ∈ [0, 1], the x̂₀-parameterised reverse step and the
reverse chain that samples with it.

A schedule gives ᾱ(t), the signal fraction of the forward process
q(x_t | x₀) = N(√ᾱ(t)·x₀, (1 − ᾱ(t))·I): ᾱ falls from ≈1 at t=0 (clean) to ≈0 at t=1 (pure
noise). Both schedules are clipped below at ``ALPHA_BAR_MIN``, so that ᾱ(1) stays positive
where the formula reaches zero or below (the discrete originals clip β_t at 0.999 for the
same reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from tqdm.auto import tqdm

ALPHA_BAR_MIN = 1e-6


def sqrt_alpha_bar(t: Tensor, s: float = 1e-4) -> Tensor:
    """Diffusion-LM's sqrt schedule, ᾱ(t) = 1 − √(t + s) (Li et al. 2022, arXiv 2205.14217, §4.2).

    Noise rises steeply near t = 0: the initial noise std is √(1 − ᾱ(0)) = s^¼ = 0.1 for s = 1e-4.
    """
    return (1.0 - torch.sqrt(t + s)).clamp(min=ALPHA_BAR_MIN)


def cosine_alpha_bar(t: Tensor, s: float = 0.0) -> Tensor:
    """The cosine schedule, ᾱ(t) = cos²(π/2 · (t + s)/(1 + s)) / cos²(π/2 · s/(1 + s))
    (Nichol & Dhariwal 2021, arXiv 2102.09672); s = 0 gives cos²(πt/2), the form SED
    (arXiv 2211.04236) and LD4LG (arXiv 2212.09462) use."""
    angle = (t + s) / (1.0 + s) * (math.pi / 2)
    return (torch.cos(angle) ** 2 / math.cos(s / (1.0 + s) * math.pi / 2) ** 2).clamp(ALPHA_BAR_MIN, 1.0)


def noised(x0: Tensor, alpha_bar: Tensor, noise: Tensor) -> Tensor:
    """A draw of x_t ~ q(x_t | x₀): √ᾱ·x₀ + √(1 − ᾱ)·ε, with ᾱ broadcast against x₀."""
    return alpha_bar.sqrt() * x0 + (1.0 - alpha_bar).sqrt() * noise


def reverse_step(x_t: Tensor, x0_hat: Tensor, alpha_t: Tensor, alpha_s: Tensor, eta: float, noise: Tensor) -> Tensor:
    """x_s for s < t from x_t and a prediction x̂₀ (DDIM, Song et al. 2021, arXiv 2010.02502, eq. 12):

        ε̂   = (x_t − √ᾱ_t·x̂₀) / √(1 − ᾱ_t)
        σ   = η · √((1 − ᾱ_s)/(1 − ᾱ_t)) · √(1 − ᾱ_t/ᾱ_s)
        x_s = √ᾱ_s·x̂₀ + √(1 − ᾱ_s − σ²)·ε̂ + σ·z

    η = 0 is the deterministic DDIM step; η = 1 samples the DDPM posterior q(x_s | x_t, x̂₀),
    i.e. ancestral sampling on the sub-sampled chain.
    """
    eps_hat = (x_t - alpha_t.sqrt() * x0_hat) / (1.0 - alpha_t).sqrt()
    sigma = eta * torch.sqrt((1.0 - alpha_s) / (1.0 - alpha_t) * (1.0 - alpha_t / alpha_s).clamp(min=0.0))
    direction = (1.0 - alpha_s - sigma**2).clamp(min=0.0).sqrt()
    return alpha_s.sqrt() * x0_hat + direction * eps_hat + sigma * noise


def reverse_chain(predict_x0: Callable[[Tensor, Tensor, Tensor], Tensor], shape: tuple[int, int, int], steps: int,
                  alpha_bar: Callable[[Tensor], Tensor], eta: float, generator: torch.Generator, bar: tqdm,
                  self_condition: bool = False, clamp: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """x̂₀ at the end of a reverse chain from x₁ ~ N(0, I) of ``shape`` (n, L, d) over ``steps``
    equal steps of t, all draws from ``generator`` and on its device.

    At t = k/steps, k = steps, ..., 1: x̂₀ = predict_x0(x_t, t, previous), where previous is the
    x̂₀ of the step before under self-conditioning (zeros at the first step) and zeros without it;
    then, but at the last step, x_s = reverse_step(x_t, clamp(x̂₀), ᾱ(t), ᾱ(s), η, z) for
    s = (k − 1)/steps and z ~ N(0, I). ``clamp`` (None: the identity) maps only the estimate the
    step moves towards, not the one passed on or returned. ``bar`` advances once per step.
    """
    x = torch.randn(shape, generator=generator, device=generator.device)
    x0_hat = no_estimate = torch.zeros_like(x)
    for k in range(steps, 0, -1):
        t = torch.full((shape[0],), k / steps, device=x.device)
        x0_hat = predict_x0(x, t, x0_hat if self_condition else no_estimate)
        bar.update(1)
        if k > 1:
            s = torch.full((shape[0],), (k - 1) / steps, device=x.device)
            alpha_t, alpha_s = alpha_bar(t)[:, None, None], alpha_bar(s)[:, None, None]
            noise = torch.randn(x.shape, generator=generator, device=x.device)
            x = reverse_step(x, x0_hat if clamp is None else clamp(x0_hat), alpha_t, alpha_s, eta, noise)
    return x0_hat
