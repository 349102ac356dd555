"""Memory-mapped safetensors (dihal_bench.base.mapped): the tensors load_file gives, as views of the
file rather than copies, never written back, a damaged file named in one error, and a file deleted
under a running job left to the job store's "vanished, run it again" error."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dihal_bench.base.mapped import map_safetensors
from dihal_bench.errors import DihalError


def saved(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "states": torch.randn(6, 5, 3, generator=generator),
        "sequences": torch.randint(0, 1000, (6, 5), generator=generator),
        "half": torch.randn(7, generator=generator).half(),
        "bf16": torch.randn(3, 2, generator=generator).bfloat16(),
        "mask": torch.rand(4, generator=generator) > 0.5,
        "empty": torch.empty(0, 4),
    }
    path = tmp_path / "targets.safetensors"
    save_file(tensors, path)
    return path, tensors


def test_mapped_tensors_are_the_ones_load_file_gives(tmp_path):
    path, tensors = saved(tmp_path)
    mapped = map_safetensors(path)
    assert mapped.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert mapped[name].dtype == tensor.dtype and mapped[name].shape == tensor.shape, name
        assert torch.equal(mapped[name], tensor), name


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process's mappings from /proc")
def test_mapped_tensors_are_views_of_the_file_not_copies(tmp_path):
    path, _ = saved(tmp_path)
    states = map_safetensors(path)["states"]
    rows = states[[4, 1]]  # how training reads a batch: a copy of those rows only
    assert str(path) in Path("/proc/self/maps").read_text()
    assert torch.equal(rows, load_file(path)["states"][[4, 1]])


def test_writing_to_a_mapped_tensor_never_changes_the_file(tmp_path):
    path, tensors = saved(tmp_path)
    before = path.read_bytes()
    map_safetensors(path)["states"].add_(1.0)
    assert path.read_bytes() == before
    assert torch.equal(map_safetensors(path)["states"], tensors["states"])


def header_saying(entry) -> bytes:
    header = json.dumps({"states": entry}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(64)


@pytest.mark.parametrize("damage", ["truncated", "not safetensors", "unknown dtype", "wrong byte range", "not a dict"])
def test_a_damaged_file_is_one_error_naming_it(tmp_path, damage):
    path, _ = saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes({
        "truncated": data[:-10],
        "not safetensors": b"not a safetensors file at all",
        "unknown dtype": header_saying({"dtype": "F128", "shape": [2], "data_offsets": [0, 32]}),
        "wrong byte range": header_saying({"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}),
        "not a dict": header_saying([1, 2, 3]),
    }[damage])
    with pytest.raises(DihalError, match="targets.safetensors"):
        map_safetensors(path)


def test_a_stored_file_deleted_under_a_running_job_is_the_stores_one_line_advice(tmp_path):
    """Another process's rm -r between two jobs: the next job maps a file that is no longer there.
    The job store says so and how to go on, instead of calling the file damaged (CI caught this
    once in the fault test that deletes the store mid-run)."""
    from dihal_bench.study.jobs import JobStore

    store = JobStore(tmp_path / "jobs")
    first = store.run("targets", {"n": 1}, lambda folder: {"file": str(saved(folder)[0])})
    Path(first["file"]).unlink()
    with pytest.raises(FileNotFoundError):
        map_safetensors(Path(first["file"]))
    with pytest.raises(DihalError, match="vanished from the job store.*run the same command again"):
        store.run("training", {"n": 1}, lambda folder: {"rows": len(map_safetensors(Path(first["file"])))})


def test_a_job_whose_own_folder_was_deleted_says_so_whatever_its_work_raised(tmp_path):
    import shutil

    from dihal_bench.study.jobs import JobStore

    store = JobStore(tmp_path / "jobs")

    def work(folder: Path) -> dict:
        shutil.rmtree(tmp_path / "jobs")  # the rm -r lands while this job reads a checkpoint...
        raise DihalError("no trained checkpoint in it; train it first")  # ...which the reader then misses

    with pytest.raises(DihalError, match="vanished from the job store.*run the same command again"):
        store.run("samples", {"n": 1}, work)
    with pytest.raises(DihalError, match="^a plain refusal$"):  # with the store in place, the work's own error
        store.run("samples", {"n": 2}, lambda folder: (_ for _ in ()).throw(DihalError("a plain refusal")))
