"""CoDAR (Shen, Zhao, He, Lin 2026, arXiv 2603.02547): continuous diffusion in an embedding space,
read out by an autoregressive decoder that rounds in context."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, check_sampling
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_builtin.baselines import flops

from .common import (
    CompactVocabulary,
    Denoiser,
    DiffusionBaseline,
    DiffusionOptions,
    TokenDecoder,
    check_embed_dim,
    embedding_table,
    pca_embeddings,
    seeded_init,
    width_for_allowance,
)
from .decoder_input import DecoderInputOption, NoiseInputControl
from .schedules import cosine_alpha_bar, noised, reverse_chain


@dataclass(frozen=True)
class CoDAROptions(DiffusionOptions):
    """CoDAR's options, besides max_len, steps and eta (see DiffusionOptions)."""

    embed_dim: int = 32  # d of the diffusion space: SED's, so the two differ in the rounding alone
    d_model: int | None = None  # width of denoiser and decoder; None: sized to the allowance
    heads: int = 4
    denoiser_layers: int = 3
    decoder_layers: int = 2
    dropout: float = 0.0
    negatives: int = 1024  # uniform tokens per step in the decoder's sampled softmax
    temperature: float = 1.0  # the decoder's; 0 is greedy: the fluency-diversity knob
    top_p: float = 1.0  # the decoder's nucleus
    decoder_input: str = "denoised"  # "noise": the control (decoder_input.py)


