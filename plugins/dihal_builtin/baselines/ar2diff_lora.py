"""AR2Diff-LoRA: the backbone adapted into a masked-diffusion language model through LoRA adapters,
after DiffuGPT/DiffuLLaMA (Gong et al. 2024, arXiv 2410.17891), as a cheap adaptation within the
parameter allowance (docs/method.md#baselines)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL, masked_diffusion_nll
from dihal_bench.api.sampling import sample_next_token
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget
from dihal_builtin.baselines import flops

from .lora import LoRABaseline, LoRAOptions, output_logits

#: the smallest masking rate t drawn in training: the 1/t weight stays below 1,000
T_MIN = 1e-3


@dataclass(frozen=True)
class AR2DiffOptions(LoRAOptions):
    """AR2Diff-LoRA's options, besides LoRA's and the token sampler's (see LoRAOptions)."""

    steps: int = 50  # unmasking steps in sampling
    anneal_fraction: float = 0.25  # share of the budget's steps over which attention goes causal -> full


def draw_masking(n: int, length: int, generator: torch.Generator, device: torch.device | str = "cpu"
                 ) -> tuple[Tensor, Tensor]:
    """The forward process of absorbing-state diffusion with the linear schedule: a masking rate
    t ~ U(T_MIN, 1) per sequence (n,), then each of its ``length`` tokens masked with probability
    t, (n, length) bool. Drawn in that order from ``generator``."""
    t = T_MIN + (1 - T_MIN) * torch.rand(n, generator=generator, device=device)
    masked = torch.rand(n, length, generator=generator, device=device) < t[:, None]
    return t, masked


def masked_diffusion_loss(logits: Tensor, targets: Tensor, t: Tensor, masked: Tensor) -> Tensor:
    """The masked-diffusion bound on the per-token negative log-likelihood:
    (1/(n·T)) Σ_sequences (1/t) Σ_masked positions −log p(target), for ``logits`` (m, V) at the
    m masked positions (in row-major order of ``masked`` (n, T)), their ``targets`` (m,) and the
    masking rates ``t`` (n,). Unmasked positions contribute nothing (their token is given)."""
    weight = (1.0 / t)[:, None].expand_as(masked)[masked]
    return (weight * F.cross_entropy(logits.float(), targets, reduction="none")).sum() / masked.numel()


def anneal_ratio(step: int, anneal_steps: int) -> float:
    """The share of non-causal attention links open at 0-based training ``step``: rising linearly
    from 0 at step 0 to 1 at ``anneal_steps`` and after (1 throughout without annealing)."""
    return 1.0 if anneal_steps == 0 else min(1.0, step / anneal_steps)


def annealed_attention(n: int, length: int, ratio: float, generator: torch.Generator,
                       device: torch.device | str = "cpu") -> Tensor:
    """Which key each query may attend to, (n, length, length) bool: the causal links always, every
    other link with probability ``ratio``, drawn independently per sequence from ``generator``
    (DiffuLLaMA's mask annealing: causal at ratio 0, full bidirectional at ratio 1)."""
    positions = torch.arange(length, device=device)
    causal = positions[None, :] <= positions[:, None]
    return causal | (torch.rand(n, length, length, generator=generator, device=device) < ratio)


