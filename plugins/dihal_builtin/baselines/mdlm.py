"""MDLM, masked (absorbing-state) diffusion language model (Sahoo et al. 2024, arXiv 2406.07524):
a bidirectional transformer over the compact vocabulary plus a mask token, trained on the
continuous-time masked-diffusion bound, sampled ancestrally from the fully masked sequence
(docs/rivals.md#mdlm)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL, masked_diffusion_nll
from dihal_bench.api.sampling import check_sampling
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_builtin.baselines import flops

from ..layers import bidirectional_blocks, through_blocks
from .common import (
    CompactVocabulary,
    DiffusionBaseline,
    DiffusionOptions,
    check_positions,
    seeded_init,
    width_for_allowance,
)

#: the smallest diffusion time drawn in training: the 1/t weight stays below 1,000 (the paper's sampling_eps)
TRAIN_T_MIN = 1e-3
#: where the reverse chain stops before the noise-removal step (the paper's sampler)
SAMPLE_T_MIN = 1e-5
#: std of the token and position embeddings at initialisation (GPT-2's); the output layer is tied to them
EMBEDDING_STD = 0.02

#: x_t (n, L) compact ids, the mask id among them -> log p_θ(x₀ | x_t) (n, L, V), SUBS applied
LogProbs = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class MDLMOptions(DiffusionOptions):
    """MDLM's options, besides max_len and steps (see DiffusionOptions; eta has no meaning here)."""

    d_model: int | None = None  # None: sized to the budget's parameter allowance
    layers: int = 4
    heads: int = 4
    dropout: float = 0.0
    positions: str = "rotary"  # one of layers.POSITIONS; "learned" is the port before issue 20's diagnosis
    temperature: float = 1.0  # applied to p_θ(x₀ | x_t) where a position is unmasked; 0 is greedy
    top_p: float = 1.0  # nucleus of p_θ(x₀ | x_t)


class MaskedDenoiser(nn.Module):
    """x_t (n, L) of ids 0..V, V the mask, -> logits (n, L, V) of x₀ over the V tokens.

    Bidirectional pre-LN blocks over token embeddings, with rotary positions (``positions =
    "rotary"``, the paper's) or learned absolute position vectors added to the input
    (``"learned"``), a final LayerNorm, and an output layer tied to the token embeddings. The mask
    has an input row but no output row: its logit is −∞, the first half of SUBS. Not conditioned
    on t: the paper found time conditioning unnecessary with SUBS, and it is what lets the sampler
    reuse an output while x_t stands still.

    Why rotary matters here: a masked position's own input is the mask, the same vector at every
    position, so everything it predicts comes through attention to its neighbours; with rotary
    positions "attend to the next token" is one relative pattern, with learned absolute vectors
    it must be learned for each position separately (docs/baseline-diagnosis.md#mdlm).
    """

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, max_len: int, dropout: float,
                 positions: str = "rotary"):
        super().__init__()
        self.vocab_size, self.heads, self.rotary = vocab_size, heads, positions == "rotary"
        self.token = nn.Embedding(vocab_size + 1, d_model)
        nn.init.normal_(self.token.weight, std=EMBEDDING_STD)
        if not self.rotary:
            self.position = nn.Embedding(max_len, d_model)
            nn.init.normal_(self.position.weight, std=EMBEDDING_STD)
        self.blocks = bidirectional_blocks(d_model, heads, dropout, layers, self.rotary)
        self.final_norm = nn.LayerNorm(d_model)

    def forward(self, x_t: Tensor) -> Tensor:
        h = self.token(x_t)
        if not self.rotary:
            h = h + self.position(torch.arange(x_t.shape[1], device=x_t.device))
        h = through_blocks(self.blocks, h, self.heads, self.rotary)
        return F.linear(self.final_norm(h), self.token.weight[: self.vocab_size])


def subs_log_probs(logits: Tensor, x_t: Tensor, mask_id: int) -> Tensor:
    """log p_θ(x₀ | x_t) under SUBS: log-softmax of ``logits`` (n, L, V) (no mask column, so the
    mask's logit is −∞) at masked positions; at unmasked ones the observed token with log 1 and
    every other token with log 0 = −∞ (unmasked tokens are carried over)."""
    log_probs = logits.float().log_softmax(-1)
    observed = x_t.clamp_max(mask_id - 1)[..., None]  # the mask's placeholder row is never used
    carried_over = torch.full_like(log_probs, float("-inf")).scatter(-1, observed, 0.0)
    return torch.where((x_t != mask_id)[..., None], carried_over, log_probs)


def diffusion_times(n: int, generator: torch.Generator, device: torch.device) -> Tensor:
    """The batch's t (n,): the low-discrepancy draw t_i = (i + u_i)/n, one in each stratum of
    [0, 1), squeezed into [TRAIN_T_MIN, 1] (the paper's antithetic sampling)."""
    u = torch.rand(n, generator=generator, device=device)
    stratified = (torch.arange(n, device=device) + u) / n
    return TRAIN_T_MIN + (1.0 - TRAIN_T_MIN) * stratified