class CoDAR(DecoderInputOption, DiffusionBaseline):
    """CoDAR: Gaussian diffusion over a sequence of token embeddings; an autoregressive decoder then
    turns the denoised sequence into tokens ("contextualised rounding").

    Kept from the abstract (all that is public): diffusion stays continuous over x ∈ R^{T×d}; a
    Transformer decoder predicts each token from the previous tokens and from cross-attention
    over the whole denoised sequence; its temperature trades fluency for diversity.

    Our choices where the paper is not available:
    - vocabulary: the compact one, the tokens of the training sequences (``common.CompactVocabulary``),
      for the diffusion space and for the decoder's table alike; specials are never emitted.
    - space: SED's, the backbone's frozen input table projected to d = 32 by a fixed PCA, each
      row rescaled to norm √d (``common.pca_embeddings``); CoDAR reports that larger d hurts, and a
      shared space makes SED vs CoDAR a comparison of per-token against contextual rounding.
    - diffusion: ᾱ(t) = cos²(πt/2), x₀-prediction by MSE, the bidirectional denoiser the other
      baselines use (3 layers); no self-conditioning (not mentioned in the abstract).
    - decoder: LD4LG's TokenDecoder (``common.py``) (2 causal layers, cross-attention in every
      block, tied to the frozen full-width table through trainable projections, sampled-softmax
      cross-entropy); one width for denoiser and decoder, sized to the allowance.
    - joint training, loss = MSE + decoder cross-entropy, with the decoder reading the
      denoiser's own x̂₀ at the step's noise level, under stop-gradient. At sampling the decoder
      reads a denoised sequence, never a clean one, so it is trained on denoised ones: across
      noise levels they run from nearly exact (it learns to copy) to a blur of the mean (it
      learns to fall back on its own left context), which is what rounding in context needs.
      Stop-gradient keeps the denoiser's objective the plain diffusion loss.
    - sampling: ``steps`` (default 50) equal steps of t with ancestral x̂₀-parameterised steps
      (η = 1; 0 gives DDIM), then decoding of the final x̂₀ by the suite's one next-token sampler
      at ``temperature`` (default 1) and ``top_p``.

    ``decoder_input = "noise"`` is a control, not CoDAR (registered as ``codar-noise-input``): the
    decoder reads the chain's starting draw x₁ ~ N(0, I) of the same shape instead of the denoised
    sequence, and the denoiser is never called; what the row loses against ``codar`` is what the
    diffusion adds over the decoder's own left context.
    """

    name = "codar"
    paper = "Shen, Zhao, He, Lin 2026, CoDAR: continuous diffusion with an autoregressive decoder, arXiv 2603.02547"
    options_class = CoDAROptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        options = flops.settings(cls.options_class, work)
        return flops.account(flops.codar(work, options, noise_input=options.decoder_input == "noise"))
    settings: CoDAROptions
    token_sampling_options = ("temperature", "top_p")
    draw_precision = NEXT_TOKEN_PRECISION  # the token decoder draws through sample_next_token

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings
        self.check_ranges(("steps", "negatives"))
        check_embed_dim(backbone, opts.embed_dim, self.name)
        check_sampling(opts.temperature, opts.top_p)
        self.check_decoder_input()
        # the decoder's table is frozen, so the width does not depend on the vocabulary: sized now
        self.d_model = opts.d_model or width_for_allowance(self.name, budget, self.modules_of_width, opts.heads)

    def modules_of_width(self, d_model: int) -> nn.ModuleDict:
        opts = self.settings
        if d_model % opts.heads:
            raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
        return nn.ModuleDict({
            "denoiser": Denoiser(opts.embed_dim, opts.embed_dim, d_model, opts.denoiser_layers, opts.heads,
                                 self.max_len, opts.dropout),
            "decoder": TokenDecoder(self.backbone.width, opts.embed_dim, self.max_len, d_model, opts.decoder_layers,
                                    opts.heads, self.max_len, opts.dropout),
        })

    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        backbone = self.backbone
        # frozen, not components: the diffusion space, and the table the decoder reads and scores
        self.embeddings = pca_embeddings(backbone, self.settings.embed_dim, self.name, vocabulary.full_ids).to(
            backbone.device)
        self.table = embedding_table(backbone, vocabulary.full_ids)
        with seeded_init(self.seed):
            return dict(self.modules_of_width(self.d_model).to(backbone.device))

    def sampling_options(self) -> dict:
        opts = self.settings
        return {**super().sampling_options(), "temperature": opts.temperature, "top_p": opts.top_p}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        ids = batch["ids"]
        x0 = self.embeddings[ids]
        t = torch.rand(ids.shape[0], generator=generator, device=x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device)
        x0_hat = self.parts["denoiser"](noised(x0, cosine_alpha_bar(t)[:, None, None], noise), t)
        denoising = (x0_hat - x0).pow(2).mean()
        rounding = self.parts["decoder"].cross_entropy(ids, x0_hat.detach(), self.table, self.settings.negatives,
                                                       generator)
        return denoising + rounding

    def calls_per_batch(self, seq_len: int) -> int:
        return 0 if self.reads_noise else self.steps

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        opts = self.settings
        shape = (n, seq_len, opts.embed_dim)
        if self.reads_noise:
            # the draw reverse_chain starts from: under one seed the control decodes the x₁ the denoised row denoises
            x0_hat = torch.randn(shape, generator=generator, device=generator.device)
        else:
            x0_hat = reverse_chain(lambda x_t, t, _previous: self.parts["denoiser"](x_t, t), shape, self.steps,
                                   cosine_alpha_bar, opts.eta, generator, bar)
        return self.parts["decoder"].generate(x0_hat, self.table, seq_len, opts.temperature, opts.top_p, generator,
                                              banned=self.banned)


@dataclass(frozen=True)
class CoDARNoiseInputOptions(CoDAROptions):
    decoder_input: str = "noise"


class CoDARNoiseInput(NoiseInputControl, CoDAR):
    """The control row of CoDAR's diffusion (dihal_builtin.baselines.decoder_input)."""

    name = "codar-noise-input"
    paper = "a control of CoDAR (arXiv 2603.02547): its decoder reading noise instead of the denoised sequence"
    options_class = CoDARNoiseInputOptions


@hookimpl
def register_baselines(register):
    register(
        "codar",
        CoDAR,
        description="CoDAR: cosine x0-diffusion over PCA'd backbone embeddings, decoded by an autoregressive "
                    "decoder cross-attending to the denoised sequence (arXiv 2603.02547)",
    )
    register("codar-noise-input", CoDARNoiseInput,
             description="control: CoDAR's decoder reading N(0, I) instead of the denoised sequence (no denoiser call)")
