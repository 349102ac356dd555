"""LD4LG, latent diffusion for language (Lovelace et al. 2023, arXiv 2212.09462), rebuilt on the
frozen backbone."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, check_sampling
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import TrainResult, batch_indices, train
from dihal_builtin.baselines import flops

from ..layers import Block
from .common import (
    CompactVocabulary,
    Denoiser,
    DiffusionBaseline,
    DiffusionOptions,
    TokenDecoder,
    embedding_table,
    seeded_init,
    width_for_allowance,
)
from .decoder_input import DecoderInputOption, NoiseInputControl
from .schedules import cosine_alpha_bar, noised, reverse_chain

#: sequences per backbone forward pass while extracting features
FEATURE_BATCH = 16


class Compressor(nn.Module):
    """Backbone hidden states (n, T, width) -> ``latents`` vectors (n, latents, latent_dim), each of
    norm √latent_dim.

    Perceiver-Resampler style (LD4LG §3.1): learned queries run bidirectional blocks whose
    cross-attention reads the projected states (plus learned positions), then a LayerNorm and a
    projection to latent_dim, followed by L2 normalisation to norm √latent_dim.
    """

    def __init__(self, width: int, latents: int, latent_dim: int, d_model: int, layers: int, heads: int,
                 max_len: int, dropout: float):
        super().__init__()
        # evens out the backbone's per-token scale; an affine part would be redundant with in_proj
        self.in_norm = nn.LayerNorm(width, elementwise_affine=False)
        self.in_proj = nn.Linear(width, d_model)
        self.position = nn.Embedding(max_len, d_model)
        self.queries = nn.Parameter(0.02 * torch.randn(latents, d_model))
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, causal=False, cross=True) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, latent_dim)

    def forward(self, states: Tensor) -> Tensor:
        memory = self.in_proj(self.in_norm(states)) + self.position(torch.arange(states.shape[1], device=states.device))
        h = self.queries.expand(states.shape[0], -1, -1)
        for block in self.blocks:
            h = block(h, memory)
        z = self.out_proj(self.final_norm(h))
        return math.sqrt(z.shape[-1]) * F.normalize(z, dim=-1)


def x0_from_v(z_t: Tensor, alpha_bar: Tensor, v: Tensor) -> Tensor:
    """x̂₀ = √ᾱ·z_t − √(1 − ᾱ)·v, the inverse of v = √ᾱ·ε − √(1 − ᾱ)·x₀ given z_t = √ᾱ·x₀ + √(1 − ᾱ)·ε
    (Salimans & Ho 2022, arXiv 2202.00512)."""
    return alpha_bar.sqrt() * z_t - (1.0 - alpha_bar).sqrt() * v


@dataclass(frozen=True)
class LD4LGOptions(DiffusionOptions):
    """LD4LG's options, besides max_len, steps and eta (see DiffusionOptions)."""

    latents: int = 16  # ℓ, learned queries (the paper: 32)
    latent_dim: int = 64  # d_ae, as the paper
    d_model: int | None = None  # width of compressor, decoder and denoiser; None: sized to the allowance
    heads: int = 4
    compressor_layers: int = 1  # the paper: 3
    decoder_layers: int = 2
    denoiser_layers: int = 3  # the paper: 12
    feature_layer: int | None = None  # hidden-state index the compressor reads; None: after the final norm
    dropout: float = 0.0
    autoencoder_fraction: float = 0.5  # share of the budget's steps spent on the autoencoder
    self_condition: float = 0.5  # probability of the self-conditioned pass in training; 0 turns it off
    negatives: int = 1024  # uniform tokens per step in the decoder's sampled softmax
    temperature: float = 1.0  # the decoder's; 0 is greedy
    top_p: float = 1.0  # the decoder's nucleus
    decoder_input: str = "denoised"  # "noise": the control (decoder_input.py)


