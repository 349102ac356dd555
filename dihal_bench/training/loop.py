"""The one training loop every method runs under a Budget (docs/method.md#budget).

AdamW on the trainable parameters, linear warm-up then cosine decay to zero, global
gradient-norm clipping, one seeded permutation of the training sequences per epoch.

Determinism that survives a kill: all randomness of step s is seeded from
(budget.seed, s), so resuming needs only the weights and the AdamW moments, never an RNG
state. A checkpoint is three files written atomically, ``trainer.json`` last:

- ``model.safetensors``: trainable parameters and all buffers (frozen parameters come
  from the model's own construction and are not repeated in every checkpoint);
- ``optimizer.safetensors``: the AdamW state, flattened to ``state.{i}.{name}`` keys;
- ``trainer.json``: the step, the budget, the losses so far and a fingerprint of the
  model's parameter names and shapes, which a resume must match.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from dihal_bench.base.files import (
    atomic_path,
    file_sha256,
    json_sha256,
    warn,
    write_text_atomic,
)
from dihal_bench.errors import DihalError
from dihal_bench.training import resumed
from dihal_bench.training.budget import Budget

LossFn = Callable[[nn.Module, dict[str, Tensor], torch.Generator], Tensor]

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
TRAINER_FILE = "trainer.json"


@dataclass
class TrainResult:
    losses: list[float]  # one per optimizer step, including steps done before a resume
    steps_done: int
    sequences_seen: int
    tokens_seen: int  # nominal: sequences_seen x budget.seq_len, padding included
    wall_seconds: float  # this call only
    resumed_from_step: int | None  # None when training started from scratch
    #: the training seconds the checkpoint it resumed from carried (earlier, interrupted attempts)
    earlier_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        """What the whole training took, over every attempt: what a record reports."""
        return self.earlier_seconds + self.wall_seconds


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters the optimizer updates (shared parameters counted once)."""
    return [p for p in module.parameters() if p.requires_grad]


def count_trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in trainable_parameters(module))


