"""The intact backbone sampled autoregressively: the reference every method is read against
(docs/method.md#baselines). It trains nothing and sits outside the budget."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from dihal_bench import hookimpl
from dihal_bench.api.backbone import Backbone
from dihal_bench.api.baseline import CONFIG_FILE, Baseline, read_config
from dihal_bench.api.flops import FlopAccount, MethodWork
from dihal_bench.api.likelihood import HeldOutNLL
from dihal_bench.api.sampling import NEXT_TOKEN_PRECISION, check_sampling
from dihal_bench.base.files import write_json_atomic
from dihal_bench.errors import DihalError
from dihal_bench.hybrid.evaluation import hybrid_test_nll
from dihal_bench.hybrid.model import intact_control
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import TrainResult
from dihal_builtin.baselines import flops

from .common import parse_options


@dataclass(frozen=True)
class ARBackboneOptions:
    temperature: float = 1.0  # 0 is greedy
    top_p: float = 1.0  # nucleus; 1 keeps the whole vocabulary


class ARBackbone(Baseline):
    """The frozen backbone generating left to right, one token per forward step with its
    key/value cache, from the start token: the tokenizer's BOS, or its EOS where there is no
    BOS (SmolLM2 defines ``<|im_start|>`` as BOS but never adds it to text; the start token is
    not part of the T returned tokens). Decoding is the hybrid's own loop
    (``dihal_bench.hybrid.model.intact_control``), so the backbone and DiHAL are sampled identically.

    ``in_budget = False``: nothing is trained, so fit() takes no step, save() writes only the
    configuration and load() reads only that.
    """

    name = "ar-backbone"
    paper = "the intact backbone (reference control, docs/method.md#baselines)"
    in_budget = False
    intact_backbone = True
    token_sampling_options = ("temperature", "top_p")
    draw_precision = NEXT_TOKEN_PRECISION  # the hybrid's decode loop draws through sample_next_token

    @classmethod
    def flop_account(cls, work: MethodWork) -> FlopAccount:
        return flops.account(flops.ar_backbone(work))

    def __init__(self, backbone: Backbone, budget: Budget, seed: int = 0, **options):
        super().__init__(backbone, budget, seed, **options)
        self.settings = parse_options(self.name, ARBackboneOptions, options)
        check_sampling(self.settings.temperature, self.settings.top_p)
        self.lm = intact_control(backbone)

    def components(self) -> dict[str, nn.Module]:
        return {}

    def sampling_options(self) -> dict:
        tokenizer = self.backbone.tokenizer
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        return {"temperature": self.settings.temperature, "top_p": self.settings.top_p, "start_token": start}

    def training_data(self, sequences: Tensor) -> dict[str, Tensor]:
        return {}

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        raise DihalError(f"{self.name} trains nothing: it has no loss")

    def fit(self, sequences: Tensor, checkpoint_dir: Path | None = None, progress: bool = True) -> TrainResult:
        return TrainResult(losses=[], steps_done=0, sequences_seen=0, tokens_seen=0, wall_seconds=0.0,
                           resumed_from_step=None)

    def sample(self, n: int, seq_len: int, seed: int, batch_size: int = 16, progress: bool = False) -> Tensor:
        return self.lm.generate(n, seq_len, temperature=self.settings.temperature, top_p=self.settings.top_p,
                                seed=seed, batch_size=batch_size, progress=progress)

    def test_nll(self, windows: Tensor, seed: int, batch_size: int = 16) -> HeldOutNLL:
        """Exact: the backbone's own next-token probabilities, the first token from the start token."""
        return hybrid_test_nll(self.lm, windows, batch_size)

    def save(self, directory: Path) -> None:
        write_json_atomic(Path(directory) / CONFIG_FILE, self.config())

    def load(self, directory: Path) -> None:
        self.check_saved(read_config(Path(directory)), directory)


@hookimpl
def register_baselines(register):
    register("ar-backbone", ARBackbone,
             description="the intact backbone sampled autoregressively (reference, outside the budget)")
