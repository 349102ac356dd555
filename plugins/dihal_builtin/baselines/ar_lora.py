"""AR-LoRA: the backbone fine-tuned autoregressively with LoRA adapters (Hu et al. 2021, arXiv
2106.09685) within the parameter allowance (docs/rivals.md)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from dihal_bench import hookimpl
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL, next_token_nll
from dihal_bench.api.sampling import sample_next_token
from dihal_builtin import compat
from dihal_builtin.baselines import flops

from .lora import LoRABaseline


class ARLoRA(LoRABaseline):
    """The backbone fine-tuned as it was pretrained, left to right, through LoRA adapters: what a
    practitioner would do with the same pretrained model and the same budget.

    Kept from LoRA (Hu et al. 2021): frozen weights W, a trainable low-rank update W + (α/r)·B·A
    with A Kaiming-uniform and B zero, so training starts from the backbone itself; no adapter
    dropout, no bias. The rank and the adapted maps are chosen from the allowance (see
    ``choose_adapter``), alpha = 2·rank. Loss: the mean next-token cross-entropy over every
    position of the window, the first token predicted from the start token (BOS, else EOS), as
    sampling starts. Sampling: left to right from the start token with a key/value cache, each
    token drawn by the suite's one sampler at ``temperature`` and ``top_p``, never a special token.
    """

    name = "ar-lora"
    paper = "Hu et al. 2021, LoRA: Low-Rank Adaptation of Large Language Models, arXiv 2106.09685"

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        return flops.account(flops.ar_lora(work))

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        ids = batch["ids"]
        logits = self.lm(input_ids=self.with_start(ids[:, :-1]), use_cache=False).logits
        return F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())

    @torch.no_grad()
    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """Exact: the adapted model's next-token probabilities, the first token from the start token
        as in training."""
        self.lm.eval()
        device = self.backbone.device
        return next_token_nll(lambda batch: self.lm(input_ids=self.with_start(batch[:, :-1].to(device)),
                                                    use_cache=False).logits, windows, batch_size)

    @torch.no_grad()
    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        self.check_request(n, seq_len)
        device, opts = self.backbone.device, self.settings
        generator = torch.Generator(device=device).manual_seed(seed)
        samples = []
        for first in tqdm(range(0, n, batch_size), desc=self.name, disable=not progress, leave=False):
            rows = min(batch_size, n - first)
            cache = {compat.cache_keyword(self.lm): compat.new_cache(self.lm.config)}
            token = torch.full((rows, 1), self.start, dtype=torch.long, device=device)
            drawn = []
            for _ in range(seq_len):
                logits = self.lm(input_ids=token, **cache, use_cache=True).logits[:, -1]
                token = sample_next_token(logits, opts.temperature, opts.top_p, generator, banned=self.banned)[:, None]
                drawn.append(token)
            samples.append(torch.cat(drawn, dim=1).cpu())
        return torch.cat(samples)


@hookimpl
def register_baselines(register):
    register("ar-lora", ARLoRA,
             description="the backbone fine-tuned autoregressively with LoRA, rank and targets sized to the allowance")