def masked_diffusion_loss(log_probs_of: LogProbs, x0: Tensor, mask_id: int, generator: torch.Generator) -> Tensor:
    """The continuous-time bound per token for α_t = 1 − t: with t from ``diffusion_times`` and each
    position masked with probability 1 − α_t = t,

        L = mean over the n·L positions of −log p_θ(x₀ᵢ | x_t) / t

    (the weight −α'_t/(1 − α_t) = 1/t). SUBS makes an unmasked position's term log 1 = 0, so
    only the masked positions count, as in the paper's sum over masked positions."""
    n, length = x0.shape
    t = diffusion_times(n, generator, x0.device)
    masked = torch.rand((n, length), generator=generator, device=x0.device) < t[:, None]
    log_p = log_probs_of(x0.masked_fill(masked, mask_id)).gather(-1, x0[..., None])[..., 0]
    return -(log_p / t[:, None]).mean()


def token_probabilities(log_probs: Tensor, temperature: float, top_p: float, banned: list[int]) -> Tensor:
    """float64 probabilities (m, V) from log p_θ rows (m, V): the ``banned`` tokens removed, then
    softmax(log p / temperature) cut to its nucleus (the most probable tokens whose mass before
    them is below ``top_p``; the top one always stays), as ``dihal_bench.api.sampling`` does; at
    temperature 0 all mass on the most probable allowed token."""
    log_probs = log_probs.double()
    if banned:
        log_probs = log_probs.clone()
        log_probs[:, banned] = float("-inf")
    if temperature == 0:
        return F.one_hot(log_probs.argmax(-1), log_probs.shape[-1]).double()
    probs = torch.softmax(log_probs / temperature, dim=-1)
    if top_p < 1:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(mass_before >= top_p, 0.0))
        probs = kept / kept.sum(-1, keepdim=True)
    return probs


def inverse_cdf(probs: Tensor, fraction: Tensor) -> Tensor:
    """The category (m,) of each row of ``probs`` (m, V) whose cumulative mass first reaches
    ``fraction`` (m,) ∈ (0, 1] of the row's total: a draw when ``fraction`` is uniform on (0, 1].

    In float64: a category of probability p is reachable whenever p exceeds the row's rounding,
    ~1e-16, not ~1e-7 as in float32, where rare tokens, the tail a temperature of 1 should keep,
    would be drawn too seldom. A category of probability 0 is never returned (its cumulative
    mass equals its predecessor's, which reaches the threshold first)."""
    cdf = probs.double().cumsum(-1)
    threshold = fraction.double()[:, None] * cdf[:, -1:]
    return torch.searchsorted(cdf, threshold)[:, 0]


def ancestral_sample(log_probs_of: LogProbs, n: int, length: int, mask_id: int, steps: int, temperature: float,
                     top_p: float, banned: list[int], generator: torch.Generator, bar: tqdm | None = None) -> Tensor:
    """Compact ids (n, length), none banned, by the paper's ancestral sampler with caching.

    From x = all masks, for k = 0..steps−1 with t = t_k, s = t_{k+1} on steps + 1 equal points
    from 1 down to SAMPLE_T_MIN: each masked position is unmasked with probability
    (α_s − α_t)/(1 − α_t) = (t − s)/t and then takes a token drawn from p_θ(x₀ | x_t) at its
    position (``token_probabilities``, ``inverse_cdf``); unmasked positions are kept (SUBS).
    That is the paper's single draw from q(x_s | x_t, x̂₀) over the V tokens and the mask, taken
    in two float64 stages. The denoiser runs only in a step that unmasks a position, and only
    when x changed since its last call (the paper's caching: it does not read t). Last, the
    noise-removal step: positions still masked (each with probability SAMPLE_T_MIN) take their
    most probable token. ``bar`` advances once per step."""
    device = generator.device
    x = torch.full((n, length), mask_id, dtype=torch.long, device=device)
    times = torch.linspace(1.0, SAMPLE_T_MIN, steps + 1, dtype=torch.float64)
    log_probs = None
    for k in range(steps):
        t, s = times[k].item(), times[k + 1].item()
        masked = x == mask_id
        unmasking = masked & (torch.rand((n, length), generator=generator, device=device, dtype=torch.float64)
                              < (t - s) / t)
        if unmasking.any():
            if log_probs is None:
                log_probs = log_probs_of(x)
            probs = token_probabilities(log_probs[unmasking], temperature, top_p, banned)
            fraction = 1.0 - torch.rand(len(probs), generator=generator, device=device, dtype=torch.float64)
            x = x.masked_scatter(unmasking, inverse_cdf(probs, fraction))
            log_probs = None
        if bar is not None:
            bar.update(1)
    remaining = x == mask_id
    if remaining.any():
        if log_probs is None:
            log_probs = log_probs_of(x)
        x = x.masked_scatter(remaining, token_probabilities(log_probs[remaining], 0.0, 1.0, banned).argmax(-1))
    return x


