"""Data-parallel training (docs/distributed.md): the shared loop on two CPU processes (gloo), launched
with torchrun, against the same loop in one process.

**Tolerances.** Two processes compute the same float32 numbers as one, but add them in another order:
each process sums its half of the batch, then DDP and the loss report average the two halves.
Reordering a sum of n float32 terms changes it by at most about n·u·Σ|terms| (u = 2⁻²⁴ ≈ 6e-8) and
typically by √n·u. The largest such sum here is the bridge loss over B·T·width = 8·6·8 = 384 numbers:
2.3e-5 at worst, 1.2e-6 typically; so losses agree to LOSS_RTOL = 1e-5 relative. A weight differs
by (a) the rounding of each step's update into it, ≤ u·|w| a step, ≤ 5e-7·|w| after 8 steps, within
WEIGHT_RTOL = 1e-5; and (b) the difference of the updates themselves: AdamW moves a weight by
lr·m̂/(√v̂ + ε), a ratio that a relative gradient error δ changes by ≤ ~2δ, so with δ ≤ 1e-5 the
updates differ by ≤ 2e-5·Σ lr over the run (3e-7 here), the absolute tolerance. A real fault is
orders of magnitude larger: another row's noise changes a loss by >1e-2, a missing gradient
all-reduce moves weights by ~lr = 3e-3 a step.

δ ≤ 1e-5 holds for gradient elements that are not sums cancelling to nearly zero, which is true of
these small models (the largest weight difference is 5% of the bound) but not of every parameter.
The extreme, the attention key bias: the softmax ignores it, so its exact gradient is zero and its
computed one pure rounding noise (~1e-10), which AdamW's division by √v̂ + ε turns into steps of a
sizeable share of lr, different in every summation order (1.7e-4 apart after 8 steps, measured). It
is compared through the bridge's output, which it cannot change, instead of weight by weight.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import ddp_worker as worker
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from dihal_bench.errors import DihalError
from dihal_bench.training.distributed import RowReplay, rows_per_process, world_size
from dihal_bench.training.loop import learning_rate

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LOSS_RTOL = 1e-5
WEIGHT_RTOL = 1e-5
WEIGHT_ATOL = 2e-5 * sum(learning_rate(worker.BUDGET, step) for step in range(worker.BUDGET.steps))
PROCESSES = 2


# -- randomness: each process draws its rows of the one-process draws --------------------------------


def draws(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Every kind of draw RowReplay knows, for a batch of n rows, in one fixed order."""
    rows = torch.empty(n, 3)
    return {
        "rand": torch.rand(n, generator=generator),
        "randn": torch.randn(n, 2, 3, generator=generator),
        "randn size=": torch.randn(size=(n, 2), generator=generator),
        "randint": torch.randint(0, 7, (n, 2), generator=generator),
        "normal": torch.normal(0.0, 2.0, (n,), generator=generator),
        "coin": torch.rand(1, generator=generator),  # batch-level: the same on every process
        "randn_like": torch.randn_like(rows),  # torch's global RNG
        "normal_": torch.empty(n, 4).normal_(generator=generator),
        "bernoulli_": torch.empty(n, 4).bernoulli_(0.3, generator=generator),
        "permutation": torch.randperm(5, generator=generator),  # batch-level
        "global": torch.randn(n, 2),
        "dropout": F.dropout(torch.ones(n, 6), 0.5, True),
        "nn.Dropout": nn.Dropout(0.3)(torch.ones(n, 2, 3)),
        "last": torch.rand(3, generator=generator),  # after all others: the streams stayed in step
    }


BATCH_LEVEL = ("coin", "permutation", "last")


def seeded_draws(n: int, replay=None) -> dict[str, torch.Tensor]:
    torch.manual_seed(7)
    generator = torch.Generator().manual_seed(11)
    if replay is None:
        return draws(n, generator)
    with replay(generator):
        return draws(n, generator)