class AR2DiffLoRA(LoRABaseline):
    """A cheap AR-to-diffusion adaptation: DiffuGPT/DiffuLLaMA's recipe with LoRA adapters on the
    frozen backbone, within the parameter allowance and the matched budget (the papers fine-tune
    every weight on billions of tokens; this trains a few million on the budget's windows).

    Kept from Gong et al. 2024:
    - absorbing-state (masked) diffusion with the linear schedule: t ~ U(0.001, 1) per sequence,
      each token replaced by the mask token with probability t;
    - the shift: the input is [start, x_1..x_T] and the output at position i predicts token i+1,
      so every prediction sits where the pretrained model made its next-token prediction;
    - attention-mask annealing: at training step s the attention links are the causal ones OR
      Bernoulli(ratio) draws (per sequence), ratio = s/A rising from 0 to 1 over the first
      A = round(``anneal_fraction``·S) steps, then full bidirectional attention, as in sampling;
    - the loss: (1/(n·T)) Σ (1/t) Σ_masked −log p_θ(x_i | x_t), the masked-diffusion bound on the
      per-token negative log-likelihood;
    - sampling from the fully masked sequence in ``steps`` steps, unmasking the positions in a
      random order (a uniform permutation per sequence): after step k, ⌊T·k/steps⌋ positions are
      revealed, each new one drawn from the model's prediction by the suite's sampler at
      ``temperature`` and ``top_p`` (the suites: 1 and 1), never a special token. A step that
      reveals no position is skipped (it would change nothing).

    Adapted: LoRA adapters (rank and targets sized to the allowance as for ``ar-lora``) instead of
    full fine-tuning; the mask token is an existing special token (``mask_token_id``), not a new
    vocabulary row, since the embedding table is frozen and shared with every other method;
    annealing over the first quarter of the budget's steps.
    """

    name = "ar2diff-lora"
    paper = ("Gong et al. 2024, Scaling Diffusion Language Models via Adaptation from Autoregressive Models "
             "(DiffuGPT/DiffuLLaMA), arXiv 2410.17891; cheap LoRA adaptation")
    options_class = AR2DiffOptions

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        sampling = {"steps": flops.settings(cls.options_class, work).steps, **work.sampling}
        return flops.account(flops.ar2diff_lora(work.replace(sampling=sampling)))
    settings: AR2DiffOptions
    steps_option = "steps"

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        opts = self.settings
        if opts.steps < 1 or not 0 <= opts.anneal_fraction <= 1:
            raise DihalError(f"{self.name}: steps must be at least 1 and anneal_fraction in [0, 1]")
        self.anneal_steps = round(opts.anneal_fraction * budget.steps)
        self.mask_id = mask_token_id(backbone.tokenizer, self.start)
        # the training step the next loss() call makes, for the annealing ratio: loss() is not told
        # the step, and a buffer travels with the training checkpoints, so a resumed run anneals
        # exactly as an uninterrupted one; not persistent, so weights.safetensors holds LoRA only
        self.adapters.register_buffer("anneal_step", torch.zeros((), dtype=torch.long), persistent=False)

    def lora_settings(self) -> dict:
        return {**super().lora_settings(), "mask_token": self.mask_id, "anneal_steps": self.anneal_steps}

    def sampling_options(self) -> dict:
        return {**super().sampling_options(), "steps": self.settings.steps, "order": "random"}

    # -- attention ---------------------------------------------------------------------------
    def attention_argument(self, allowed: Tensor):
        """The ``attention_mask`` the Hugging Face model takes for links ``allowed`` (n, L, L):
        a 4-D additive float mask (n, 1, L, L), 0 where allowed and the dtype's minimum elsewhere,
        which transformers passes through unchanged to eager and SDPA attention alike. A model with
        sliding-window layers (Gemma3) takes one mask per layer kind, its local layers' links also
        cut to the window."""
        dtype = self.backbone.dtype
        blocked = torch.finfo(dtype).min

        def additive(links: Tensor) -> Tensor:
            return torch.zeros(links.shape, dtype=dtype, device=links.device).masked_fill(~links, blocked)[:, None]

        config = self.lm.config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds <= {"full_attention"}:
            return additive(allowed)
        positions = torch.arange(allowed.shape[-1], device=allowed.device)
        near = (positions[None, :] - positions[:, None]).abs() < config.sliding_window
        return {"full_attention": additive(allowed), "sliding_attention": additive(allowed & near)}

    def predict(self, noisy: Tensor, allowed: Tensor) -> Tensor:
        """Final hidden states (n, T, d) from the partly masked ids ``noisy`` (n, T): position i's
        state predicts token i (the shift: it is the output after token i−1, the start token
        standing before token 0)."""
        inputs = self.with_start(noisy)
        hidden = self.lm.model(input_ids=inputs, attention_mask=self.attention_argument(allowed),
                               use_cache=False).last_hidden_state
        return hidden[:, :-1]

    # -- training ----------------------------------------------------------------------------
    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        ids = batch["ids"]
        n, length = ids.shape
        step = int(self.adapters.anneal_step)
        self.adapters.anneal_step += 1
        t, masked = draw_masking(n, length, generator, ids.device)
        allowed = annealed_attention(n, length + 1, anneal_ratio(step, self.anneal_steps), generator, ids.device)
        hidden = self.predict(ids.masked_fill(masked, self.mask_id), allowed)
        return masked_diffusion_loss(output_logits(self.lm, hidden[masked]), ids[masked], t, masked)

    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """A bound: the masked-diffusion ELBO of each window (``masked_diffusion_nll``) under the fully
        bidirectional attention the sampler uses, over the backbone's whole vocabulary (the probability
        it gives the mask token itself is not renormalised away: that only loosens the bound)."""
        self.lm.eval()

        def log_probs_of(x_t: Tensor) -> Tensor:
            links = torch.ones(len(x_t), x_t.shape[1] + 1, x_t.shape[1] + 1, dtype=torch.bool, device=x_t.device)
            return output_logits(self.lm, self.predict(x_t, links)).float().log_softmax(-1)

        return masked_diffusion_nll(log_probs_of, windows.to(self.backbone.device).long(), self.mask_id, seed,
                                    batch_size)

    # -- sampling ----------------------------------------------------------------------------
    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        self.check_request(n, seq_len)
        generator = torch.Generator(device=self.backbone.device).manual_seed(seed)
        batches = [min(batch_size, n - first) for first in range(0, n, batch_size)]
        with tqdm(total=len(batches) * self.settings.steps, desc=self.name, disable=not progress, leave=False) as bar:
            return torch.cat([self.sample_batch(rows, seq_len, generator, bar) for rows in batches])

    def sample_batch(self, rows: int, seq_len: int, generator: torch.Generator, bar: tqdm) -> Tensor:
        """(rows, seq_len) ids: the fully masked sequence unmasked in a random order over ``steps`` steps."""
        device, opts = self.backbone.device, self.settings
        ids = torch.full((rows, seq_len), self.mask_id, dtype=torch.long, device=device)
        order = torch.rand(rows, seq_len, generator=generator, device=device).argsort(dim=1)
        allowed = torch.ones(rows, seq_len + 1, seq_len + 1, dtype=torch.bool, device=device)
        revealed = 0
        for step in range(1, opts.steps + 1):
            bar.update(1)
            target = seq_len * step // opts.steps
            if target == revealed:
                continue
            positions = order[:, revealed:target]
            hidden = self.predict(ids, allowed)
            chosen = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))
            logits = output_logits(self.lm, chosen).flatten(0, 1)
            drawn = sample_next_token(logits, opts.temperature, opts.top_p, generator, banned=self.banned)
            ids.scatter_(1, positions, drawn.view(rows, -1))
            revealed = target
        return ids.cpu()


