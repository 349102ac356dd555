"""Diffusion-LM (Li et al. 2022, arXiv 2205.14217): continuous diffusion over learned token embeddings."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import BOUND_DRAWS, HeldOutNLL, bound_nll, gaussian_diffusion_bound
from dihal_bench.api.sampling import NO_DRAW
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_builtin.baselines import flops

from .common import (
    CompactVocabulary,
    Denoiser,
    DiffusionBaseline,
    DiffusionOptions,
    best_scoring_rows,
    check_positions,
    denoiser_width,
    rounding_cross_entropy,
    seeded_init,
)
from .schedules import noised, reverse_chain, sqrt_alpha_bar


@dataclass(frozen=True)
class DiffusionLMOptions(DiffusionOptions):
    """Diffusion-LM's options, besides max_len, steps and eta (see DiffusionOptions)."""

    embed_dim: int = 32  # d of the learned embedding space (the paper: 16 on E2E, 128 on ROCStories)
    d_model: int | None = None  # denoiser width; None: sized to the budget's parameter allowance
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    clamp: bool = True  # the clamping trick
    positions: str = "learned"  # learned absolute, as in Diffusion-LM's reference transformer; "rotary": as MDLM's denoiser
    clamp_final: bool = True  # with clamp, tokens are read from the clamped last x̂₀, as the reference code does
    rounding_tokens: int = 64  # positions per step scored by the rounding cross-entropy
    anchor_share: float = 1 / 16  # probability that a training sequence draws t = 0, the anchor term