class LD4LG(DecoderInputOption, DiffusionBaseline):
    """LD4LG: an autoencoder from text to a short sequence of continuous latents, and a diffusion
    model over those latents.

    Kept from the paper: a frozen pretrained encoder (here the backbone) read by a Perceiver-style
    compressor with learned queries, a projection to d_ae = 64 and L2 normalisation to norm √d_ae;
    an autoregressive decoder cross-attending to the latents, trained by cross-entropy; diffusion
    on the latents with ᾱ(t) = cos²(πt/2), v-prediction (v = √ᾱ·ε − √(1−ᾱ)·x₀) under an L2 loss,
    self-conditioning with p = 0.5 (previous x̂₀ concatenated to z_t; a first pass from zeros,
    under stop-gradient, conditions the second) and a bidirectional transformer denoiser; ancestral
    sampling from N(0, I), then decoding the latents into T tokens. Unconditional.

    Adapted to one backbone and one budget:
    - the encoder is the frozen backbone, read after its final norm (the LM head's input) by
      default: the raw last layer carries the attention sink's massive activations at position 0
      (docs/method.md#embedded-defaults); ``feature_layer`` reads hidden-state index ℓ instead. The states of every
      training sequence are computed once, before training.
    - the decoder is trained from scratch (the paper feeds a frozen BART decoder) and is tied to
      the backbone's frozen embedding table through two trainable projections (see
      ``common.TokenDecoder``), scored with a sampled softmax in training (see
      ``common.sampled_cross_entropy``), over the compact vocabulary, the tokens of the training
      sequences (``common.CompactVocabulary``); it decodes with the suite's one next-token
      sampler at ``temperature`` and ``top_p`` (default 1 and 1, the paper: beam search, 4
      beams), never emitting a special token.
    - 16 latents, 1 compressor layer, 2 decoder and 3 denoiser layers, one width for all three
      sized to the allowance (the paper: 32 latents, 3 + 3 layers, a 12-layer width-768 denoiser
      with GeGLU, AdaLN and dense skips); time enters by addition, as in the other baselines.
    - the budget is split in two runs of the shared training loop: the first
      ``autoencoder_fraction`` of the steps trains compressor and decoder on the first sequences
      of the budget's order, the rest trains the denoiser on the frozen compressor's latents of
      the remaining sequences; each run has its own warm-up and cosine decay and its own
      checkpoint subdirectory.
    - sampling walks ``steps`` (default 50) equal steps of t (the paper: 250 DDPM steps); η = 0
      gives DDIM.

    ``decoder_input = "noise"`` is a control, not LD4LG (registered as ``ld4lg-noise-input``): the
    decoder reads the chain's starting draw x₁ ~ N(0, I) of the same shape instead of the denoised
    latents, and the denoiser is never called; what the row loses against ``ld4lg`` is what the
    diffusion adds over the decoder alone.
    """

    name = "ld4lg"
    paper = "Lovelace et al. 2023, Latent Diffusion for Language Generation, arXiv 2212.09462"
    options_class = LD4LGOptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        options = flops.settings(cls.options_class, work)
        return flops.account(flops.ld4lg(work, options, noise_input=options.decoder_input == "noise"))
    settings: LD4LGOptions
    token_sampling_options = ("temperature", "top_p")
    draw_precision = NEXT_TOKEN_PRECISION  # the token decoder draws through sample_next_token

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings
        self.check_ranges(("latents", "latent_dim", "steps", "negatives"))
        if not 0 < opts.autoencoder_fraction < 1 or not 0 <= opts.self_condition <= 1:
            raise DihalError(f"{self.name}: autoencoder_fraction must be in (0, 1) and self_condition in [0, 1]")
        if opts.feature_layer is not None:
            backbone.check_layer(opts.feature_layer, allow_last=True)
        check_sampling(opts.temperature, opts.top_p)
        self.check_decoder_input()
        # the decoder's table is frozen, so the width does not depend on the vocabulary: sized now
        self.d_model = opts.d_model or width_for_allowance(self.name, budget, self.modules_of_width, opts.heads)

    def modules_of_width(self, d_model: int) -> nn.ModuleDict:
        opts = self.settings
        if d_model % opts.heads:
            raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
        width, common = self.backbone.width, {"d_model": d_model, "heads": opts.heads, "dropout": opts.dropout}
        return nn.ModuleDict({
            "compressor": Compressor(width, opts.latents, opts.latent_dim, layers=opts.compressor_layers,
                                     max_len=self.max_len, **common),
            "decoder": TokenDecoder(width, opts.latent_dim, opts.latents, layers=opts.decoder_layers,
                                    max_len=self.max_len, **common),
            # reads concat[z_t, previous x̂₀]
            "denoiser": Denoiser(2 * opts.latent_dim, opts.latent_dim, d_model, opts.denoiser_layers, opts.heads,
                                 opts.latents, opts.dropout),
        })

    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        self.table = embedding_table(self.backbone, vocabulary.full_ids)  # frozen: not a component
        with seeded_init(self.seed):
            return dict(self.modules_of_width(self.d_model).to(self.backbone.device))

    def sampling_options(self) -> dict:
        opts = self.settings
        return {**super().sampling_options(), "temperature": opts.temperature, "top_p": opts.top_p}

    # -- training -----------------------------------------------------------------------------
    @torch.no_grad()
    def backbone_features(self, sequences: Tensor, progress: bool = False) -> Tensor:
        """The hidden states the compressor reads, (n, T, width) float32 on the CPU."""
        layer, chunks = self.settings.feature_layer, []
        for ids in tqdm(sequences.split(FEATURE_BATCH), desc=f"{self.name} features", disable=not progress,
                        leave=False):
            ids = ids.to(self.backbone.device)
            if layer is None:
                states = self.backbone.final_hidden(ids)
            else:
                states = self.backbone.hidden_states(ids, up_to=layer)[layer]
            chunks.append(states.float().cpu())
        return torch.cat(chunks)

    def training_data(self, sequences: Tensor, progress: bool = False) -> dict[str, Tensor]:
        """The autoencoder's data: compact token ids and the backbone features of each sequence."""
        return {**super().training_data(sequences), "features": self.backbone_features(sequences, progress)}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        """The loss of the phase the batch comes from: the decoder's cross-entropy for a batch of
        (ids, features), the v-prediction MSE for a batch of latents."""
        if "latents" in batch:
            return self.diffusion_loss(batch["latents"], generator)
        latents = self.parts["compressor"](batch["features"])
        return self.parts["decoder"].cross_entropy(batch["ids"], latents, self.table, self.settings.negatives,
                                                   generator)

    def diffusion_loss(self, z0: Tensor, generator: torch.Generator) -> Tensor:
        n = z0.shape[0]
        t = torch.rand(n, generator=generator, device=z0.device)
        alpha_bar = cosine_alpha_bar(t)[:, None, None]
        noise = torch.randn(z0.shape, generator=generator, device=z0.device)
        z_t = noised(z0, alpha_bar, noise)
        self_conditioned = torch.rand(n, generator=generator, device=z0.device) < self.settings.self_condition
        with torch.no_grad():
            first = x0_from_v(z_t, alpha_bar, self.denoise(z_t, t, torch.zeros_like(z0)))
        previous = torch.where(self_conditioned[:, None, None], first, torch.zeros_like(z0))
        v = alpha_bar.sqrt() * noise - (1.0 - alpha_bar).sqrt() * z0
        return (self.denoise(z_t, t, previous) - v).pow(2).mean()

    def denoise(self, z_t: Tensor, t: Tensor, previous: Tensor) -> Tensor:
        """v̂ from z_t (n, latents, latent_dim), t (n,) and the previous x̂₀ (zeros when there is none)."""
        return self.parts["denoiser"](torch.cat([z_t, previous], dim=-1), t)

    @torch.no_grad()
    def encode(self, features: Tensor) -> Tensor:
        """Latents (n, latents, latent_dim) on the CPU from backbone features (n, T, width)."""
        compressor, device = self.parts["compressor"].eval(), self.table.device
        return torch.cat([compressor(chunk.to(device)).cpu() for chunk in features.split(FEATURE_BATCH)])

    def fit(self, sequences: Tensor, checkpoint_dir: Path | None = None, progress: bool = True) -> TrainResult:
        """Two runs of the shared training loop that together take ``budget.steps`` steps over the
        budget's order of sequences: the autoencoder on the first ``autoencoder_fraction`` of its
        batches, then the denoiser on the latents of the remaining ones. The losses are the
        decoder's cross-entropy, then the v-prediction MSE."""
        budget = self.budget
        self.build_for(sequences)
        budget.check_allowance(self.parameter_counts(), name=self.name)
        budget.check_fits(len(sequences))
        if budget.steps < 2:
            raise DihalError(f"{self.name} trains an autoencoder and a denoiser: budget.steps must be at least 2")
        first_steps = min(max(round(self.settings.autoencoder_fraction * budget.steps), 1), budget.steps - 1)
        order = torch.cat([batch_indices(budget, len(sequences), step) for step in range(budget.steps)])
        first_rows, second_rows = order[: first_steps * budget.batch_size], order[first_steps * budget.batch_size :]
        data = self.training_data(sequences, progress)  # each sequence's features once, however often it recurs

        def run(parts: list[str], rows_data: dict[str, Tensor], steps: int, phase: str) -> TrainResult:
            directory = None if checkpoint_dir is None else Path(checkpoint_dir) / phase
            return train(nn.ModuleDict({part: self.parts[part] for part in parts}),
                         lambda _model, batch, generator: self.loss(batch, generator), rows_data,
                         budget.replace(steps=steps, epochs=1), checkpoint_dir=directory, progress=progress,
                         desc=f"{self.name} {phase}")

        first = run(["compressor", "decoder"], {key: value[first_rows] for key, value in data.items()},
                    first_steps, "autoencoder")
        latents = self.encode(data.pop("features")[second_rows])
        second = run(["denoiser"], {"latents": latents}, budget.steps - first_steps, "diffusion")
        self.trained = True
        resumed = first.resumed_from_step
        if second.resumed_from_step is not None:
            resumed = first_steps + second.resumed_from_step
        return TrainResult(
            losses=first.losses + second.losses,
            steps_done=first.steps_done + second.steps_done,
            sequences_seen=first.sequences_seen + second.sequences_seen,
            tokens_seen=first.tokens_seen + second.tokens_seen,
            wall_seconds=first.wall_seconds + second.wall_seconds,
            resumed_from_step=resumed,
            earlier_seconds=first.earlier_seconds + second.earlier_seconds,
        )

    # -- sampling -----------------------------------------------------------------------------
    def calls_per_batch(self, seq_len: int) -> int:
        return 0 if self.reads_noise else self.steps

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """Token ids (n, seq_len): the latents x̂₀ at the end of one reverse chain from N(0, I),
        self-conditioned where training was (or, under ``decoder_input = "noise"``, that chain's
        starting draw), decoded at ``temperature`` and ``top_p``."""
        opts = self.settings
        shape = (n, opts.latents, opts.latent_dim)
        if self.reads_noise:
            # the draw reverse_chain starts from: under one seed the control decodes the x₁ the denoised row denoises
            latents = torch.randn(shape, generator=generator, device=generator.device)
        else:
            def predict_x0(z_t: Tensor, t: Tensor, previous: Tensor) -> Tensor:
                return x0_from_v(z_t, cosine_alpha_bar(t)[:, None, None], self.denoise(z_t, t, previous))

            latents = reverse_chain(predict_x0, shape, self.steps, cosine_alpha_bar, opts.eta, generator, bar,
                                    self_condition=opts.self_condition > 0)
        return self.parts["decoder"].generate(latents, self.table, seq_len, opts.temperature, opts.top_p, generator,
                                              banned=self.banned)


@dataclass(frozen=True)
class LD4LGNoiseInputOptions(LD4LGOptions):
    decoder_input: str = "noise"


class LD4LGNoiseInput(NoiseInputControl, LD4LG):
    """The control row of LD4LG's diffusion (dihal_builtin.baselines.decoder_input)."""

    name = "ld4lg-noise-input"
    paper = "a control of LD4LG (Lovelace et al. 2023): its decoder reading noise instead of denoised latents"
    options_class = LD4LGNoiseInputOptions


@hookimpl
def register_baselines(register):
    register(
        "ld4lg",
        LD4LG,
        description="LD4LG: backbone states compressed to 16x64 latents, v-prediction latent diffusion with "
                    "self-conditioning, autoregressive decoder (Lovelace et al. 2023)",
    )
    register("ld4lg-noise-input", LD4LGNoiseInput,
             description="control: LD4LG's decoder reading N(0, I) latents instead of denoised ones (no denoiser call)")
