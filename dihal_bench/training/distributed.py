"""Data-parallel training of the shared loop through Hugging Face accelerate (docs/distributed.md).

``dihal_bench.training.loop.train`` runs here when the job has several processes (``torchrun
--nproc_per_node W`` or ``accelerate launch --multi_gpu --num_processes W``, on GPUs or CPUs alike):
DistributedDataParallel underneath, set up by ``Accelerator.prepare``. The contract is the
one-process run's, up to float summation order:

- **Batches.** ``budget.batch_size`` stays the global batch B. Process r takes rows
  r·B/W .. (r+1)·B/W − 1 of the step's indices (``batch_indices``); DDP averages the gradients, so
  a loss that is a mean over equal shares of the batch gets the one-process gradient.
- **Randomness** (:class:`RowReplay`). Every process seeds the step's loss generator and torch's
  global RNG exactly as one process does. While the loss function runs, a draw whose leading
  dimension is this process's share of the batch is made for the whole batch B, as one process
  makes it, and the process keeps its own rows. The generators thus consume the same stream on
  every process as in one process, so later draws (a coin for self-conditioning, say) agree too,
  and no loss function has to change.
- **Loss and checkpoints.** The reported loss is the all-reduced mean. Only the main process
  writes checkpoints, the others wait at a barrier; a checkpoint does not depend on W.

Why the loss function becomes a module's forward (:class:`LossModule`): DDP synchronises gradients
only for a forward pass made through its wrapper, and loss functions call whatever methods they
need (``bridge.loss``, a baseline's parts), not ``model(...)``. Wrapping ``loss_fn(model, ...)`` as
the forward of a module that holds the model makes every loss function a DDP forward unchanged.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from dihal_bench.base.files import warn
from dihal_bench.errors import DihalError
from dihal_bench.training.budget import Budget


def world_size() -> int:
    """Processes in this job: torch.distributed's world when it is initialised, else WORLD_SIZE,
    which ``accelerate launch`` and ``torchrun`` set; 1 outside a launcher. Reading the environment
    keeps the one-process path free of accelerate's import."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE") or 1)


