"""LD4LG, latent diffusion for language (Lovelace et al. 2023, arXiv 2212.09462), rebuilt on the
frozen backbone.

Also home of what CoDAR (``codar.py``) shares with it, since both read text out of a continuous
sequence with an autoregressive decoder: the token decoder tied to the backbone's embedding
table, its sampled-softmax cross-entropy, and the sizing of one shared width to the allowance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.backbone import Backbone
from dihal_bench.baseline import Baseline
from dihal_bench.budget import Budget
from dihal_bench.errors import DihalError
from dihal_bench.hybrid import sample_next_token
from dihal_bench.training import TrainResult, batch_indices, train

from ..layers import Block
from .diffusion_lm import Denoiser, parse_options
from .schedules import cosine_alpha_bar, noised, reverse_step

#: the shared width when the budget sets no parameter allowance
DEFAULT_D_MODEL = 128
#: sequences per backbone forward pass while extracting features
FEATURE_BATCH = 16


def embedding_table(backbone: Backbone) -> Tensor:
    """The backbone's embedding output for every token, (V, width) float32: row w is what the
    backbone itself feeds its first layer for token w."""
    vocabulary = torch.arange(backbone.vocab_size, device=backbone.device)
    return backbone.embed(vocabulary[None])[0].float()


def width_for_allowance(method: str, budget: Budget, build: Callable[[int], nn.Module], heads: int) -> int:
    """The width d (a multiple of 2·heads) whose ``build(d)``, holding every trained component,
    has the trainable count closest to ``budget.param_allowance``; DEFAULT_D_MODEL without one.

    The grid is finer than 8·heads because the count grows like d²: at d ≈ 160 one step of 32
    changes it by ~40%, more than the ±10% window, so an allowance could fall between steps.
    """
    if budget.param_allowance is None:
        return DEFAULT_D_MODEL
    allowance, step = budget.param_allowance, 2 * heads

    @functools.cache
    def total(width: int) -> int:
        with torch.device("meta"):  # shapes only: no memory, no random draws
            return sum(p.numel() for p in build(width).parameters() if p.requires_grad)

    widths = [4 * step]  # head dimension 8 at the least
    while total(widths[-1]) < allowance:  # the count grows with d: none past this one is closer
        widths.append(widths[-1] + step)
    best = min(widths, key=lambda width: abs(total(width) - allowance))
    if abs(total(best) - allowance) <= budget.allowance_tolerance * allowance:
        return best
    if best == widths[0]:
        raise DihalError(f"{method} cannot fit the parameter allowance {allowance:,}: its smallest configuration "
                         f"(d_model {best}) has {total(best):,} trainable parameters; raise budget.param_allowance "
                         f"or use fewer layers")
    raise DihalError(f"{method}: no d_model (multiples of {step}) lands within ±{budget.allowance_tolerance:.0%} of "
                     f"the allowance {allowance:,}; the closest is d_model {best} with {total(best):,}; set d_model")


def sampled_cross_entropy(hidden: Tensor, targets: Tensor, embed: Callable[[Tensor], Tensor], vocab_size: int,
                          negatives: int, generator: torch.Generator) -> Tensor:
    """Mean over positions of −log softmax_v(h_i · u_v)[w_i], for hidden vectors h (..., d), target
    ids w (...) and output embeddings u_v = ``embed(v)`` (d) of the ``vocab_size`` tokens, with each
    normaliser Z_i = Σ_v exp(h_i · u_v) estimated instead of summed over the whole vocabulary:
    exactly over the tokens U that are targets somewhere in the batch, and from ``negatives``
    tokens R drawn uniformly without replacement from the rest, weighted (V − |U|)/|R|, an
    unbiased estimate of the remaining sum (a stratified sampled softmax, cf. Jean et al. 2015,
    arXiv 1412.2007). Exact once ``negatives`` ≥ V − |U|.

    Why: the full softmax over SmolLM2's 49,152 tokens at the 1,024 positions of a 16×64 batch
    costs ~1 s per step on a CPU thread; this one a few hundredths, and unlike scoring a subset
    of positions it keeps every position's gradient.
    """
    vectors, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    present, target_index = targets.unique(return_inverse=True)
    absent = torch.ones(vocab_size, dtype=torch.bool, device=targets.device)
    absent[present] = False
    others = absent.nonzero()[:, 0]
    log_weight = 0.0
    if negatives < len(others):
        log_weight = math.log(len(others) / negatives)
        others = others[torch.randperm(len(others), generator=generator, device=targets.device)[:negatives]]
    bias = torch.zeros(len(present) + len(others), device=vectors.device)
    bias[len(present):] = log_weight
    logits = F.linear(vectors, embed(torch.cat([present, others])), bias)
    return F.cross_entropy(logits, target_index)


class TokenDecoder(nn.Module):
    """p(w_i | w_<i, memory): a causal pre-LN transformer over tokens that cross-attends, in every
    block, to a memory sequence (n, M, memory_dim).

    Tokens enter and leave through the backbone's frozen embedding table E (V, width), to stay
    within the parameter allowance: the input vector of token w is in_proj(E[w]), its output
    embedding out_proj(E[w]) (two trainable width → d_model projections), and the logit of w
    after hidden state h is h · out_proj(E[w]). Projecting the scored rows into the decoder's
    space, rather than h into the table's, makes each logit cost d_model multiplications
    instead of width. A learned start vector stands before position 0. E is the caller's.
    """

    def __init__(self, width: int, memory_dim: int, memory_len: int, d_model: int, layers: int, heads: int,
                 max_len: int, dropout: float):
        super().__init__()
        self.max_len = max_len
        self.in_proj = nn.Linear(width, d_model)
        self.start = nn.Parameter(torch.zeros(d_model))
        self.position = nn.Embedding(max_len, d_model)
        self.memory_proj = nn.Linear(memory_dim, d_model)
        self.memory_position = nn.Embedding(memory_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, causal=True, cross=True) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)
        # no bias: a bias b would add h·b to every logit of a position, which the softmax ignores
        self.out_proj = nn.Linear(width, d_model, bias=False)

    def forward(self, previous: Tensor, memory: Tensor) -> Tensor:
        """Hidden states (n, k+1, d_model) that predict tokens 0..k, from the table rows
        (n, k, width) of tokens 0..k−1 and the memory."""
        n, k = previous.shape[:2]
        h = torch.cat([self.start.expand(n, 1, -1), self.in_proj(previous)], dim=1)
        h = h + self.position(torch.arange(k + 1, device=h.device))
        memory = self.memory_proj(memory) + self.memory_position(torch.arange(memory.shape[1], device=h.device))
        for block in self.blocks:
            h = block(h, memory)
        return self.final_norm(h)

    def cross_entropy(self, ids: Tensor, memory: Tensor, table: Tensor, negatives: int,
                      generator: torch.Generator) -> Tensor:
        """Teacher-forced cross-entropy of the ids (n, T) given the memory (see sampled_cross_entropy)."""
        hidden = self(table[ids[:, :-1]], memory)
        return sampled_cross_entropy(hidden, ids, lambda rows: self.out_proj(table[rows]), len(table), negatives,
                                     generator)

    @torch.no_grad()
    def generate(self, memory: Tensor, table: Tensor, length: int, temperature: float, top_p: float,
                 generator: torch.Generator) -> Tensor:
        """Token ids (n, length), one position at a time over the full vocabulary; temperature 0 is
        greedy. The whole prefix is re-run at each step (T ≤ max_len is short; no cache needed)."""
        output_embeddings = self.out_proj(table)
        ids = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        for _ in range(length):
            logits = self(table[ids], memory)[:, -1] @ output_embeddings.T
            ids = torch.cat([ids, sample_next_token(logits, temperature, top_p, generator)[:, None]], dim=1)
        return ids


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
class LD4LGOptions:
    latents: int = 16  # ℓ, learned queries (the paper: 32)
    latent_dim: int = 64  # d_ae, as the paper
    d_model: int | None = None  # width of compressor, decoder and denoiser; None: sized to the allowance
    heads: int = 4
    compressor_layers: int = 1  # the paper: 3
    decoder_layers: int = 2
    denoiser_layers: int = 3  # the paper: 12
    feature_layer: int | None = None  # hidden-state index the compressor reads; None: after the final norm
    dropout: float = 0.0
    max_len: int | None = None  # learned token positions; None: the budget's seq_len
    autoencoder_fraction: float = 0.5  # share of the budget's steps spent on the autoencoder
    self_condition: float = 0.5  # probability of the self-conditioned pass in training; 0 turns it off
    negatives: int = 1024  # uniform tokens per step in the decoder's sampled softmax
    steps: int = 50  # reverse steps in sampling
    eta: float = 1.0  # 1: ancestral (DDPM) steps, as the paper; 0: deterministic DDIM


class LD4LG(Baseline):
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
      (DESIGN.md §3); ``feature_layer`` reads hidden-state index ℓ instead. The states of every
      training sequence are computed once, before training.
    - the decoder is trained from scratch (the paper feeds a frozen BART decoder) and is tied to
      the backbone's frozen embedding table through two trainable projections (see TokenDecoder),
      scored with a sampled softmax in training (see sampled_cross_entropy); it decodes greedily
      (the paper: beam search, 4 beams).
    - 16 latents, 1 compressor layer, 2 decoder and 3 denoiser layers, one width for all three
      sized to the allowance (the paper: 32 latents, 3 + 3 layers, a 12-layer width-768 denoiser
      with GeGLU, AdaLN and dense skips); time enters by addition, as in the other baselines.
    - the budget is split in two runs of the shared training loop: the first
      ``autoencoder_fraction`` of the steps trains compressor and decoder on the first sequences
      of the budget's order, the rest trains the denoiser on the frozen compressor's latents of
      the remaining sequences; each run has its own warm-up and cosine decay and its own
      checkpoint subdirectory.
    - sampling walks 50 equal steps of t (the paper: 250 DDPM steps); η = 0 gives DDIM.
    """

    name = "ld4lg"
    paper = "Lovelace et al. 2023, Latent Diffusion for Language Generation, arXiv 2212.09462"
    steps_option = "steps"

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.settings = opts = parse_options(self.name, LD4LGOptions, options)
        if min(opts.latents, opts.latent_dim, opts.steps, opts.negatives) < 1 or opts.eta < 0:
            raise DihalError(f"{self.name}: latents, latent_dim, steps and negatives must be at least 1, "
                             f"eta non-negative")
        if not 0 < opts.autoencoder_fraction < 1 or not 0 <= opts.self_condition <= 1:
            raise DihalError(f"{self.name}: autoencoder_fraction must be in (0, 1) and self_condition in [0, 1]")
        if opts.feature_layer is not None:
            backbone.check_layer(opts.feature_layer, allow_last=True)
        self.max_len = opts.max_len or budget.seq_len
        self.trained = False

        def build(d_model: int) -> nn.ModuleDict:
            if d_model % opts.heads:
                raise DihalError(f"{self.name}: d_model {d_model} is not divisible by heads {opts.heads}")
            width, common = backbone.width, dict(d_model=d_model, heads=opts.heads, dropout=opts.dropout)
            return nn.ModuleDict({
                "compressor": Compressor(width, opts.latents, opts.latent_dim, layers=opts.compressor_layers,
                                         max_len=self.max_len, **common),
                "decoder": TokenDecoder(width, opts.latent_dim, opts.latents, layers=opts.decoder_layers,
                                        max_len=self.max_len, **common),
                # reads concat[z_t, previous x̂₀]
                "denoiser": Denoiser(2 * opts.latent_dim, opts.latent_dim, d_model, opts.denoiser_layers, opts.heads,
                                     opts.latents, opts.dropout),
            })

        d_model = opts.d_model or width_for_allowance(self.name, budget, build, opts.heads)
        self.table = embedding_table(backbone)  # frozen: not a component
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.parts = build(d_model).to(backbone.device)

    def components(self) -> dict[str, nn.Module]:
        return dict(self.parts)

    def sampling_options(self) -> dict:
        return {"steps": self.settings.steps, "eta": self.settings.eta, "decoding": "greedy"}

    # -- training -----------------------------------------------------------------------------
    @torch.no_grad()
    def backbone_features(self, sequences: Tensor, progress: bool = False) -> Tensor:
        """The hidden states the compressor reads, (n, T, width) float32 on the CPU."""
        layer, chunks = self.settings.feature_layer, []
        for ids in tqdm(sequences.split(FEATURE_BATCH), desc=f"{self.name} features", disable=not progress,
                        leave=False):
            ids = ids.to(self.backbone.device)
            states = self.backbone.final_hidden(ids) if layer is None else self.backbone.hidden_states(ids)[layer]
            chunks.append(states.float().cpu())
        return torch.cat(chunks)

    def training_data(self, sequences: Tensor, progress: bool = False) -> dict[str, Tensor]:
        """The autoencoder's data: token ids and the backbone features of each sequence."""
        return {"ids": sequences.long(), "features": self.backbone_features(sequences, progress)}

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
        )

    def load(self, directory: Path) -> None:
        super().load(directory)
        self.trained = True

    # -- sampling -----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        if not self.trained:
            raise DihalError(f"{self.name}: not trained; train it (fit) or load a checkpoint before sampling")
        if seq_len > self.max_len:
            raise DihalError(f"{self.name}: cannot sample {seq_len} tokens, it has positions for {self.max_len}")
        self.module().eval()
        generator = torch.Generator(device=self.table.device).manual_seed(seed)
        samples = []
        for start in tqdm(range(0, n, batch_size), desc=self.name, disable=not progress, leave=False):
            latents = self.sample_latents(min(batch_size, n - start), generator)
            samples.append(self.parts["decoder"].generate(latents, self.table, seq_len, 0.0, 1.0, generator).cpu())
        return torch.cat(samples)

    def sample_latents(self, n: int, generator: torch.Generator) -> Tensor:
        """x̂₀ (n, latents, latent_dim) at the end of one self-conditioned reverse chain from N(0, I)."""
        opts, device = self.settings, self.table.device
        z = torch.randn(n, opts.latents, opts.latent_dim, generator=generator, device=device)
        x0_hat = torch.zeros_like(z)
        for k in range(opts.steps, 0, -1):
            t = torch.full((n,), k / opts.steps, device=device)
            alpha_t = cosine_alpha_bar(t)[:, None, None]
            previous = x0_hat if opts.self_condition > 0 else torch.zeros_like(z)  # as in training
            x0_hat = x0_from_v(z, alpha_t, self.denoise(z, t, previous))
            if k > 1:
                alpha_s = cosine_alpha_bar(torch.full((n,), (k - 1) / opts.steps, device=device))[:, None, None]
                noise = torch.randn(z.shape, generator=generator, device=device)
                z = reverse_step(z, x0_hat, alpha_t, alpha_s, opts.eta, noise)
        return x0_hat


@hookimpl
def register_baselines(register):
    register(
        "ld4lg",
        LD4LG,
        description="LD4LG: backbone states compressed to 16x64 latents, v-prediction latent diffusion with "
                    "self-conditioning, autoregressive decoder (Lovelace et al. 2023)",
    )
