"""Diffusion-LM (Li et al. 2022, arXiv 2205.14217): continuous diffusion over learned token embeddings.

Also home of what SED (``sed.py``) shares with it, since Diffusion-LM introduced the recipe:
the time-conditioned bidirectional denoiser, its sizing to the parameter allowance, the
rounding cross-entropy and the batched sampling loop.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.backbone import Backbone
from dihal_bench.baseline import Baseline
from dihal_bench.budget import Budget
from dihal_bench.errors import DihalError
from dihal_bench.training import TrainResult

from ..layers import Block, timestep_embedding
from .schedules import noised, reverse_step, sqrt_alpha_bar

#: the denoiser width when the budget sets no parameter allowance
DEFAULT_D_MODEL = 128
#: rows of a (positions × vocabulary) score matrix built at once: bounds memory, and on a CPU
#: reusing one moderate buffer beats faulting in a fresh 200 MB one per call
SCORE_ROWS = 256

Options = TypeVar("Options")


class Denoiser(nn.Module):
    """f(x, t): per-position vectors (n, T, d_in) at diffusion time t (n,) -> x̂₀ (n, T, d_out).

    The improved-diffusion transformer Diffusion-LM used, shrunk: a projection d_in -> d_model,
    a sinusoidal time embedding through an MLP added at every position, learned absolute
    positions, bidirectional pre-LN blocks, a final LayerNorm and a projection d_model -> d_out.
    """

    def __init__(self, d_in: int, d_out: int, d_model: int, layers: int, heads: int, max_len: int, dropout: float):
        super().__init__()
        self.in_proj = nn.Linear(d_in, d_model)
        self.time_mlp = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        self.position = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, causal=False) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, d_out)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        d_model = self.in_proj.out_features
        h = self.in_proj(x) + self.time_mlp(timestep_embedding(t, d_model))[:, None, :]
        h = h + self.position(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.out_proj(self.final_norm(h))


def denoiser_width(method: str, budget: Budget, fixed: int, fixed_what: str, build: Callable[[int], nn.Module],
                   heads: int) -> int:
    """The denoiser d_model (a multiple of 8·heads) whose total trainable count, ``fixed`` plus
    the denoiser ``build(d_model)``, lies closest to ``budget.param_allowance``.

    Without an allowance: DEFAULT_D_MODEL. Raises DihalError when even the closest total is
    outside the budget's tolerance.
    """
    if budget.param_allowance is None:
        return DEFAULT_D_MODEL
    allowance, step = budget.param_allowance, 8 * heads

    @functools.cache
    def total(d_model: int) -> int:
        with torch.device("meta"):  # counts shapes without allocating or drawing random numbers
            return fixed + sum(p.numel() for p in build(d_model).parameters())

    widths = [step]
    while total(widths[-1]) < allowance:  # the total grows with d_model: none past this one is closer
        widths.append(widths[-1] + step)
    best = min(widths, key=lambda d_model: abs(total(d_model) - allowance))
    if abs(total(best) - allowance) <= budget.allowance_tolerance * allowance:
        return best
    if total(step) > allowance:
        raise DihalError(
            f"{method} cannot fit the parameter allowance {allowance:,}: its smallest configuration has "
            f"{total(step):,} trainable parameters ({fixed_what} {fixed:,} + a d_model {step} denoiser); "
            f"lower embed_dim or raise budget.param_allowance"
        )
    raise DihalError(
        f"{method}: no denoiser d_model (multiples of {step}) lands within ±{budget.allowance_tolerance:.0%} of "
        f"the allowance {allowance:,}; the closest is d_model {best} with {total(best):,}; set layers or d_model"
    )


def rounding_cross_entropy(x: Tensor, ids: Tensor, weight: Tensor, positions: int,
                           generator: torch.Generator) -> Tensor:
    """Mean over token positions of −log softmax(x_i · Wᵀ)[w_i], for vectors x (n, T, d), ids (n, T)
    and a (V, d) table W, estimated on ``positions`` positions drawn without replacement.

    A full-vocabulary softmax at every position of a 16×64 batch over SmolLM2's 49,152 tokens
    costs ~0.5 s on a CPU thread, three times a training step's share; the subset estimate is
    unbiased for the same mean.
    """
    x, ids = x.reshape(-1, x.shape[-1]), ids.reshape(-1)
    if positions < ids.numel():
        picked = torch.randperm(ids.numel(), generator=generator, device=ids.device)[:positions]
        x, ids = x[picked], ids[picked]
    return F.cross_entropy(F.linear(x, weight), ids)


def best_scoring_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """argmax_v (x · W_v + b_v) for vectors x (..., d) and a (V, d) table W: token ids (...)."""
    flat = x.reshape(-1, x.shape[-1])
    best = [F.linear(rows, weight, bias).argmax(-1) for rows in flat.split(SCORE_ROWS)]
    return torch.cat(best).reshape(x.shape[:-1])


def parse_options(method: str, kind: type[Options], options: dict) -> Options:
    """The dataclass ``kind`` built from ``options``, with a DihalError naming unknown ones."""
    known = {field.name for field in dataclasses.fields(kind)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise DihalError(f"{method}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return kind(**options)


class EmbeddingDiffusion(Baseline):
    """A diffusion model over per-token vectors that denoises all T positions in parallel.

    Subclasses build ``self.denoiser`` (with learned positions for ``self.max_len`` tokens) and
    implement ``sample_batch``; this class supplies the training data, the trained-or-loaded
    guard and the batched, seeded sampling loop.
    """

    max_len: int
    steps: int
    trained: bool = False
    steps_option = "steps"

    def training_data(self, sequences: Tensor) -> dict[str, Tensor]:
        return {"ids": sequences.long()}

    def fit(self, sequences: Tensor, checkpoint_dir: Path | None = None, progress: bool = True) -> TrainResult:
        result = super().fit(sequences, checkpoint_dir, progress)
        self.trained = True
        return result

    def load(self, directory: Path) -> None:
        super().load(directory)
        self.trained = True

    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        if not self.trained:
            raise DihalError(f"{self.name}: not trained; train it (fit) or load a checkpoint before sampling")
        if seq_len > self.max_len:
            raise DihalError(f"{self.name}: cannot sample {seq_len} tokens, it has positions for {self.max_len}")
        self.module().eval()
        generator = torch.Generator(device=self.backbone.device).manual_seed(seed)
        batches = math.ceil(n / batch_size)
        with tqdm(total=batches * self.steps, desc=self.name, disable=not progress, leave=False) as bar:
            samples = [self.sample_batch(min(batch_size, n - start), seq_len, generator, bar)
                       for start in range(0, n, batch_size)]
        return torch.cat(samples).cpu()

    @abstractmethod
    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """Token ids (n, seq_len) from one reverse chain of ``self.steps`` denoiser calls,
        each followed by ``bar.update(1)``."""


@dataclass(frozen=True)
class DiffusionLMOptions:
    embed_dim: int = 32  # d of the learned embedding space (the paper: 16 on E2E, 128 on ROCStories)
    d_model: int | None = None  # denoiser width; None: sized to the budget's parameter allowance
    layers: int = 3
    heads: int = 4
    dropout: float = 0.0
    max_len: int | None = None  # learned positions; None: the budget's seq_len
    steps: int = 50  # reverse steps in sampling
    eta: float = 1.0  # 1: ancestral sampling, as the paper; 0: deterministic DDIM
    clamp: bool = True  # the clamping trick
    rounding_tokens: int = 64  # positions per step scored by the rounding cross-entropy
    anchor_share: float = 1 / 16  # probability that a training sequence draws t = 0, the anchor term


class DiffusionLM(EmbeddingDiffusion):
    """Diffusion-LM: Gaussian diffusion over learned token embeddings, trained end to end.

    Kept from the paper: embeddings Emb (V × d) learned jointly with the denoiser, with
    q(x₀ | w) = N(Emb(w), σ₀²I); the sqrt schedule ᾱ(t) = 1 − √(t + s), s = 1e-4, so σ₀ =
    √(1 − ᾱ(0)) = 0.1; x₀-prediction with the end-to-end simple loss

        L = ‖f(x_t, t) − x₀‖² + ‖Emb(w) − f(x_{t=0}, 0)‖² − log p(w | x₀),
        p(w | x) = softmax(x · Embᵀ)  (rounding through the tied embedding),

    each term a mean over positions (and dimensions for the squared errors); a bidirectional
    transformer denoiser with time conditioning and learned positions; the clamping trick
    (x̂₀ replaced by its nearest embedding at every step) and argmax rounding of the final
    x̂₀. All T positions are generated in parallel, unconditionally.

    Adapted: d = 32 by default, inside the paper's range of 16–128, because the table costs
    d·V parameters, which at V = 49,152 (SmolLM2) and d = 32 is already 1.57M of the 2.29M
    allowance; the denoiser is ~0.65M parameters (3 layers, d_model sized to the allowance)
    instead of BERT-base's 80M; dropout 0 instead of 0.1 for the few-hundred-step budget.
    Time is continuous: t ~ U(0, 1) per sequence, except that with probability
    ``anchor_share`` (1/16) a sequence draws t = 0 and is scored by the anchor term instead.
    That is the original's estimator, which meets the anchor when it draws the first of its
    T steps, with the probability raised from 1/T (T = 2,000) so that a short run sees it.
    Sampling walks 50 equal steps of t (the paper: 200 of 2,000) with ancestral
    x̂₀-parameterised steps (η = 1, the DDPM posterior at each sub-sampled step); η = 0 gives
    DDIM. The rounding cross-entropy is estimated on ``rounding_tokens`` positions per step
    (64 of a default step's 1,024; see ``rounding_cross_entropy``). The prior term
    ᾱ(1)·‖x₀‖² is dropped: ᾱ(1) ≈ 0.
    """

    name = "diffusion-lm"
    paper = "Li et al. 2022, Diffusion-LM Improves Controllable Text Generation, arXiv 2205.14217"

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.settings = opts = parse_options(self.name, DiffusionLMOptions, options)
        if opts.steps < 1 or opts.rounding_tokens < 1 or opts.eta < 0 or not 0 <= opts.anchor_share <= 1:
            raise DihalError(f"{self.name}: steps and rounding_tokens must be at least 1, eta non-negative "
                             f"and anchor_share a probability")
        self.max_len, self.steps = opts.max_len or budget.seq_len, opts.steps
        self.sigma_0 = math.sqrt(1.0 - float(sqrt_alpha_bar(torch.tensor(0.0))))

        def build(d_model: int) -> Denoiser:
            if d_model % opts.heads:
                raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
            return Denoiser(opts.embed_dim, opts.embed_dim, d_model, opts.layers, opts.heads, self.max_len,
                            opts.dropout)

        vocab = backbone.vocab_size
        table = f"the {vocab:,}×{opts.embed_dim} embedding table"
        d_model = opts.d_model or denoiser_width(self.name, budget, vocab * opts.embed_dim, table, build, opts.heads)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # N(0, 1) rows, as in the paper's code
            self.embedding = nn.Embedding(vocab, opts.embed_dim).to(backbone.device)
            self.denoiser = build(d_model).to(backbone.device)

    def components(self) -> dict[str, nn.Module]:
        return {"denoiser": self.denoiser, "embeddings": self.embedding}

    def sampling_options(self) -> dict:
        return {"steps": self.steps, "eta": self.settings.eta, "clamp": self.settings.clamp}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        ids = batch["ids"]
        emb = self.embedding(ids)

        def gaussian() -> Tensor:
            return torch.randn(emb.shape, generator=generator, device=emb.device, dtype=emb.dtype)

        x0 = emb + self.sigma_0 * gaussian()
        # The anchor term is the squared error at the smallest t, t = 0, against Emb(w) itself.
        anchored = torch.rand(ids.shape[0], generator=generator, device=emb.device) < self.settings.anchor_share
        t = torch.rand(ids.shape[0], generator=generator, device=emb.device).masked_fill(anchored, 0.0)
        x_t = noised(x0, sqrt_alpha_bar(t)[:, None, None], gaussian())
        target = torch.where(anchored[:, None, None], emb, x0)
        squared_error = (self.denoiser(x_t, t) - target).pow(2).mean()
        rounding = rounding_cross_entropy(x0, ids, self.embedding.weight, self.settings.rounding_tokens, generator)
        return squared_error + rounding

    def nearest_embedding(self, x: Tensor) -> Tensor:
        """The clamping trick: each vector replaced by its L2-nearest row of Emb
        (argmin ‖x − e‖² = argmax x·e − ½‖e‖²)."""
        table = self.embedding.weight
        return table[best_scoring_rows(x, table, -0.5 * table.pow(2).sum(-1))]

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        device, d = self.backbone.device, self.settings.embed_dim
        x = torch.randn(n, seq_len, d, generator=generator, device=device)
        for k in range(self.steps, 0, -1):
            t = torch.full((n,), k / self.steps, device=device)
            x0_hat = self.denoiser(x, t)
            bar.update(1)
            if k > 1:
                guess = self.nearest_embedding(x0_hat) if self.settings.clamp else x0_hat
                s = torch.full((n,), (k - 1) / self.steps, device=device)
                alpha_t, alpha_s = sqrt_alpha_bar(t)[:, None, None], sqrt_alpha_bar(s)[:, None, None]
                noise = torch.randn(x.shape, generator=generator, device=device)
                x = reverse_step(x, guess, alpha_t, alpha_s, self.settings.eta, noise)
        return best_scoring_rows(x0_hat, self.embedding.weight)  # argmax_w p(w | x̂₀)


@hookimpl
def register_baselines(register):
    register(
        "diffusion-lm",
        DiffusionLM,
        description="Diffusion-LM: learned embeddings, sqrt schedule, x0-prediction, clamping trick (Li et al. 2022)",
    )