class MDLM(DiffusionBaseline):
    """MDLM: absorbing-state (masked) diffusion over tokens, the SUBS parameterisation and the
    continuous-time bound.

    Kept from the paper: the forward process masks each token independently with probability
    1 − α_t, here the linear schedule α_t = 1 − t; SUBS, the mask's logit set to −∞ and unmasked
    tokens carried over unchanged; the continuous-time negative ELBO, −log p_θ(x₀ | x_t)
    weighted by −α'_t/(1 − α_t) = 1/t at masked positions (a mean over all positions, unmasked
    ones contributing 0), with low-discrepancy ("antithetic") t, one draw in each of the batch's n
    strata of [0, 1), scaled into [10⁻³, 1]; a bidirectional transformer denoiser not conditioned
    on t; ancestral sampling from the fully masked sequence over ``steps`` equal steps of t from
    1 to 10⁻⁵, each masked position unmasked with probability (t − s)/t and given a token drawn
    from p_θ, with caching (the denoiser runs only when a token changed) and a final
    noise-removal step (a position still masked takes its argmax); categorical draws in float64
    (float32 Gumbel noise lowers the effective temperature; Zheng et al. 2024, arXiv 2409.02908).

    Kept too: rotary positions (the paper's DiT), the default since issue 20's diagnosis; with
    learned absolute positions (``positions = "learned"``, the port before) the denoiser learned
    nothing of the known-answer chain in the matched budget (docs/baseline-diagnosis.md#mdlm).

    Adapted: the denoiser is small (4 bidirectional pre-LN layers, d_model sized to the allowance,
    the paper: a 12-layer DiT of width 768 with adaLN), with GELU MLPs and the output layer tied
    to the token embeddings (an untied
    V × d output would take ~40% of P at V = 6,252); its vocabulary is the compact one, the V
    tokens of the training sequences (``common.CompactVocabulary``), plus the mask; dropout 0
    (the paper: 0.1); the run's steps and lr are the matched budget's (the paper: 10⁶ steps of
    512 × 1,024 tokens); ``steps`` defaults to 50 and is set by the suite's diffusion steps (the
    paper: 1,000); ``temperature`` and ``top_p`` (default 1 and 1, the paper's sampler) reshape
    p_θ before a token is drawn from it, so the suite's settings reach this row too; special
    tokens are never drawn. The draw of q(x_s | x_t, x̂₀) is split in two exact stages (whether a
    position unmasks, then which token) so that only unmasking positions pay for a categorical
    draw. Under data-parallel training the t strata are those of each process's rows.
    """

    name = "mdlm"
    paper = "Sahoo et al. 2024, Simple and Effective Masked Diffusion Language Models, arXiv 2406.07524"
    options_class = MDLMOptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        options = flops.settings(cls.options_class, work)
        batch = int(work.sampling.get("batch_size", 32))
        return flops.account(flops.mdlm(work, options, SAMPLE_T_MIN, batch))
    settings: MDLMOptions
    token_sampling_options = ("temperature", "top_p")
    draw_precision = "float64"  # inverse_cdf: both stages of each draw in float64

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings
        self.check_ranges(("steps", "layers", "heads"))
        if opts.eta != 1.0:
            raise DihalError(f"{self.name}: eta has no meaning for masked diffusion (its sampler is ancestral); "
                             f"leave it at 1")
        check_positions(self.name, opts.positions, opts.heads, opts.d_model)
        check_sampling(opts.temperature, opts.top_p)

    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        opts = self.settings

        def build(d_model: int) -> MaskedDenoiser:
            return MaskedDenoiser(len(vocabulary), d_model, opts.layers, opts.heads, self.max_len, opts.dropout,
                                  opts.positions)

        d_model = opts.d_model or width_for_allowance(self.name, self.budget, build, opts.heads)
        with seeded_init(self.seed):
            return {"denoiser": build(d_model).to(self.backbone.device)}

    @property
    def mask_id(self) -> int:
        """The mask's id: the row after the V tokens of the compact vocabulary."""
        return len(self.built())

    def log_probs(self, x_t: Tensor) -> Tensor:
        """log p_θ(x₀ | x_t) (n, L, V) under SUBS."""
        return subs_log_probs(self.parts["denoiser"](x_t), x_t, self.mask_id)

    def sampling_options(self) -> dict:
        opts = self.settings
        return {"steps": self.steps, "vocabulary_size": len(self.built()), "temperature": opts.temperature,
                "top_p": opts.top_p, "caching": True, "noise_removal": True}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        return masked_diffusion_loss(self.log_probs, batch["ids"], self.mask_id, generator)

    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """A bound: the continuous-time ELBO of each window (``masked_diffusion_nll``) over the compact vocabulary."""
        self.module().eval()
        ids = self.built().to_compact(windows.to(self.backbone.device))
        return masked_diffusion_nll(self.log_probs, ids, self.mask_id, seed, batch_size)

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        opts = self.settings
        return ancestral_sample(self.log_probs, n, seq_len, self.mask_id, self.steps, opts.temperature, opts.top_p,
                                self.banned, generator, bar)


@hookimpl
def register_baselines(register):
    register(
        "mdlm",
        MDLM,
        description="MDLM: masked diffusion, SUBS, 1/t-weighted bound with antithetic t, cached ancestral sampling "
                    "(Sahoo et al. 2024)",
    )
