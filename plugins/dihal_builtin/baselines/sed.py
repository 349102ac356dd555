"""SED, Self-conditioned Embedding Diffusion (Strudel et al. 2022, arXiv 2211.04236):
continuous diffusion over fixed pretrained token embeddings, with self-conditioning."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
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
    check_embed_dim,
    check_positions,
    denoiser_width,
    pca_embeddings,
    rounding_cross_entropy,
    seeded_init,
)
from .schedules import cosine_alpha_bar, noised, reverse_chain


@dataclass(frozen=True)
class SEDOptions(DiffusionOptions):
    """SED's options, besides max_len, steps and eta (see DiffusionOptions)."""

    embed_dim: int = 32  # d of the fixed embedding space (the paper's best, Table 7)
    d_model: int | None = None  # denoiser width; None: sized to the budget's parameter allowance
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    self_condition: float = 0.5  # probability of the self-conditioned pass in training; 0 turns it off
    rounding_tokens: int = 64  # positions per step scored by the readout cross-entropy
    positions: str = "learned"  # learned absolute, as in Diffusion-LM's reference transformer; "rotary": as MDLM's denoiser
    detach_readout: bool = False  # the readout cross-entropy reads x̂₀ under stop-gradient (trains R only)
    clamp: bool = False  # Diffusion-LM's clamping trick at sampling: each step moves towards the nearest row of E


