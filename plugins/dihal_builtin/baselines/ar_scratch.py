"""An autoregressive transformer trained from scratch at the parameter allowance: the from-scratch
rows' autoregressive counterpart, which separates "autoregressive vs diffusion" from "pretrained
vs not" (docs/rivals.md#ar-scratch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL, next_token_nll
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, check_sampling, sample_next_token
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_builtin.baselines import flops

from ..layers import Block
from .common import (
    CompactVocabulary,
    CompactVocabularyBaseline,
    parse_options,
    seeded_init,
    width_for_allowance,
)

#: std of the token and position embeddings at initialisation (GPT-2's); the output layer is tied to them
EMBEDDING_STD = 0.02


@dataclass(frozen=True)
class ARScratchOptions:
    max_len: int | None = None  # learned positions; None: the budget's seq_len
    d_model: int | None = None  # None: sized to the budget's parameter allowance
    layers: int = 4
    heads: int = 4
    dropout: float = 0.0
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 1.0


class CausalLM(nn.Module):
    """p(w_i | w_<i) over V tokens: a learned start vector, then the tokens' embeddings, plus
    learned positions, through causal pre-LN blocks, a final LayerNorm and an output layer tied
    to the token embeddings (GPT-2's layout, shrunk)."""

    def __init__(self, vocab_size: int, d_model: int, layers: int, heads: int, max_len: int, dropout: float):
        super().__init__()
        self.max_len = max_len
        self.token = nn.Embedding(vocab_size, d_model)
        self.start = nn.Parameter(torch.zeros(d_model))
        self.position = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.token.weight, std=EMBEDDING_STD)
        nn.init.normal_(self.position.weight, std=EMBEDDING_STD)
        self.blocks = nn.ModuleList(Block(d_model, heads, dropout, causal=True) for _ in range(layers))
        self.final_norm = nn.LayerNorm(d_model)

    def inputs(self, previous: Tensor, offset: int = 0) -> Tensor:
        """The input vectors (n, k, d) at positions offset.. of the start vector (position 0)
        followed by the tokens ``previous``."""
        vectors = self.token(previous)
        if offset == 0:
            start = self.start.expand(previous.shape[0], 1, -1)
            vectors = torch.cat([start, vectors], dim=1)
        return vectors + self.position(torch.arange(offset, offset + vectors.shape[1], device=previous.device))

    def logits(self, h: Tensor) -> Tensor:
        return F.linear(self.final_norm(h), self.token.weight)

    def forward(self, previous: Tensor) -> Tensor:
        """Logits (n, k+1, V) of tokens 0..k from tokens 0..k−1 (n, k)."""
        h = self.inputs(previous)
        for block in self.blocks:
            h = block(h)
        return self.logits(h)

    def step(self, h: Tensor, cache: list[tuple[Tensor, Tensor]]) -> Tensor:
        """Logits (n, V) of the next token from the input vector h (n, 1, d) of the newest
        position, every earlier position's keys and values being in ``cache`` (one (k, v) pair per
        block, extended in place). The same arithmetic as ``forward`` restricted to one query:
        it attends to every cached position, which the causal mask would all allow."""
        for index, block in enumerate(self.blocks):
            d_model = h.shape[-1]
            q, k, v = block.qkv(block.attn_norm(h)).split(d_model, dim=-1)
            if cache[index][0].numel():
                k, v = torch.cat([cache[index][0], k], dim=1), torch.cat([cache[index][1], v], dim=1)
            cache[index] = (k, v)
            h = h + block.attn_out(_attend_all(q, k, v, block.heads))
            h = h + block.mlp(block.mlp_norm(h))
        return self.logits(h)[:, -1]