class DiffusionLM(DiffusionBaseline):
    """Diffusion-LM: Gaussian diffusion over learned token embeddings, trained end to end.

    Kept from the paper: embeddings Emb (V × d) learned jointly with the denoiser, with
    q(x₀ | w) = N(Emb(w), σ₀²I); the sqrt schedule ᾱ(t) = 1 − √(t + s), s = 1e-4, so σ₀ =
    √(1 − ᾱ(0)) = 0.1; x₀-prediction with the end-to-end simple loss

        L = ‖f(x_t, t) − x₀‖² + ‖Emb(w) − f(x_{t=0}, 0)‖² − log p(w | x₀),
        p(w | x) = softmax(x · Embᵀ)  (rounding through the tied embedding),

    each term a mean over positions (and dimensions for the squared errors); a bidirectional
    transformer denoiser with time conditioning and learned positions; the clamping trick
    (x̂₀ replaced by its nearest embedding at every step, the last one included, as the
    reference code's chain ends on the clamped x̂₀: ``clamp_final``) and argmax rounding of
    that final x̂₀. All T positions are generated in parallel, unconditionally.

    Adapted: the table covers the compact vocabulary, the V tokens of the training sequences
    (``common.CompactVocabulary``), not all of the backbone's; d = 32 by default, inside the
    paper's range of 16–128 (the table costs d·V parameters: 0.20M at V = 6,252, a SmolLM2
    training split's count, of the 2.29M allowance); the denoiser gets the rest (3 layers,
    d_model sized to the allowance) instead of BERT-base's 80M; dropout 0 instead of 0.1 for the
    few-hundred-step budget.
    Time is continuous: t ~ U(0, 1) per sequence, except that with probability
    ``anchor_share`` (1/16) a sequence draws t = 0 and is scored by the anchor term instead.
    That is the original's estimator, which meets the anchor when it draws the first of its
    T steps, with the probability raised from 1/T (T = 2,000) so that a short run sees it.
    Sampling walks ``steps`` (default 50) equal steps of t (the paper: 200 of 2,000) with ancestral
    x̂₀-parameterised steps (η = 1, the DDPM posterior at each sub-sampled step); η = 0 gives
    DDIM. The rounding cross-entropy is estimated on ``rounding_tokens`` positions per step
    (64 of a default step's 1,024; see ``rounding_cross_entropy``). The prior term
    ᾱ(1)·‖x₀‖² is dropped: ᾱ(1) ≈ 0.
    """

    name = "diffusion-lm"
    draw_precision = NO_DRAW  # tokens are an argmax (rounding), never drawn
    likelihood_options = ("steps",)  # its bound is of the chain of `steps` steps it samples with
    paper = "Li et al. 2022, Diffusion-LM Improves Controllable Text Generation, arXiv 2205.14217"
    options_class = DiffusionLMOptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        options = flops.settings(cls.options_class, work)
        return flops.account(flops.continuous(work, options, d_in_factor=1, table_role="rounding", self_condition=0.0,
                                              readout_trained=flops.TRAINED, clamp_steps=options.clamp))
    settings: DiffusionLMOptions

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.check_ranges(("steps", "rounding_tokens"), probabilities=("anchor_share",))
        check_positions(self.name, self.settings.positions, self.settings.heads, self.settings.d_model)
        self.sigma_0 = math.sqrt(1.0 - float(sqrt_alpha_bar(torch.tensor(0.0))))

    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        opts = self.settings

        def build(d_model: int) -> Denoiser:
            if d_model % opts.heads:
                raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
            return Denoiser(opts.embed_dim, opts.embed_dim, d_model, opts.layers, opts.heads, self.max_len,
                            opts.dropout, opts.positions)

        table = f"the {len(vocabulary):,}×{opts.embed_dim} embedding table"
        d_model = opts.d_model or denoiser_width(self.name, self.budget, len(vocabulary) * opts.embed_dim, table,
                                                 build, opts.heads)
        with seeded_init(self.seed):
            # N(0, 1) rows, as in the paper's code
            embeddings = nn.Embedding(len(vocabulary), opts.embed_dim).to(self.backbone.device)
            return {"denoiser": build(d_model).to(self.backbone.device), "embeddings": embeddings}

    def sampling_options(self) -> dict:
        return {**super().sampling_options(), "clamp": self.settings.clamp, "clamp_final": self.settings.clamp_final}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        ids = batch["ids"]
        emb = self.parts["embeddings"](ids)

        def gaussian() -> Tensor:
            return torch.randn(emb.shape, generator=generator, device=emb.device, dtype=emb.dtype)

        x0 = emb + self.sigma_0 * gaussian()
        # The anchor term is the squared error at the smallest t, t = 0, against Emb(w) itself.
        anchored = torch.rand(ids.shape[0], generator=generator, device=emb.device) < self.settings.anchor_share
        t = torch.rand(ids.shape[0], generator=generator, device=emb.device).masked_fill(anchored, 0.0)
        x_t = noised(x0, sqrt_alpha_bar(t)[:, None, None], gaussian())
        target = torch.where(anchored[:, None, None], emb, x0)
        squared_error = (self.parts["denoiser"](x_t, t) - target).pow(2).mean()
        rounding = rounding_cross_entropy(x0, ids, self.parts["embeddings"].weight, self.settings.rounding_tokens,
                                          generator)
        return squared_error + rounding

    def nearest_embedding(self, x: Tensor) -> Tensor:
        """The clamping trick: each vector replaced by its L2-nearest row of Emb
        (argmin ‖x − e‖² = argmax x·e − ½‖e‖²)."""
        table = self.parts["embeddings"].weight
        return table[best_scoring_rows(x, table, -0.5 * table.pow(2).sum(-1))]

    def final_estimate(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """The x̂₀ (n, seq_len, d) of the last step of one reverse chain (see ``sample_batch``),
        clamped to its nearest rows under ``clamp`` and ``clamp_final``.

        Why the last one too: the reference code's chain ends at t = 0, where the DDPM posterior
        mean is the (clamped) x̂₀ itself, and its tokens are read from that vector
        (XiangLi1999/Diffusion-LM, improved-diffusion/scripts/text_sample.py); read from the
        unclamped x̂₀ instead, the argmax of x̂₀·Embᵀ favours rows of large norm
        (docs/baseline-diagnosis.md)."""
        denoiser = self.parts["denoiser"]
        clamp = self.nearest_embedding if self.settings.clamp else None
        x0_hat = reverse_chain(lambda x_t, t, _previous: denoiser(x_t, t), (n, seq_len, self.settings.embed_dim),
                               self.steps, sqrt_alpha_bar, self.settings.eta, generator, bar, clamp=clamp)
        return clamp(x0_hat) if clamp is not None and self.settings.clamp_final else x0_hat

    def read_out(self, x0_hat: Tensor) -> Tensor:
        """Compact ids: argmax_w p(w | x̂₀) over the tokens it may emit."""
        return best_scoring_rows(x0_hat, self.parts["embeddings"].weight, banned=self.banned)

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        return self.read_out(self.final_estimate(n, seq_len, generator, bar))

    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """A bound: the ELBO of the ``steps``-step chain this row samples with, each step the
        posterior towards the denoiser's x̂₀, ending in the rounding p(w | x̂₀) (``gaussian_diffusion_bound``;
        the clamping trick is a sampling heuristic outside the model, so the bound leaves it out)."""
        self.module().eval()
        vocabulary, denoiser, table = self.built(), self.parts["denoiser"], self.parts["embeddings"].weight

        def bound_of(batch: Tensor, generator: torch.Generator) -> Tensor:
            ids = vocabulary.to_compact(batch)
            return gaussian_diffusion_bound(denoiser, lambda x: torch.log_softmax(F.linear(x, table), -1), ids,
                                            table[ids], sqrt_alpha_bar, self.sigma_0, self.steps, generator,
                                            BOUND_DRAWS)

        return bound_nll(bound_of, windows.to(self.backbone.device), seed, batch_size)


@hookimpl
def register_baselines(register):
    register(
        "diffusion-lm",
        DiffusionLM,
        description="Diffusion-LM: learned embeddings, sqrt schedule, x0-prediction, clamping trick (Li et al. 2022)",
    )