def test_each_process_draws_its_rows_of_the_one_process_draws():
    batch, rows = 8, 4
    whole = seeded_draws(batch)
    for rank in range(batch // rows):
        unreplayable: list[str] = []
        mine = seeded_draws(rows, functools.partial(RowReplay, start=rank * rows, rows=rows, total=batch,
                                                    on_unreplayable=unreplayable.append))
        assert mine.keys() == whole.keys() and not unreplayable
        for name, values in mine.items():
            expected = whole[name] if name in BATCH_LEVEL else whole[name][rank * rows : (rank + 1) * rows]
            assert torch.equal(values, expected), (rank, name)


def test_draws_that_cannot_be_replayed_are_named():
    named = []
    generator = torch.Generator().manual_seed(0)
    with RowReplay(generator, 0, 4, 8, named.append):
        torch.bernoulli(torch.full((4, 3), 0.5), generator=generator)  # the other rows' p are elsewhere
        q = torch.randn(4, 2, 5, 8)
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
        F.scaled_dot_product_attention(q, q, q)  # no dropout: nothing random
        torch.rand(4, generator=torch.Generator())  # another generator: not the step's, left alone
    assert named == ["bernoulli on per-sequence inputs",
                     "attention dropout (scaled_dot_product_attention with dropout_p > 0)"]


def test_the_global_batch_must_split_into_at_least_two_rows_per_process():
    assert rows_per_process(8, 2, "bridge") == 4
    for batch, processes, message in ((10, 4, "does not split over 4 processes; use a multiple of 4"),
                                      (4, 4, "leaves one sequence per process")):
        with pytest.raises(DihalError, match=message) as error:
            rows_per_process(batch, processes, "bridge")
        assert "\n" not in str(error.value)


def test_one_process_neither_launches_nor_imports_accelerate(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert world_size() == 2
    code = ("import sys, torch\n"
            "from dihal_bench.training.budget import Budget\n"
            "from dihal_bench.training.loop import train\n"
            "train(torch.nn.Linear(2, 1), lambda m, b, g: m(b['x']).pow(2).mean(), {'x': torch.randn(8, 2)},\n"
            "      Budget(steps=2, batch_size=4), progress=False)\n"
            "print('accelerate' in sys.modules)")
    env = {key: value for key, value in os.environ.items() if key != "WORLD_SIZE"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


# -- two processes against one ---------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(out: Path, part: str) -> subprocess.CompletedProcess:
    """tests/ddp_worker.py's ``part`` on two CPU processes, through torchrun on a free local port."""
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={PROCESSES}",
               "--master_addr=127.0.0.1", f"--master_port={port}", worker.__file__, str(out), part]
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    print(f"two-process launch ({part}): {time.perf_counter() - started:.1f} s")
    return result


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory, one_torch_thread) -> Path:
    """The folder where two-process runs left their results: a run of the bridge killed on both
    processes before STOP_AT (its checkpoint copied to ``two-process-midway``), then the worker's
    other runs, which resume it. Before those, one process leaves a checkpoint of the bridge stopped
    at STOP_AT in ``one-process-midway``."""
    out = tmp_path_factory.mktemp("ddp")
    killed = launch(out, "killed")
    assert re.search(rf"exitcode\s*:\s*{worker.KILLED}\b", killed.stderr), killed.stderr[-4000:]
    assert json.loads((out / "two-process" / "trainer.json").read_text())["step"] == worker.STOP_AT - 1
    shutil.copytree(out / "two-process", out / "two-process-midway")

    with pytest.raises(worker.Stop):
        worker.run("bridge", out / "one-process-midway", stop_at=worker.STOP_AT)
    rest = launch(out, "rest")
    assert rest.returncode == 0, rest.stderr[-4000:]
    return out


def two_process_result(out: Path, name: str, rank: int = 0) -> tuple[dict[str, torch.Tensor], dict]:
    return load_file(out / f"{name}.rank{rank}.safetensors"), json.loads((out / f"{name}.rank{rank}.json").read_text())


def without_key_biases(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``weights`` with the attention key-bias third of each fused q/k/v bias set to 0 (see the
    module docstring)."""
    kept = dict(weights)
    for name, tensor in weights.items():
        if name.endswith("qkv.bias"):
            kept[name] = tensor.clone()
            kept[name][len(tensor) // 3 : 2 * len(tensor) // 3] = 0
    return kept


def assert_weights_close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], case: str):
    torch.testing.assert_close(without_key_biases(actual), without_key_biases(expected), rtol=WEIGHT_RTOL,
                               atol=WEIGHT_ATOL, msg=lambda message: f"{case}: {message}")
    if case.startswith("bridge"):
        assert_same_bridge_output(actual, expected)


def assert_same_bridge_output(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]):
    """The bridge's denoiser output under both weight sets, key biases included."""
    data = worker.bridge_data()
    t = torch.linspace(0.1, 0.9, 8)
    outputs = []
    for weights in (actual, expected):
        bridge = worker.bridge_model(0)
        bridge.load_state_dict(weights)
        with torch.no_grad():
            c = bridge.standardize_cond(data["cond"][:8])
            outputs.append(bridge.denoise(bridge.standardize_target(data["target"][:8]), t, c))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=LOSS_RTOL, atol=LOSS_RTOL)


def max_relative_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("case", list(worker.CASES))
def test_two_processes_train_as_one_does(two_processes, case):
    model, one = worker.run(case)
    weights, record = two_process_result(two_processes, case)
    assert record["processes"] == PROCESSES and record["resumed_from"] is None
    print(f"{case}: max relative loss difference, 2 vs 1 process: "
          f"{max_relative_difference(record['losses'], one.losses):.2e}")
    assert record["losses"] == pytest.approx(one.losses, rel=LOSS_RTOL, abs=0)
    assert_weights_close(weights, worker.weights(model), case)

    # the replicas stay in step: both processes hold the same weights and report the same losses
    other, other_record = two_process_result(two_processes, case, rank=1)
    assert other_record["losses"] == record["losses"]
    assert all(torch.equal(other[name], tensor) for name, tensor in weights.items())


def test_two_processes_resume_their_own_checkpoint_bitwise(two_processes):
    """Resumed in a new launch after both processes were killed before step 5 (last checkpoint: 4)."""
    uninterrupted, record = two_process_result(two_processes, "bridge")
    resumed, resumed_record = two_process_result(two_processes, "bridge-resumed")
    assert resumed_record["resumed_from"] == 4
    assert resumed_record["losses"] == record["losses"]
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[name], tensor) for name, tensor in uninterrupted.items())


def test_a_checkpoint_resumes_on_either_number_of_processes(two_processes, tmp_path):
    """One process wrote the checkpoint two resumed (in the launch), and one process resumes the
    checkpoint two wrote (here): both end where uninterrupted training ends."""
    two, _ = two_process_result(two_processes, "bridge")
    from_one, record = two_process_result(two_processes, "bridge-from-one-process")
    assert record["resumed_from"] == 4
    assert_weights_close(from_one, two, "bridge from a one-process checkpoint")

    shutil.copytree(two_processes / "two-process-midway", tmp_path / "checkpoint")
    model, one = worker.run("bridge")
    resumed, result = worker.run("bridge", tmp_path / "checkpoint", init_seed=97)
    assert result.resumed_from_step == 4
    assert result.losses == pytest.approx(one.losses, rel=LOSS_RTOL, abs=0)
    assert_weights_close(worker.weights(resumed), worker.weights(model), "bridge from a two-process checkpoint")


def test_a_global_batch_that_does_not_split_is_refused(two_processes):
    for rank in range(PROCESSES):
        message = (two_processes / f"refusal.rank{rank}.txt").read_text()
        assert message == "toy: budget.batch_size 7 does not split over 2 processes; use a multiple of 2"
