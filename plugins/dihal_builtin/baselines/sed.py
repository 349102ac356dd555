"""SED, Self-conditioned Embedding Diffusion (Strudel et al. 2022, arXiv 2211.04236):
continuous diffusion over fixed pretrained token embeddings, with self-conditioning."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.backbone import Backbone
from dihal_bench.budget import Budget
from dihal_bench.errors import DihalError

from .diffusion_lm import (
    Denoiser,
    EmbeddingDiffusion,
    best_scoring_rows,
    denoiser_width,
    parse_options,
    rounding_cross_entropy,
)
from .schedules import cosine_alpha_bar, noised, reverse_step

#: vocabulary rows read from the backbone at once while computing the PCA
PCA_ROWS = 8192


def pca_embeddings(backbone: Backbone, dim: int) -> Tensor:
    """The backbone's input embedding table E (V × width) projected on its ``dim`` leading
    principal axes, each projected row rescaled to norm √dim: a (V, dim) float32 table.

    PCA in float64 over all V rows: the axes are the top eigenvectors of the covariance
    (1/V)·Σ_v (e_v − ē)(e_v − ē)ᵀ, each signed so that its largest-magnitude loading is
    positive (the eigensolver's sign is arbitrary). The table is read in chunks, so a
    128k × 4096 vocabulary never sits in memory in float64.
    """
    if not 1 <= dim <= backbone.width:
        raise DihalError(f"sed: embed_dim must be in 1..{backbone.width} (the backbone's width), got {dim}")
    chunks = torch.arange(backbone.vocab_size, device=backbone.device).split(PCA_ROWS)

    def rows(ids: Tensor) -> Tensor:
        return backbone.embed(ids[None])[0].to("cpu", torch.float64)

    total = torch.zeros(backbone.width, dtype=torch.float64)
    gram = torch.zeros(backbone.width, backbone.width, dtype=torch.float64)
    for ids in chunks:
        block = rows(ids)
        total += block.sum(0)
        gram += block.T @ block
    mean = total / backbone.vocab_size
    covariance = gram / backbone.vocab_size - torch.outer(mean, mean)
    _, eigenvectors = torch.linalg.eigh(covariance)  # eigenvalues ascending
    axes = eigenvectors[:, -dim:].flip(-1)
    axes = axes * axes.gather(0, axes.abs().argmax(0, keepdim=True)).sign()

    projected = torch.cat([(rows(ids) - mean) @ axes for ids in chunks])
    norms = projected.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return (projected * math.sqrt(dim) / norms).float()


@dataclass(frozen=True)
class SEDOptions:
    embed_dim: int = 32  # d of the fixed embedding space (the paper's best, Table 7)
    d_model: int | None = None  # denoiser width; None: sized to the budget's parameter allowance
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    max_len: int | None = None  # learned positions; None: the budget's seq_len
    steps: int = 50  # reverse steps in sampling
    eta: float = 1.0  # 1: ancestral sampling; 0: deterministic DDIM
    self_condition: float = 0.5  # probability of the self-conditioned pass in training; 0 turns it off
    rounding_tokens: int = 64  # positions per step scored by the readout cross-entropy


class SED(EmbeddingDiffusion):
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

    Adapted: E is the backbone's own input table, projected to d by a fixed PCA (the paper
    took a 150M BERT's table); d = 32, the best size in the paper's Table 7 and the largest
    whose readout fits SmolLM2's allowance (d·V = 1.57M of 2.29M at V = 49,152); the denoiser
    is ~0.65M parameters (3 bidirectional layers, d_model sized to the allowance) instead of
    135M; t is continuous with ᾱ(t) = cos²(πt/2), without the paper's small-noise offsets;
    sampling takes 50 equal steps of t (the paper: 1,000) with ancestral x̂₀-parameterised
    steps (η = 1); the readout cross-entropy is estimated on ``rounding_tokens`` positions per
    step; dropout 0.
    """

    name = "sed"
    paper = "Strudel et al. 2022, Self-conditioned Embedding Diffusion for Text Generation, arXiv 2211.04236"

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.settings = opts = parse_options(self.name, SEDOptions, options)
        if opts.steps < 1 or opts.rounding_tokens < 1 or opts.eta < 0 or not 0 <= opts.self_condition <= 1:
            raise DihalError(f"{self.name}: steps and rounding_tokens must be at least 1, eta non-negative "
                             f"and self_condition a probability")
        self.max_len, self.steps = opts.max_len or budget.seq_len, opts.steps

        def build(d_model: int) -> Denoiser:
            if d_model % opts.heads:
                raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
            # reads concat[x_t, previous x̂₀]
            return Denoiser(2 * opts.embed_dim, opts.embed_dim, d_model, opts.layers, opts.heads, self.max_len,
                            opts.dropout)

        vocab = backbone.vocab_size
        readout = f"the {opts.embed_dim}×{vocab:,} readout"
        d_model = opts.d_model or denoiser_width(self.name, budget, vocab * opts.embed_dim, readout, build, opts.heads)
        self.embeddings = pca_embeddings(backbone, opts.embed_dim).to(backbone.device)  # fixed: not a component
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.denoiser = build(d_model).to(backbone.device)
        # R as an nn.Linear: its weight (V, d) is Rᵀ, so R = Eᵀ means weight = E
        self.readout = nn.Linear(opts.embed_dim, vocab, bias=False, device=backbone.device)
        with torch.no_grad():
            self.readout.weight.copy_(self.embeddings)

    def components(self) -> dict[str, nn.Module]:
        return {"denoiser": self.denoiser, "readout": self.readout}

    def sampling_options(self) -> dict:
        return {"steps": self.steps, "eta": self.settings.eta, "self_condition": self.settings.self_condition > 0}

    def denoise(self, x_t: Tensor, t: Tensor, previous: Tensor) -> Tensor:
        """x̂₀ from x_t and the previous estimate of x₀ (zeros when there is none)."""
        return self.denoiser(torch.cat([x_t, previous], dim=-1), t)

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
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
        readout = rounding_cross_entropy(x0_hat, ids, self.readout.weight, self.settings.rounding_tokens, generator)
        return squared_error + readout

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        device, d = self.backbone.device, self.settings.embed_dim
        x = torch.randn(n, seq_len, d, generator=generator, device=device)
        x0_hat = torch.zeros_like(x)
        for k in range(self.steps, 0, -1):
            t = torch.full((n,), k / self.steps, device=device)
            previous = x0_hat if self.settings.self_condition > 0 else torch.zeros_like(x)
            x0_hat = self.denoise(x, t, previous)
            bar.update(1)
            if k > 1:
                s = torch.full((n,), (k - 1) / self.steps, device=device)
                alpha_t, alpha_s = cosine_alpha_bar(t)[:, None, None], cosine_alpha_bar(s)[:, None, None]
                noise = torch.randn(x.shape, generator=generator, device=device)
                x = reverse_step(x, x0_hat, alpha_t, alpha_s, self.settings.eta, noise)
        return best_scoring_rows(x0_hat, self.readout.weight)  # argmax of R·x̂₀


@hookimpl
def register_baselines(register):
    register(
        "sed",
        SED,
        description="SED: fixed PCA'd backbone embeddings, cosine schedule, self-conditioning (Strudel et al. 2022)",
    )