def _accelerator_available() -> bool:
    """Whether this machine has a GPU-like device. Without one, accelerate must be told ``cpu=True``:
    otherwise it takes a torchrun-launched process for a lone one and each would train the whole batch."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def rows_per_process(batch_size: int, processes: int, desc: str) -> int:
    """This process's share of a global batch, refused unless it is whole and at least 2.

    One row per process is refused because :class:`RowReplay` tells a per-row draw from a
    batch-level one by its leading dimension: with one row, ``torch.rand(1)`` could be either.
    """
    if batch_size % processes:
        raise DihalError(f"{desc}: budget.batch_size {batch_size} does not split over {processes} processes; "
                         f"use a multiple of {processes}")
    rows = batch_size // processes
    if rows < 2:
        raise DihalError(f"{desc}: budget.batch_size {batch_size} over {processes} processes leaves one sequence "
                         f"per process, where a per-sequence draw cannot be told from a single one; use a batch "
                         f"of at least {2 * processes}")
    return rows


# -- randomness ----------------------------------------------------------------------------------


def _size_of(func, args: tuple, kwargs: dict) -> tuple | None:
    """The ``size`` of a factory call: ``torch.rand(2, 3)``, ``torch.rand((2, 3))``, a trailing
    size (``torch.randint(5, (2, 3))``, ``torch.normal(0.0, 1.0, (2, 3))``) or ``size=``."""
    if "size" in kwargs:
        return tuple(kwargs["size"])
    if func in (torch.rand, torch.randn) and args and all(isinstance(a, int) for a in args):
        return tuple(args)
    last = args[-1] if args else None
    return tuple(last) if isinstance(last, (tuple, list, torch.Size)) else None


def _numbers(values) -> bool:
    return all(not isinstance(value, Tensor) for value in values)


_FACTORIES = (torch.rand, torch.randn, torch.randint, torch.normal)
_LIKE = (torch.rand_like, torch.randn_like, torch.randint_like)
_FILLS = tuple(getattr(Tensor, name) for name in (
    "normal_", "uniform_", "bernoulli_", "exponential_", "random_", "cauchy_", "log_normal_", "geometric_"))
#: draws with tensor inputs of this process's rows: what the other rows' inputs are is not known here
_UNREPLAYABLE = (torch.bernoulli, torch.multinomial, torch.poisson, torch.normal, *_FILLS,
                 F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout)
_DROPOUT_SIGNATURE = inspect.signature(F.dropout)


class RowReplay(TorchFunctionMode):
    """While a loss function runs on rows ``start .. start+rows−1`` of a global batch of ``total``:
    each per-row draw is made for the whole batch, as one process makes it, and cut to these rows.

    A per-row draw is one from ``generator`` (the step's loss generator) or from torch's global
    RNG (``generator=None``) whose leading dimension is ``rows``: ``torch.rand/randn/randint``,
    ``torch.normal(mean, std, size)``, ``torch.rand_like/randn_like/randint_like``, the in-place
    fills (``Tensor.normal_``, ``uniform_``, ``bernoulli_(p)`` ... with number arguments) and
    ``F.dropout`` (hence ``nn.Dropout``), whose mask is drawn for the whole batch. Every other call
    runs unchanged: exact when its size does not depend on the batch (``torch.rand(1)``); a draw
    whose size does (``torch.randperm(n·T)`` over a batch's positions) makes the loss batch-coupled
    and its numbers differ from one process's (docs/distributed.md#what-is-not-replayed).
    Per-row draws that cannot be replayed (tensor inputs, attention dropout) are named in one
    warning through ``on_unreplayable``.
    """

    def __init__(self, generator: torch.Generator, start: int, rows: int, total: int,
                 on_unreplayable: Callable[[str], None]):
        super().__init__()
        self.generator, self.rows, self.total = generator, rows, total
        self.mine = slice(start, start + rows)
        self.on_unreplayable = on_unreplayable

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            return self._dropout(*args, **kwargs)
        if self._ours(kwargs) and "out" not in kwargs:
            if func in _FACTORIES and (func is not torch.normal or _numbers(args[:2])):
                size = _size_of(func, args, kwargs)
                if size and size[0] == self.rows:
                    return self._factory(func, args, kwargs, size)
            elif func in _LIKE and args[0].dim() and args[0].shape[0] == self.rows:
                whole = args[0].new_empty((self.total, *args[0].shape[1:]))
                return func(whole, *args[1:], **kwargs)[self.mine]
            elif func in _FILLS and _numbers(args[1:]) and args[0].dim() and args[0].shape[0] == self.rows:
                return self._fill(func, args, kwargs)
        self._check_replayable(func, args, kwargs)
        return func(*args, **kwargs)

    def _ours(self, kwargs: dict) -> bool:
        """Whether a call draws from the step's generators: the loss generator or the global RNG."""
        generator = kwargs.get("generator")
        return generator is None or generator is self.generator

    def _factory(self, func, args: tuple, kwargs: dict, size: tuple) -> Tensor:
        whole = (self.total, *size[1:])
        if "size" in kwargs:
            return func(*args, **{**kwargs, "size": whole})[self.mine]
        if func is torch.rand or func is torch.randn:
            return func(whole, **kwargs)[self.mine]
        return func(*args[:-1], whole, **kwargs)[self.mine]  # randint(.., size), normal(mean, std, size)

    def _fill(self, func, args: tuple, kwargs: dict) -> Tensor:
        target = args[0]
        whole = target.new_empty((self.total, *target.shape[1:]))
        func(whole, *args[1:], **kwargs)
        with torch.no_grad():
            return target.copy_(whole[self.mine])

    def _dropout(self, *args, **kwargs) -> Tensor:
        """One process computes ``input · noise`` with noise = Bernoulli(1−p)/(1−p) drawn for the
        whole batch from the global RNG; dropout of ones gives that noise, cut to these rows."""
        bound = _DROPOUT_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        x, p, training, inplace = (bound.arguments[k] for k in ("input", "p", "training", "inplace"))
        if not training or not x.dim() or x.shape[0] != self.rows:
            return F.dropout(x, p, training, inplace)
        noise = F.dropout(x.new_ones((self.total, *x.shape[1:])), p, True, False)[self.mine]
        return x.mul_(noise) if inplace else x * noise

    def _check_replayable(self, func, args: tuple, kwargs: dict) -> None:
        if func is F.scaled_dot_product_attention:
            dropout_p = args[4] if len(args) > 4 else kwargs.get("dropout_p", 0.0)
            if dropout_p > 0:
                self.on_unreplayable("attention dropout (scaled_dot_product_attention with dropout_p > 0)")
        elif func in _UNREPLAYABLE and self._ours(kwargs):
            first = args[0] if args else None
            if isinstance(first, Tensor) and first.dim() and first.shape[0] == self.rows:
                self.on_unreplayable(f"{getattr(func, '__name__', func)} on per-sequence inputs")


# -- the processes ---------------------------------------------------------------------------------


class LossModule(nn.Module):
    """``loss_fn(model, batch, generator)`` as the forward of a module holding ``model``, so that
    DDP's wrapper runs it (see the module docstring), with the step's draws replayed."""

    def __init__(self, model: nn.Module, loss_fn: Callable, replay: Callable[[torch.Generator], RowReplay]):
        super().__init__()
        self.model, self.loss_fn, self.replay = model, loss_fn, replay

    def forward(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        with self.replay(generator):
            return self.loss_fn(self.model, batch, generator)


class DataParallel:
    """This process's side of a data-parallel ``train``: the loop's operations through an
    ``accelerate.Accelerator`` (same interface as ``training.OneProcess``)."""

    def __init__(self, budget: Budget, desc: str):
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs as DDPKwargs
        from accelerate.utils import GradientAccumulationPlugin

        # The contract is one process's eager float32 step, whatever a launch config asks for: no mixed
        # precision, no torch.compile, no gradient accumulation. find_unused_parameters: a loss may leave
        # parts unused in a step; DDP then still reduces the others, and a part unused on every process
        # keeps grad None, as in one process (DDP says once per process that it found none unused).
        self.accelerator = Accelerator(
            cpu=not _accelerator_available(), mixed_precision="no", dynamo_backend="no",
            gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1),
            kwargs_handlers=[DDPKwargs(find_unused_parameters=True)],
        )
        self.processes, self.rank = self.accelerator.num_processes, self.accelerator.process_index
        kind = self.accelerator.distributed_type
        if self.processes != world_size() or not kind.name.startswith("MULTI_"):
            raise DihalError(f"{desc}: launched as {world_size()} processes, but accelerate set up {self.processes} "
                             f"({kind}); train() needs plain data parallelism: launch with torchrun or accelerate "
                             f"launch --multi_gpu, without DeepSpeed or FSDP (docs/distributed.md)")
        self.rows = rows_per_process(budget.batch_size, self.processes, desc)
        self.total, self.desc = budget.batch_size, desc
        self.is_main = self.accelerator.is_main_process
        self._warned: set[str] = set()
        self._wrapped: nn.Module | None = None

    def prepare(self, model: nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer):
        """DDP around the loss module and accelerate's optimizer; returns the optimizer to step."""
        self._wrapped, prepared = self.accelerator.prepare(LossModule(model, loss_fn, self._replay), optimizer)
        return prepared

    def _replay(self, generator: torch.Generator) -> RowReplay:
        return RowReplay(generator, self.rank * self.rows, self.rows, self.total, self._unreplayable)

    def _unreplayable(self, what: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            if self.is_main:
                warn(f"{self.desc}: data-parallel training cannot draw {what} for each process's rows as one "
                     f"process would; those draws differ from a one-process run's (docs/distributed.md)")

    def rows_of(self, indices: Tensor) -> Tensor:
        return indices[self.rank * self.rows : (self.rank + 1) * self.rows]

    def loss(self, batch: dict[str, Tensor], generator: torch.Generator) -> Tensor:
        return self._wrapped(batch, generator)

    def mean(self, loss: Tensor) -> Tensor:
        """The global batch's loss: the mean over processes of their losses (equal shares)."""
        return self.accelerator.reduce(loss.detach(), reduction="mean")

    def backward(self, loss: Tensor) -> None:
        self.accelerator.backward(loss)

    def clip(self, params: list[nn.Parameter], max_norm: float) -> None:
        self.accelerator.clip_grad_norm_(params, max_norm)

    def main_first(self):
        """The main process runs the block (reading, or discarding, a checkpoint) before the others."""
        return self.accelerator.main_process_first()

    def barrier(self) -> None:
        self.accelerator.wait_for_everyone()

    def agree(self, step: int, where: str) -> None:
        """Refuse to go on unless every process resumes at the same step (a checkpoint folder that
        not all processes see, say)."""
        device = self.accelerator.device
        steps = self.accelerator.gather(torch.tensor([step], device=device)).tolist()
        if len(set(steps)) != 1:
            raise DihalError(f"{self.desc}: the processes resume from different steps {steps}; {where} must be "
                             f"one folder that every process reads")

    def close(self) -> None:
        self._wrapped = None
        self.accelerator.free_memory()