class SED(DiffusionBaseline):
    """SED: Gaussian diffusion over fixed pretrained embeddings, with self-conditioning.

    Kept from the paper: fixed embeddings, each rescaled to norm √d, bottlenecked at a small d
    with linear projections to and from the denoiser's width; the cosine schedule; the x₀ MSE
    plus a reconstruction cross-entropy of R·x̂₀ through a learnable readout R initialised to
    Eᵀ (trained, so its d·V parameters count); self-conditioning, the previous x̂₀ concatenated
    to x_t on the feature axis, trained on a random half of the steps (one coin per batch) by
    a first pass from zeros whose x̂₀ (under stop-gradient) conditions the second; sampling
    with self-conditioning; tokens are the argmax of R·x̂₀ at the last step. All T positions
    are generated in parallel, unconditionally (the paper's span masking and guidance serve
    conditional generation).

    Adapted: E is the backbone's own input table restricted to the compact vocabulary, the V
    tokens of the training sequences (``common.CompactVocabulary``), and projected to d by a
    fixed PCA of those rows (the paper took a 150M BERT's whole table); d = 32, the best size
    in the paper's Table 7 (the readout costs d·V: 0.20M at V = 6,252, a SmolLM2 training
    split's count, of the 2.29M allowance); the denoiser gets the rest (3 bidirectional layers,
    d_model sized to the allowance) instead of 135M; t is continuous with ᾱ(t) = cos²(πt/2),
    without the paper's small-noise offsets; sampling takes ``steps`` (default 50) equal steps of
    t (the paper: 1,000) with ancestral x̂₀-parameterised steps (η = 1); the readout
    cross-entropy is estimated on ``rounding_tokens`` positions per step; dropout 0; special
    tokens are never emitted.

    Off by default, for the diagnosis of issue 20 (docs/baseline-diagnosis.md): ``detach_readout``
    (the cross-entropy reads x̂₀ under stop-gradient, so x̂₀ is trained by the squared error
    alone) and ``clamp`` (Diffusion-LM's clamping trick onto the fixed rows of E).
    """

    name = "sed"
    draw_precision = NO_DRAW  # tokens are an argmax (rounding), never drawn
    paper = "Strudel et al. 2022, Self-conditioned Embedding Diffusion for Text Generation, arXiv 2211.04236"
    options_class = SEDOptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        options = flops.settings(cls.options_class, work)
        # a detached readout trains R alone: its forward and its weight gradient
        return flops.account(flops.continuous(work, options, d_in_factor=2, table_role="readout",
                                              self_condition=options.self_condition,
                                              readout_trained=2 if options.detach_readout else flops.TRAINED,
                                              clamp_steps=options.clamp))
    settings: SEDOptions

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.check_ranges(("steps", "rounding_tokens"), probabilities=("self_condition",))
        check_positions(self.name, self.settings.positions, self.settings.heads, self.settings.d_model)
        check_embed_dim(backbone, self.settings.embed_dim, self.name)

    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        opts, device = self.settings, self.backbone.device

        def build(d_model: int) -> Denoiser:
            if d_model % opts.heads:
                raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
            # reads concat[x_t, previous x̂₀]
            return Denoiser(2 * opts.embed_dim, opts.embed_dim, d_model, opts.layers, opts.heads, self.max_len,
                            opts.dropout, opts.positions)

        readout_size = f"the {opts.embed_dim}×{len(vocabulary):,} readout"
        d_model = opts.d_model or denoiser_width(self.name, self.budget, len(vocabulary) * opts.embed_dim,
                                                 readout_size, build, opts.heads)
        # fixed: not a component
        self.embeddings = pca_embeddings(self.backbone, opts.embed_dim, self.name, vocabulary.full_ids).to(device)
        with seeded_init(self.seed):
            denoiser = build(d_model).to(device)
            # R as an nn.Linear: its weight (V, d) is Rᵀ, so R = Eᵀ means weight = E
            readout = nn.Linear(opts.embed_dim, len(vocabulary), bias=False, device=device)
        with torch.no_grad():
            readout.weight.copy_(self.embeddings)
        return {"denoiser": denoiser, "readout": readout}

    def sampling_options(self) -> dict:
        return {**super().sampling_options(), "self_condition": self.settings.self_condition > 0,
                "clamp": self.settings.clamp}

    def denoise(self, x_t: Tensor, t: Tensor, previous: Tensor) -> Tensor:
        """x̂₀ from x_t and the previous estimate of x₀ (zeros when there is none)."""
        return self.parts["denoiser"](torch.cat([x_t, previous], dim=-1), t)

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        return sum(self.loss_terms(batch, generator).values())

    def loss_terms(self, batch: dict[str, Tensor], generator: torch.Generator) -> dict[str, Tensor]:
        """The x₀ squared error and the readout cross-entropy of one batch, whose sum is the loss."""
        ids = batch["ids"]
        x0 = self.embeddings[ids]
        t = torch.rand(ids.shape[0], generator=generator, device=x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device)
        x_t = noised(x0, cosine_alpha_bar(t)[:, None, None], noise)

        previous = torch.zeros_like(x0)
        if torch.rand(1, generator=generator, device=x0.device).item() < self.settings.self_condition:
            with torch.no_grad():
                previous = self.denoise(x_t, t, previous)
        x0_hat = self.denoise(x_t, t, previous)
        squared_error = (x0_hat - x0).pow(2).mean()
        read = x0_hat.detach() if self.settings.detach_readout else x0_hat
        readout = rounding_cross_entropy(read, ids, self.parts["readout"].weight, self.settings.rounding_tokens,
                                         generator)
        return {"squared_error": squared_error, "readout": readout}

    def nearest_row(self, x: Tensor) -> Tensor:
        """Each vector replaced by its L2-nearest row of the fixed table E; its rows all have norm
        √d, so that is the row of largest x·e."""
        return self.embeddings[best_scoring_rows(x, self.embeddings)]

    def final_estimate(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """The x̂₀ (n, seq_len, d) of the last step of one reverse chain (see ``sample_batch``)."""
        return reverse_chain(self.denoise, (n, seq_len, self.settings.embed_dim), self.steps, cosine_alpha_bar,
                             self.settings.eta, generator, bar, self_condition=self.settings.self_condition > 0,
                             clamp=self.nearest_row if self.settings.clamp else None)

    def read_out(self, x0_hat: Tensor) -> Tensor:
        """Compact ids: argmax of R·x̂₀ over the tokens it may emit."""
        return best_scoring_rows(x0_hat, self.parts["readout"].weight, banned=self.banned)

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        return self.read_out(self.final_estimate(n, seq_len, generator, bar))


@dataclass(frozen=True)
class SEDDetachedReadoutOptions(SEDOptions):
    detach_readout: bool = True


class SEDDetachedReadout(SED):
    """SED with the readout cross-entropy on a detached x̂₀: the squared error alone trains the
    denoiser, so x̂₀ estimates E[x₀ | x_t], which the reverse chain assumes. A row of its own
    beside ``sed`` rather than a changed default, since the paper's loss as this port reads it
    sends the cross-entropy's gradient into the denoiser (docs/baseline-diagnosis.md)."""

    name = "sed-detached-readout"
    paper = "a variant of SED (Strudel et al. 2022): the readout cross-entropy trains R only"
    options_class = SEDDetachedReadoutOptions


@hookimpl
def register_baselines(register):
    register(
        "sed",
        SED,
        description="SED: fixed PCA'd backbone embeddings, cosine schedule, self-conditioning (Strudel et al. 2022)",
    )
    register("sed-detached-readout", SEDDetachedReadout,
             description="variant: SED with the readout cross-entropy on a detached x̂₀ (the denoiser trained by its "
                         "x₀ squared error alone)")