def learning_rate(budget: Budget, step: int) -> float:
    """Learning rate of the update made at 0-based ``step``.

    With W = round(warmup_frac x steps) warm-up steps: lr x (step+1)/W while step < W, then
    lr x ½(1 + cos(π (step−W)/(steps−W))), which reaches 0 just after the last step.
    """
    warmup = min(round(budget.warmup_frac * budget.steps), budget.steps - 1)
    if step < warmup:
        return budget.lr * (step + 1) / warmup
    progress = (step - warmup) / (budget.steps - warmup)
    return budget.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def derived_seed(seed: int, purpose: str, index: int) -> int:
    """An independent 63-bit seed for one (purpose, index), e.g. ("loss", step)."""
    digest = hashlib.sha256(f"{seed}/{purpose}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def batch_indices(budget: Budget, n_sequences: int, step: int) -> Tensor:
    """The training-sequence indices of ``step``: positions step·B .. step·B+B−1 in the
    concatenation of one seeded permutation per epoch (no repeats within an epoch)."""
    positions = torch.arange(step * budget.batch_size, (step + 1) * budget.batch_size)
    epochs = positions // n_sequences
    indices = torch.empty_like(positions)
    for epoch in epochs.unique().tolist():
        here = epochs == epoch
        indices[here] = _epoch_order(budget.seed, n_sequences, epoch)[positions[here] % n_sequences]
    return indices


@functools.lru_cache(maxsize=2)  # a batch touches at most two epochs
def _epoch_order(seed: int, n_sequences: int, epoch: int) -> Tensor:
    generator = torch.Generator().manual_seed(derived_seed(seed, "epoch", epoch))
    return torch.randperm(n_sequences, generator=generator)


def train(
    model: nn.Module,
    loss_fn: LossFn,
    data: dict[str, Tensor],
    budget: Budget,
    checkpoint_dir: Path | None = None,
    progress: bool = True,
    desc: str = "train",
) -> TrainResult:
    """Train ``model`` in place for ``budget.steps`` steps of ``loss_fn`` on ``data``.

    ``data`` holds tensors whose leading dimension indexes the training sequences; each
    step hands ``loss_fn(model, batch, generator)`` those rows for its batch (on the
    model's device) and a generator seeded for that step. If ``checkpoint_dir`` holds a
    checkpoint of this budget and model, training resumes from it; the result is bitwise
    the same as an uninterrupted run (a damaged checkpoint is discarded with a warning).
    Each step reseeds torch's global RNG (for dropout), so the caller's global RNG state
    does not survive the call. The model is left in eval mode.

    Launched as several processes (``torchrun``, ``accelerate launch --multi_gpu``), the
    processes train the model data-parallel with the same global batch, randomness and
    checkpoints (written by the main process), and the same numbers up to float summation
    order (``dihal_bench.training.distributed``, docs/distributed.md).
    """
    n_sequences = _shared_length(data)
    budget.check_fits(n_sequences)
    params = trainable_parameters(model)
    if not params:
        raise DihalError(f"{desc}: the model has no trainable parameters")
    processes = _processes(budget, desc)
    optimizer = torch.optim.AdamW(params, lr=budget.lr, weight_decay=budget.weight_decay)
    stepper = processes.prepare(model, loss_fn, optimizer)  # may move the model to this process's device
    device = params[0].device

    losses: list[float] = []
    resumed_from, earlier = None, 0.0
    if checkpoint_dir is not None:
        losses, earlier = _resume(processes, Path(checkpoint_dir), model, optimizer, budget, desc)
        resumed_from = len(losses) or None
        resumed.credit(earlier)

    started = time.perf_counter()
    model.train()
    bar = tqdm(total=budget.steps, initial=len(losses), desc=desc, leave=False,
               disable=not progress or not processes.is_main)
    try:
        for step in range(len(losses), budget.steps):
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(budget, step)
            rows = processes.rows_of(batch_indices(budget, n_sequences, step))
            batch = {key: value[rows].to(device) for key, value in data.items()}
            torch.manual_seed(derived_seed(budget.seed, "torch", step))  # dropout and other global-RNG draws
            generator = torch.Generator(device=device).manual_seed(derived_seed(budget.seed, "loss", step))

            loss = processes.loss(batch, generator)
            reported = processes.mean(loss)  # the global batch's loss, the same on every process
            if not torch.isfinite(reported):
                raise DihalError(f"{desc}: loss is {reported.item()} at step {step}; lower budget.lr or check the data")
            stepper.zero_grad(set_to_none=True)
            processes.backward(loss)
            if budget.grad_clip > 0:
                processes.clip(params, budget.grad_clip)
            stepper.step()

            losses.append(reported.item())
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            done = step + 1
            if checkpoint_dir is not None and (done % budget.checkpoint_every == 0 or done == budget.steps):
                if processes.is_main:
                    _save_checkpoint(Path(checkpoint_dir), model, optimizer, budget, losses,
                                     earlier + time.perf_counter() - started)
                processes.barrier()
    finally:
        bar.close()
        processes.close()
    model.eval()

    return TrainResult(
        losses=losses,
        steps_done=len(losses),
        sequences_seen=len(losses) * budget.batch_size,
        tokens_seen=len(losses) * budget.tokens_per_step,
        wall_seconds=time.perf_counter() - started,
        resumed_from_step=resumed_from,
        earlier_seconds=earlier,
    )


class OneProcess:
    """The loop's operations in a single process: the plain loop, exactly as it was before
    data-parallel training existed. ``dihal_bench.training.distributed.DataParallel`` is the same
    interface over several processes."""

    is_main = True

    def prepare(self, model: nn.Module, loss_fn: LossFn, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        self.model, self.loss_fn = model, loss_fn
        return optimizer

    def rows_of(self, indices: Tensor) -> Tensor:
        return indices

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        return self.loss_fn(self.model, batch, generator)

    def mean(self, loss: Tensor) -> Tensor:
        return loss

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def clip(self, params: list[nn.Parameter], max_norm: float) -> None:
        nn.utils.clip_grad_norm_(params, max_norm)

    def main_first(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def barrier(self) -> None:
        pass

    def agree(self, step: int, where: str) -> None:
        pass

    def close(self) -> None:
        pass


def _processes(budget: Budget, desc: str):
    """OneProcess, or DataParallel when launched as several processes; accelerate is imported only
    then, so a one-process run pays nothing for it."""
    from dihal_bench.training.distributed import world_size

    if world_size() == 1:
        return OneProcess()
    from dihal_bench.training.distributed import DataParallel

    return DataParallel(budget, desc)


def _resume(processes, directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, budget: Budget,
            desc: str) -> tuple[list[float], float]:
    """The losses of the checkpoint in ``directory`` loaded into model and optimizer, and the
    training seconds spent up to it; or ([], 0) to start from step 0. The main process reads first,
    so that it alone warns about (and discards) a damaged checkpoint; then every process must stand
    at the same step."""
    losses: list[float] = []
    seconds = 0.0
    with processes.main_first():
        if (directory / TRAINER_FILE).exists():
            losses, seconds = _load_checkpoint(directory, model, optimizer, budget, desc) or ([], 0.0)
    processes.agree(len(losses), str(directory))
    return losses, seconds


def _shared_length(data: dict[str, Tensor]) -> int:
    lengths = {key: value.shape[0] for key, value in data.items()}
    if not lengths or len(set(lengths.values())) != 1:
        raise ValueError(f"training data must be tensors with one shared leading dimension, got {lengths}")
    return next(iter(lengths.values()))


# -- checkpoints ----------------------------------------------------------------------


def _saved_tensors(model: nn.Module) -> dict[str, Tensor]:
    """What a checkpoint stores of the model: trainable parameters and all buffers."""
    tensors = {name: p for name, p in model.named_parameters() if p.requires_grad}
    tensors.update(model.named_buffers())
    return tensors


def _fingerprint(model: nn.Module) -> tuple[str, dict[str, list]]:
    """sha256 over (name, shape, trainable) of every parameter, and that listing itself."""
    listing = {name: [list(p.shape), p.requires_grad] for name, p in model.named_parameters()}
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest(), listing


def _budget_identity(budget: Budget) -> dict:
    """The budget fields a resume must match (checkpoint_every does not change the result)."""
    return {key: value for key, value in budget.to_dict().items() if key != "checkpoint_every"}


def _save_checkpoint(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, budget: Budget, losses: list[float],
    seconds: float,
) -> None:
    """The checkpoint of ``losses``' step: trainable weights, optimizer state, and trainer.json (step,
    budget, losses, the model's fingerprint, the training ``seconds`` up to here over every attempt)."""
    directory.mkdir(parents=True, exist_ok=True)
    model_tensors = {name: t.detach().contiguous() for name, t in _saved_tensors(model).items()}
    optimizer_tensors = {
        f"state.{index}.{key}": value.detach().contiguous()
        for index, state in optimizer.state_dict()["state"].items()
        for key, value in state.items()
    }
    fingerprint, listing = _fingerprint(model)
    record = {
        "step": len(losses),
        "budget": budget.to_dict(),
        "losses": losses,
        "model_fingerprint": fingerprint,
        "model_parameters": listing,
        "seconds": seconds,
    }

    # trainer.json goes first and comes back last: while the tensor files are swapped, no
    # record claims a step they might not hold (a kill there costs the checkpoint, not
    # correctness, and no spurious warning about a damaged checkpoint follows).
    (directory / TRAINER_FILE).unlink(missing_ok=True)
    files = {}
    for file, tensors in ((MODEL_FILE, model_tensors), (OPTIMIZER_FILE, optimizer_tensors)):
        with atomic_path(directory / file) as temporary:
            save_file(tensors, temporary)
            files[file] = file_sha256(temporary)
    record["sha256"] = {"files": files, "record": json_sha256(record)}
    write_text_atomic(directory / TRAINER_FILE, json.dumps(record, indent=1))


def _load_checkpoint(
    directory: Path, model: nn.Module, optimizer: torch.optim.Optimizer, budget: Budget, desc: str
) -> tuple[list[float], float] | None:
    """Load a matching checkpoint into model and optimizer and return the losses so far and the
    training seconds they took (0 for a checkpoint written before checkpoints kept them); or None,
    with a warning, when the checkpoint is damaged and training must start over.

    A checkpoint of another budget or model is the user's to sort out: DihalError.
    """
    record, problem = _verified_record(directory)
    if problem is not None:
        warn(f"{desc}: discarding the checkpoint in {directory}: {problem}; training restarts from step 0")
        (directory / TRAINER_FILE).unlink(missing_ok=True)
        return None
    saved, wanted = _budget_identity(Budget.from_dict(record["budget"])), _budget_identity(budget)
    if saved != wanted:
        changes = ", ".join(f"{key} {saved[key]} -> {wanted[key]}" for key in wanted if saved[key] != wanted[key])
        raise DihalError(
            f"checkpoint in {directory} was trained under a different budget ({changes}); "
            f"delete it or restore the budget"
        )
    fingerprint, listing = _fingerprint(model)
    if record["model_fingerprint"] != fingerprint:
        difference = _describe_difference(record["model_parameters"], listing)
        raise DihalError(
            f"checkpoint in {directory} is for a different model ({difference}); delete it or restore the model"
        )

    targets = _saved_tensors(model)
    tensors = load_file(directory / MODEL_FILE)
    if tensors.keys() != targets.keys():
        raise DihalError(f"checkpoint in {directory} holds other tensors than the model's parameters and buffers")
    with torch.no_grad():
        for name, tensor in tensors.items():
            targets[name].copy_(tensor)

    state: dict[int, dict[str, Tensor]] = {}
    for key, tensor in load_file(directory / OPTIMIZER_FILE).items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": optimizer.state_dict()["param_groups"]})
    return list(record["losses"]), float(record.get("seconds", 0.0))


def _verified_record(directory: Path) -> tuple[dict | None, str | None]:
    """(trainer.json's record, None) when it and both tensor files match the sha256 sums it
    holds; else (None, what is wrong). The record's own sum covers its step, budget and
    losses, so a damaged one cannot pass for a budget mismatch or resume at a wrong step."""
    path = directory / TRAINER_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        hashes = record.pop("sha256")
        expected_record, files = hashes["record"], hashes["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{path} is not readable JSON ({exc})"
    except (KeyError, TypeError, AttributeError):
        return None, f"{path} has no integrity record (damaged, or written by an older dihal-bench)"
    if json_sha256(record) != expected_record:
        return None, f"{path} does not match its recorded sha256"
    for file in (MODEL_FILE, OPTIMIZER_FILE):
        try:
            if file_sha256(directory / file) != files.get(file):
                return None, f"{directory / file} does not match the sha256 recorded in {TRAINER_FILE}"
        except OSError as exc:
            return None, f"{directory / file} cannot be read ({exc.strerror or exc})"
    return record, None


def _describe_difference(saved: dict[str, list], current: dict[str, list]) -> str:
    missing = [name for name in saved if name not in current]
    extra = [name for name in current if name not in saved]
    changed = [
        f"{name} {saved[name]} -> {current[name]}"
        for name in saved
        if name in current and saved[name] != current[name]
    ]
    groups = (("parameters gone", missing), ("new parameters", extra), ("[shape, trainable] changed", changed))
    parts = [
        f"{label}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}" for label, names in groups if names
    ]
    return "; ".join(parts)
