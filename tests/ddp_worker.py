"""The training runs of tests/test_training_ddp.py, and the script its launcher runs on each process.

Run as ``torchrun --nproc_per_node 2 tests/ddp_worker.py OUT PART`` (see :func:`main`): every process
trains data-parallel through ``dihal_bench.training.loop.train`` and writes its final weights and losses to
``OUT/{name}.rank{r}.safetensors`` and ``.json``. Imported by the test, the same builders give the
one-process references.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from dihal_bench.api.bridge import training_loss
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import build_bridge
from dihal_bench.training.budget import Budget
from dihal_bench.training.loop import train

#: 8 steps of a global batch of 8 (4 rows per process with 2): 64 draws from 32 windows over 2 epochs
BUDGET = Budget(steps=8, batch_size=8, seq_len=6, lr=3e-3, warmup_frac=0.25, epochs=2, checkpoint_every=2)
#: where the interrupted runs stop: after the checkpoint of step 4, before step 5 is taken
STOP_AT = 5
#: the exit status of a process killed by ``stopping_at``
KILLED = 9
WIDTH = 8


# -- a toy model whose loss draws per-row and batch-level numbers and uses dropout ------------------


def toy_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(WIDTH, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, WIDTH))


def toy_data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, WIDTH, generator=generator)
    return {"x": x, "y": torch.tanh(x @ torch.randn(WIDTH, WIDTH, generator=generator))}


def toy_loss(model: nn.Module, batch: dict[str, torch.Tensor], generator: torch.Generator) -> torch.Tensor:
    """Per-row draws of three kinds, then one batch-level coin that every process must draw alike."""
    x = batch["x"]
    noise = 0.1 * torch.randn(x.shape, generator=generator)
    scale = 1 + 0.5 * torch.rand(x.shape[0], 1, generator=generator)
    flip = torch.randint(2, (x.shape[0], 1), generator=generator) * 2 - 1
    coin = torch.rand(1, generator=generator)
    return nn.functional.mse_loss(model(flip * (x + noise) * scale), flip * batch["y"]) * (1 + coin[0])


# -- a tiny DiHAL bridge with its own loss ---------------------------------------------------------


def bridge_data() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(2)
    cond = torch.randn(32, BUDGET.seq_len, WIDTH, generator=generator)
    mixing = torch.randn(WIDTH, WIDTH, generator=generator)
    target = torch.tanh(cond.cumsum(1) @ mixing) + 0.1 * torch.randn(cond.shape, generator=generator)
    mask = torch.ones(cond.shape[:2], dtype=torch.bool)
    mask[:, 0] = False
    return {"cond": cond, "target": target, "mask": mask}


def bridge_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    bridge = build_bridge("dihal-bridge", WIDTH, d_model=16, layers=1, heads=2, max_len=BUDGET.seq_len)
    data = bridge_data()
    bridge.fit_standardizer(data["cond"], data["target"], data["mask"])
    return bridge


CASES = {
    "toy": (toy_model, toy_loss, toy_data),
    "bridge": (bridge_model, training_loss, bridge_data),
}


class Stop(Exception):
    """Raised at the step where a one-process run is interrupted."""


def stopping_at(step: int, loss_fn, kill: bool = False):
    """``loss_fn`` that stops the run before ``step``: with Stop, or (``kill``) by ending the process on
    the spot, as kill -9 does: no exception handler, no ``finally`` runs."""
    calls = []

    def loss(model, batch, generator):
        calls.append(1)
        if len(calls) == step + 1:
            if kill:
                os._exit(KILLED)
            raise Stop
        return loss_fn(model, batch, generator)

    return loss


def run(case: str, checkpoint_dir: Path | None = None, init_seed: int = 0, stop_at: int | None = None,
        budget: Budget = BUDGET, kill: bool = False):
    """Train ``case`` (stopping before step ``stop_at`` if given): the model and the TrainResult."""
    build, loss_fn, data = CASES[case]
    model = build(init_seed)
    if stop_at is not None:
        loss_fn = stopping_at(stop_at, loss_fn, kill)
    return model, train(model, loss_fn, data(), budget, checkpoint_dir=checkpoint_dir, progress=False, desc=case)


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}


def main(out: Path, part: str) -> None:
    """Part ``killed``: the bridge, killed on every process before STOP_AT (its checkpoint stays in
    ``OUT/two-process``). Part ``rest``: each case uninterrupted; the bridge resumed from the killed
    run's checkpoint, and from one that a single process wrote (``OUT/one-process-midway``, put there
    by the test); a global batch that does not split."""
    from accelerate import PartialState

    state = PartialState(cpu=True)  # the test runs on CPUs: without cpu=True accelerate sees one process
    rank = state.process_index
    if part == "killed":
        run("bridge", out / "two-process", stop_at=STOP_AT, kill=True)
        return

    def record(name: str, model: nn.Module, result) -> None:
        save_file(weights(model), out / f"{name}.rank{rank}.safetensors")
        (out / f"{name}.rank{rank}.json").write_text(json.dumps(
            {"losses": result.losses, "resumed_from": result.resumed_from_step, "processes": state.num_processes}))

    for case in CASES:
        record(case, *run(case))
    record("bridge-resumed", *run("bridge", out / "two-process", init_seed=99))
    record("bridge-from-one-process", *run("bridge", out / "one-process-midway", init_seed=98))
    try:
        run("toy", budget=BUDGET.replace(batch_size=7))
    except DihalError as error:
        (out / f"refusal.rank{rank}.txt").write_text(str(error))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), sys.argv[2])