def mask_token_id(tokenizer, start: int) -> int:
    """The token that stands for a masked position: the tokenizer's mask token, else its unknown
    token, else its first other special token, never the start token.

    Why an existing special token: a new vocabulary row would have to be trained in the frozen
    embedding table every other method shares (and, tied, in the LM head). A special token never
    occurs in the packed training windows, so the mask id is never a target, and the samplers never
    emit special ids, so it never appears in a sample. For SmolLM2 it is ``<|endoftext|>`` (id 0):
    its unknown token, which has no mask token, while the start token is ``<|im_start|>`` (id 1).
    """
    preferred = [getattr(tokenizer, "mask_token_id", None), getattr(tokenizer, "unk_token_id", None),
                 *sorted(set(getattr(tokenizer, "all_special_ids", None) or []))]
    for candidate in preferred:
        if candidate is not None and candidate != start:
            return candidate
    raise DihalError("ar2diff-lora needs a special token other than the start token to stand for masked positions; "
                     "the tokenizer has none")


@hookimpl
def register_baselines(register):
    register("ar2diff-lora", AR2DiffLoRA,
             description="the backbone adapted into a masked-diffusion LM with LoRA (DiffuGPT/DiffuLLaMA recipe; "
                         "a cheap adaptation: the papers fine-tune every weight on billions of tokens)")
