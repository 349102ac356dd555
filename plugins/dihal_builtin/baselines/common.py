"""What several baselines share, kept apart so that no baseline imports another's module.

- options: ``parse_options`` (every baseline) and ``seeded_init``;
- the ``CompactVocabulary``, the token ids a baseline's tables cover: those of its training sequences;
- ``DiffusionBaseline`` and its ``DiffusionOptions``: the modules built over the compact vocabulary
  once it is known, the trained-or-loaded guard, the seeded, batched sampling loop and the option
  checks of every diffusion baseline;
- the time-conditioned bidirectional ``Denoiser`` (Diffusion-LM's recipe, also SED's, LD4LG's and
  CoDAR's) and the two rules that size a width to the parameter allowance;
- reading tokens out of vectors: the rounding cross-entropy and argmax scoring against a table
  (Diffusion-LM, SED), and the autoregressive ``TokenDecoder`` tied to the backbone's embedding
  table with its sampled-softmax cross-entropy (LD4LG, CoDAR);
- fixed tables from the backbone: its embedding table (LD4LG, CoDAR) and its PCA projection
  (SED, CoDAR).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench.api.backbone import Backbone
from dihal_bench.api.baseline import CONFIG_FILE, Baseline
from dihal_bench.api.sampling import sample_next_token, special_ids
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import TrainResult

from ..layers import (
    POSITIONS,
    Block,
    bidirectional_blocks,
    through_blocks,
    timestep_embedding,
)

#: the sized width when the budget sets no parameter allowance
DEFAULT_D_MODEL = 128
#: rows of a (positions × vocabulary) score matrix built at once: bounds memory, and on a CPU
#: reusing one moderate buffer beats faulting in a fresh 200 MB one per call
SCORE_ROWS = 256
#: vocabulary rows read from the backbone at once while computing the PCA
PCA_ROWS = 8192

Options = TypeVar("Options")


# -- options --------------------------------------------------------------------------------


def parse_options(method: str, kind: type[Options], options: dict) -> Options:
    """The dataclass ``kind`` built from ``options``, with a DihalError naming unknown ones."""
    known = {field.name for field in dataclasses.fields(kind)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise DihalError(f"{method}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return kind(**options)


def _listed(names: tuple[str, ...]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Inside, torch's global CPU generator is seeded with ``seed``, so the modules built there
    are initialised as a function of the seed; afterwards the global random state is as before."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# -- the compact vocabulary ------------------------------------------------------------------


@dataclass(frozen=True)
class CompactVocabulary:
    """The backbone token ids a baseline's vocabulary-sized tables cover: those present in its
    training sequences, sorted (docs/method.md#compact-vocabulary). Compact id k stands for
    backbone id ``ids[k]``; ``full_size`` is the backbone's vocabulary size.

    Why: a table row of a token absent from the training data is never trained, yet the
    rounding argmax and the decoders' softmax would still pick it (SmolLM2 has 49,152 ids, a
    corpus's training split may use ~6k). No special token is added: packed windows hold none
    (``dihal_bench.api.corpus.tokenize_documents``) and no sample is meant to contain one, so a
    special id is in the vocabulary only where the training text itself holds it, and the
    baselines never emit it (``DiffusionBaseline.banned``).
    """

    ids: tuple[int, ...]
    full_size: int

    def __post_init__(self) -> None:
        ids = self.ids
        increasing = all(a < b for a, b in itertools.pairwise(ids))
        if not ids or not 0 <= ids[0] or not ids[-1] < self.full_size or not increasing:
            raise DihalError(f"a compact vocabulary needs at least one id, strictly increasing, within "
                             f"0..{self.full_size - 1}; got {len(ids)} ids")

    @classmethod
    def from_sequences(cls, sequences: Tensor, full_size: int) -> CompactVocabulary:
        """The ids present in ``sequences`` (any shape) of a vocabulary of ``full_size`` tokens."""
        if sequences.numel() == 0:
            raise DihalError("no training tokens to build a vocabulary from")
        present = torch.unique(sequences.long())  # sorted
        if present[0] < 0 or present[-1] >= full_size:
            bad = int(present[0] if present[0] < 0 else present[-1])
            raise DihalError(f"training sequences hold token id {bad}, outside the backbone's vocabulary "
                             f"0..{full_size - 1}")
        return cls(tuple(present.tolist()), full_size)

    @classmethod
    def from_dict(cls, value: object, source: str) -> CompactVocabulary:
        """The vocabulary :meth:`to_dict` wrote; a DihalError naming ``source`` when it is not one."""
        ids = value.get("ids") if isinstance(value, dict) else None
        full_size = value.get("full_size") if isinstance(value, dict) else None
        if (not isinstance(ids, list) or not isinstance(full_size, int)
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise DihalError(f"{source} holds no compact vocabulary (an object with full_size and ids); "
                             f"it was saved by an older version: train it again")
        try:
            return cls(tuple(ids), full_size)
        except DihalError as exc:
            raise DihalError(f"{source}: {exc}") from None

    def to_dict(self) -> dict:
        return {"full_size": self.full_size, "ids": list(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def full_ids(self) -> Tensor:
        """The backbone id of each compact id, (len,) long on the CPU."""
        return torch.tensor(self.ids, dtype=torch.long)

    @functools.cached_property
    def _compact_of(self) -> Tensor:
        """The compact id of each backbone id, −1 where absent: (full_size,) long on the CPU."""
        compact = torch.full((self.full_size,), -1, dtype=torch.long)
        compact[self.full_ids] = torch.arange(len(self.ids))
        return compact

    def to_compact(self, ids: Tensor) -> Tensor:
        """Compact ids of backbone ids (any shape, same device); a DihalError for an id not covered."""
        ids = ids.long()
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.full_size):
            raise DihalError(f"token ids must lie in 0..{self.full_size - 1}, got {int(ids.min())}..{int(ids.max())}")
        compact = self._compact_of.to(ids.device)[ids]
        if (compact < 0).any():
            raise DihalError(f"token id {int(ids[compact < 0][0])} is not in the compact vocabulary (the "
                             f"{len(self):,} ids of the training sequences)")
        return compact

    def to_full(self, compact: Tensor) -> Tensor:
        """Backbone ids of compact ids (any shape, same device)."""
        compact = compact.long()
        if compact.numel() and (compact.min() < 0 or compact.max() >= len(self)):
            raise DihalError(f"compact ids must lie in 0..{len(self) - 1}, "
                             f"got {int(compact.min())}..{int(compact.max())}")
        return self.full_ids.to(compact.device)[compact]

    def positions(self, ids: list[int]) -> list[int]:
        """The compact ids of those of the backbone ``ids`` that the vocabulary covers, sorted."""
        compact = self._compact_of[[i for i in set(ids) if 0 <= i < self.full_size]]
        return sorted(c for c in compact.tolist() if c >= 0)


# -- the diffusion baselines' contract -------------------------------------------------------


@dataclass(frozen=True)
class DiffusionOptions:
    """The options of every diffusion baseline, those DiffusionBaseline reads; each baseline's
    options dataclass extends it."""

    max_len: int | None = None  # learned token positions; None: the budget's seq_len
    steps: int = 50  # reverse steps in sampling
    eta: float = 1.0  # 1: ancestral (DDPM) steps; 0: deterministic DDIM


class CompactVocabularyBaseline(Baseline):
    """A baseline whose tables cover a :class:`CompactVocabulary`, known only from the training
    sequences, so its modules are built once that is known (:meth:`build`): by :meth:`fit` from
    the sequences it is given, by :meth:`load` from the vocabulary saved in the checkpoint's
    config, or by a caller that builds it explicitly. Until then it has no components.

    Subclasses set ``settings`` and ``max_len`` in ``__init__``, build their trained modules in
    ``build_modules`` and implement ``sample_batch`` over compact ids; this class supplies the
    training data (the compact token ids; a subclass that reads backbone features overrides it),
    the trained-or-loaded guard and the batched, seeded sampling loop, whose samples it maps back
    to backbone ids.
    """

    trained: bool = False
    vocabulary: CompactVocabulary | None = None
    max_len: int  # the learned token positions
    #: the trained modules by role, once built
    parts: nn.ModuleDict
    #: compact ids of the tokenizer's special tokens: never emitted
    banned: list[int]

    # -- the modules over the vocabulary ----------------------------------------------------
    def build(self, vocabulary: CompactVocabulary) -> None:
        """Size the trained modules to the allowance over ``vocabulary`` and initialise them from
        the seed, untrained."""
        if vocabulary.full_size != self.backbone.vocab_size:
            raise DihalError(f"{self.name}: a vocabulary of a {vocabulary.full_size:,}-token backbone, not of "
                             f"{self.backbone.name}'s {self.backbone.vocab_size:,} tokens")
        banned = vocabulary.positions(special_ids(self.backbone.tokenizer))
        if len(banned) == len(vocabulary):
            raise DihalError(f"{self.name}: the training sequences hold only special tokens; there is no text to learn")
        parts = nn.ModuleDict(self.build_modules(vocabulary))
        self.vocabulary, self.banned, self.parts, self.trained = vocabulary, banned, parts, False

    @abstractmethod
    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        """The trained modules by role (see ``components``) over ``vocabulary``, on the backbone's
        device, sized to the allowance and initialised under ``seeded_init(self.seed)``; fixed
        tables they read are set as attributes."""

    def built(self) -> CompactVocabulary:
        """The vocabulary; a DihalError before the modules are built."""
        if self.vocabulary is None:
            raise DihalError(f"{self.name}: not built yet; its tables cover the tokens of its training "
                             f"sequences, so fit it or load a checkpoint first")
        return self.vocabulary

    def components(self) -> dict[str, nn.Module]:
        self.built()
        return dict(self.parts)

    def config(self) -> dict:
        return {**super().config(), "vocabulary": self.built().to_dict()}

    def restore(self, saved: dict, directory: Path) -> None:
        self.build(CompactVocabulary.from_dict(saved.get("vocabulary"), str(Path(directory) / CONFIG_FILE)))

    # -- training and sampling ---------------------------------------------------------------
    def build_for(self, sequences: Tensor) -> None:
        """Build the modules over the vocabulary of ``sequences``, unless they are built."""
        if self.vocabulary is None:
            self.build(CompactVocabulary.from_sequences(sequences, self.backbone.vocab_size))

    def training_data(self, sequences: Tensor) -> dict[str, Tensor]:
        return {"ids": self.built().to_compact(sequences)}

    def fit(self, sequences: Tensor, checkpoint_dir: Path | None = None, progress: bool = True) -> TrainResult:
        self.build_for(sequences)
        result = super().fit(sequences, checkpoint_dir, progress)
        self.trained = True
        return result

    def load(self, directory: Path) -> None:
        super().load(directory)
        self.trained = True

    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        """Token ids (n, seq_len) of the backbone, from ``sample_batch``'s compact ids."""
        if not self.trained:
            raise DihalError(f"{self.name}: not trained; train it (fit) or load a checkpoint before sampling")
        if seq_len > self.max_len:
            raise DihalError(f"{self.name}: cannot sample {seq_len} tokens, it has positions for {self.max_len}")
        self.module().eval()
        generator = torch.Generator(device=self.backbone.device).manual_seed(seed)
        batches = math.ceil(n / batch_size)
        with tqdm(total=batches * self.calls_per_batch(seq_len), desc=self.name, disable=not progress,
                  leave=False) as bar:
            samples = [self.sample_batch(min(batch_size, n - start), seq_len, generator, bar)
                       for start in range(0, n, batch_size)]
        return self.built().to_full(torch.cat(samples)).cpu()

    @abstractmethod
    def calls_per_batch(self, seq_len: int) -> int:
        """How many network calls one ``sample_batch`` of ``seq_len`` tokens makes (the bar's steps)."""

    @abstractmethod
    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """Compact token ids (n, seq_len), none of them ``banned``, each network call followed by
        ``bar.update(1)``."""


class DiffusionBaseline(CompactVocabularyBaseline):
    """A baseline that generates through a reverse diffusion chain of ``steps`` denoiser calls
    over a compact vocabulary (:class:`CompactVocabularyBaseline`).

    Subclasses name their options dataclass, a DiffusionOptions, in ``options_class``, check their
    options in ``__init__``, build their trained modules in ``build_modules`` and implement
    ``sample_batch``, one reverse chain of ``self.steps`` denoiser calls; this class parses the
    options into ``settings``.
    """

    options_class: type[DiffusionOptions]
    settings: DiffusionOptions
    steps_option = "steps"

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.settings = parse_options(self.name, self.options_class, options)
        self.max_len = self.settings.max_len or budget.seq_len
        self.steps = self.settings.steps

    def check_ranges(self, at_least_one: tuple[str, ...], probabilities: tuple[str, ...] = ()) -> None:
        """A DihalError unless the options named in ``at_least_one`` are at least 1, ``eta`` is
        non-negative and the options named in ``probabilities`` lie in [0, 1]."""
        opts = self.settings
        if (any(getattr(opts, name) < 1 for name in at_least_one) or opts.eta < 0
                or any(not 0 <= getattr(opts, name) <= 1 for name in probabilities)):
            rule = f"{_listed(at_least_one)} must be at least 1, eta non-negative"
            if probabilities:
                rule += f" and {_listed(probabilities)} a probability"
            raise DihalError(f"{self.name}: {rule}")

    def sampling_options(self) -> dict:
        """Steps, eta and the vocabulary size; subclasses add their own."""
        return {"steps": self.steps, "eta": self.settings.eta, "vocabulary_size": len(self.built())}

    def calls_per_batch(self, seq_len: int) -> int:
        return self.steps


# -- the denoiser and its width --------------------------------------------------------------


class Denoiser(nn.Module):
    """f(x, t): per-position vectors (n, T, d_in) at diffusion time t (n,) -> x̂₀ (n, T, d_out).

    The improved-diffusion transformer Diffusion-LM used, shrunk: a projection d_in -> d_model,
    a sinusoidal time embedding through an MLP added at every position, learned absolute
    positions (``positions = "learned"``; ``"rotary"`` rotates queries and keys instead, as
    MDLM's denoiser does), bidirectional pre-LN blocks, a final LayerNorm and a projection
    d_model -> d_out.
    """

    def __init__(self, d_in: int, d_out: int, d_model: int, layers: int, heads: int, max_len: int, dropout: float,
                 positions: str = "learned"):
        super().__init__()
        self.heads, self.rotary = heads, positions == "rotary"
        self.in_proj = nn.Linear(d_in, d_model)
        self.time_mlp = nn.Sequential(nn.Linear(d_model, d_model), nn.SiLU(), nn.Linear(d_model, d_model))
        if not self.rotary:
            self.position = nn.Embedding(max_len, d_model)
        self.blocks = bidirectional_blocks(d_model, heads, dropout, layers, self.rotary)
        self.final_norm = nn.LayerNorm(d_model)
        self.out_proj = nn.Linear(d_model, d_out)

    def forward(self, x: Tensor, t: Tensor) -> Tensor:
        d_model = self.in_proj.out_features
        h = self.in_proj(x) + self.time_mlp(timestep_embedding(t, d_model))[:, None, :]
        if not self.rotary:
            h = h + self.position(torch.arange(x.shape[1], device=x.device))
        h = through_blocks(self.blocks, h, self.heads, self.rotary)
        return self.out_proj(self.final_norm(h))


def check_positions(method: str, positions: str, heads: int, d_model: int | None) -> None:
    """A DihalError unless ``positions`` is one of POSITIONS and an explicit ``d_model`` splits
    into ``heads`` heads (of an even width each for rotary positions, which turn coordinate pairs)."""
    if positions not in POSITIONS:
        raise DihalError(f"{method}: positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
    multiple = 2 * heads if positions == "rotary" else heads
    if d_model is not None and (d_model < 1 or d_model % multiple):
        raise DihalError(f"{method}: d_model must be a positive multiple of {multiple} (heads {heads}"
                         f"{', an even width each, for rotary positions' if multiple > heads else ''}), "
                         f"got {d_model}")


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


# -- reading tokens out of vectors -----------------------------------------------------------


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


def best_scoring_rows(x: Tensor, weight: Tensor, bias: Tensor | None = None, banned: list[int] | None = None) -> Tensor:
    """argmax_v (x · W_v + b_v) over the rows v not in ``banned``, for vectors x (..., d) and a
    (V, d) table W: row ids (...)."""
    flat = x.reshape(-1, x.shape[-1])

    def best(rows: Tensor) -> Tensor:
        scores = F.linear(rows, weight, bias)
        if banned:
            scores[:, banned] = float("-inf")
        return scores.argmax(-1)

    return torch.cat([best(rows) for rows in flat.split(SCORE_ROWS)]).reshape(x.shape[:-1])


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
                 generator: torch.Generator, banned: list[int] | None = None) -> Tensor:
        """Row ids of ``table`` (n, length), one position at a time, each drawn by the suite's one
        sampler (``dihal_bench.api.sampling.sample_next_token``) at ``temperature`` (0: greedy) and
        ``top_p``, never one in ``banned``. The whole prefix is re-run at each step (T ≤ max_len
        is short; no cache needed)."""
        output_embeddings = self.out_proj(table)
        ids = torch.empty(memory.shape[0], 0, dtype=torch.long, device=memory.device)
        for _ in range(length):
            logits = self(table[ids], memory)[:, -1] @ output_embeddings.T
            token = sample_next_token(logits, temperature, top_p, generator, banned=banned)
            ids = torch.cat([ids, token[:, None]], dim=1)
        return ids


# -- fixed tables from the backbone ----------------------------------------------------------


def embedding_table(backbone: Backbone, ids: Tensor) -> Tensor:
    """The backbone's embedding output for the tokens ``ids`` (V,), (V, width) float32: row k is
    what the backbone itself feeds its first layer for token ids[k]."""
    return backbone.embed(ids.to(backbone.device)[None])[0].float()


def check_embed_dim(backbone: Backbone, dim: int, method: str) -> None:
    """The ``method``'s DihalError unless 1 ≤ ``dim`` ≤ the backbone's width (a PCA's range)."""
    if not 1 <= dim <= backbone.width:
        raise DihalError(f"{method}: embed_dim must be in 1..{backbone.width} (the backbone's width), got {dim}")


def pca_embeddings(backbone: Backbone, dim: int, method: str, ids: Tensor) -> Tensor:
    """The rows of the tokens ``ids`` (V,) of the backbone's input embedding table E, projected
    on their ``dim`` leading principal axes, each projected row rescaled to norm √dim: a (V, dim)
    float32 table.

    PCA in float64 over those V rows: the axes are the top eigenvectors of the covariance
    (1/V)·Σ_v (e_v − ē)(e_v − ē)ᵀ, each signed so that its largest-magnitude loading is
    positive (the eigensolver's sign is arbitrary). The table is read in chunks, so a
    128k × 4096 vocabulary never sits in memory in float64. A ``dim`` outside 1..width is the
    ``method``'s DihalError.
    """
    check_embed_dim(backbone, dim, method)
    chunks = ids.to(backbone.device).split(PCA_ROWS)

    def rows(chunk: Tensor) -> Tensor:
        return backbone.embed(chunk[None])[0].to("cpu", torch.float64)

    total = torch.zeros(backbone.width, dtype=torch.float64)
    gram = torch.zeros(backbone.width, backbone.width, dtype=torch.float64)
    for chunk in chunks:
        block = rows(chunk)
        total += block.sum(0)
        gram += block.T @ block
    mean = total / len(ids)
    covariance = gram / len(ids) - torch.outer(mean, mean)
    _, eigenvectors = torch.linalg.eigh(covariance)  # eigenvalues ascending
    axes = eigenvectors[:, -dim:].flip(-1)
    axes = axes * axes.gather(0, axes.abs().argmax(0, keepdim=True)).sign()

    projected = torch.cat([(rows(chunk) - mean) @ axes for chunk in chunks])
    norms = projected.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return (projected * math.sqrt(dim) / norms).float()