def _attend_all(q: Tensor, k: Tensor, v: Tensor, heads: int) -> Tensor:
    """Multi-head attention of queries q (n, 1, d) to all keys and values (n, T, d)."""
    n, _, d_model = k.shape
    split = [x.reshape(n, x.shape[1], heads, d_model // heads).transpose(1, 2) for x in (q, k, v)]
    return F.scaled_dot_product_attention(*split).transpose(1, 2).reshape(n, q.shape[1], d_model)


class ARScratch(CompactVocabularyBaseline):
    """A small GPT-style causal transformer trained from scratch with next-token cross-entropy on
    the compact vocabulary, the V tokens of the training sequences (``common.CompactVocabulary``).

    Architecture: 4 causal pre-LN blocks (``layers``) with GELU MLPs, learned absolute
    positions, the output layer tied to the token embeddings, d_model sized to the allowance
    like the other from-scratch rows; the same trunk as ``mdlm``'s denoiser but causal, so the
    two rows differ in the generation order and the loss, not the network. A window's first
    token is predicted from a learned start vector (no special token: packed windows hold none),
    so the loss is the mean cross-entropy of all T tokens. Sampling draws T tokens left to right
    with the suite's one sampler (``dihal_bench.api.sampling.sample_next_token``) at ``temperature``
    and ``top_p``, never a special token, with a key/value cache (one position per forward step).
    """

    name = "ar-scratch"
    paper = "a causal transformer from scratch at the allowance (control, docs/rivals.md)"
    token_sampling_options = ("temperature", "top_p")
    draw_precision = NEXT_TOKEN_PRECISION

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        return flops.account(flops.ar_scratch(work, flops.settings(ARScratchOptions, work)))

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings = parse_options(self.name, ARScratchOptions, options)
        if min(opts.layers, opts.heads) < 1 or (opts.max_len is not None and opts.max_len < 1):
            raise DihalError(f"{self.name}: layers, heads and max_len must be at least 1")
        if opts.d_model is not None and (opts.d_model < 1 or opts.d_model % opts.heads):
            raise DihalError(f"{self.name}: d_model must be a positive multiple of heads {opts.heads}, "
                             f"got {opts.d_model}")
        check_sampling(opts.temperature, opts.top_p)
        self.max_len = opts.max_len or budget.seq_len

    # -- the network over the vocabulary ------------------------------------------------------
    def build_modules(self, vocabulary: CompactVocabulary) -> dict[str, nn.Module]:
        """The network over ``vocabulary``, sized to the allowance and initialised from the seed."""
        opts = self.settings

        def network(d_model: int) -> CausalLM:
            return CausalLM(len(vocabulary), d_model, opts.layers, opts.heads, self.max_len, opts.dropout)

        d_model = opts.d_model or width_for_allowance(self.name, self.budget, network, opts.heads)
        with seeded_init(self.seed):
            return {"decoder": network(d_model).to(self.backbone.device)}

    @property
    def lm(self) -> CausalLM:
        return self.parts["decoder"]

    def sampling_options(self) -> dict:
        return {"temperature": self.settings.temperature, "top_p": self.settings.top_p, "kv_cache": True,
                "vocabulary_size": len(self.built())}

    # -- training -----------------------------------------------------------------------------
    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        """Mean next-token cross-entropy over the T tokens of each window."""
        ids = batch["ids"]
        logits = self.lm(ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids.reshape(-1))

    @torch.no_grad()
    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """Exact: the network's next-token probabilities over the compact vocabulary (zero for any
        other token), the first token from the start vector, as in training."""
        self.module().eval()
        ids = self.built().to_compact(windows.to(self.backbone.device))
        return next_token_nll(lambda batch: self.lm(batch[:, :-1]), ids, batch_size)

    # -- sampling -----------------------------------------------------------------------------
    def calls_per_batch(self, seq_len: int) -> int:
        return seq_len  # one cached step per token

    def sample_batch(self, n: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """Compact ids (n, seq_len), one position per cached forward step."""
        opts, lm = self.settings, self.lm
        cache = [(torch.empty(0), torch.empty(0)) for _ in lm.blocks]
        h = lm.inputs(torch.empty(n, 0, dtype=torch.long, device=generator.device))  # the start vector
        tokens = []
        for position in range(seq_len):
            token = sample_next_token(lm.step(h, cache), opts.temperature, opts.top_p, generator, banned=self.banned)
            tokens.append(token)
            bar.update(1)
            if position + 1 < seq_len:
                h = lm.inputs(token[:, None], offset=position + 1)
        return torch.stack(tokens, dim=1)


@hookimpl
def register_baselines(register):
    register("ar-scratch", ARScratch,
             description="a causal transformer trained from scratch at the allowance on the compact vocabulary "
                         "(autoregressive control)")
