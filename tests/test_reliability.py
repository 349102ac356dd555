"""Issue 24's minor items and the preflight's new checks, one by one: a suite file with a
byte-order mark, uniform file modes, plugin options against what the plugin declares, a dead
Ray address refused in well under a second, and a job store in use found without writing."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dihal_bench.base.files import result_file_mode, write_safetensors_atomic
from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.registry.resolve import load_backbone
from dihal_bench.study.jobs import JobStore
from dihal_bench.study.preflight import (
    check_options,
    check_ray_address,
    check_store_free,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_suite_file_with_a_byte_order_mark_is_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bom.toml").write_bytes(b"\xef\xbb\xbfseeds = [3, 4]\n[budget]\nsteps = 7\n")
    result = CliRunner().invoke(cli, ["run", "--suite", "bom.toml", "--dry-run"])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout.split("resolved config:\n", 1)[1].split("\n\n", 1)[0])
    assert config["seeds"] == [3, 4] and config["budget"]["steps"] == 7


def test_safetensors_files_get_the_mode_of_every_other_output(tmp_path):
    path = tmp_path / "weights.safetensors"
    write_safetensors_atomic(path, {"w": torch.arange(3.0)})
    assert mode(path) == result_file_mode() == 0o666 & ~current_umask_of_this_process()


def current_umask_of_this_process() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


def test_a_jobs_artifacts_written_0600_by_a_library_get_the_uniform_mode(tmp_path):
    from safetensors.torch import save_file

    def work(folder: Path) -> dict:
        save_file({"states": torch.zeros(2)}, folder / "layer-1.safetensors")  # 0600, as the runner's targets
        return {"ok": True}

    store = JobStore(tmp_path / "jobs")
    assert store.run("bridge-targets", {"seed": 0}, work) == {"ok": True}
    folder = store.folder("bridge-targets", {"seed": 0})
    assert {path.name: mode(path) for path in folder.iterdir() if not path.name.startswith(".")} == {
        name: result_file_mode() for name in ("layer-1.safetensors", "spec.json", "result.json")}
    assert store.run("bridge-targets", {"seed": 0}, work) == {"ok": True}  # still intact: hashed after the chmod


class Plain:
    """A bridge-like factory with typed options and no **options."""

    def __init__(self, width: int, depth: int = 2, rate: float = 0.5, name: str | None = None, flag: bool = False):
        pass


class Untyped:
    def __init__(self, width, depth=2, anything=None):
        pass


@pytest.fixture
def option_plugins(inline_plugin):
    from dihal_bench import hookimpl

    class Bridges:
        @hookimpl
        def register_bridges(self, register):
            register("plain-bridge", Plain)
            register("untyped-bridge", Untyped)

    inline_plugin(Bridges(), "option-bridges")


@pytest.mark.parametrize("options, message", [
    ({"depth": 3, "rate": 1, "name": None, "flag": True}, None),
    ({"rate": 2.5, "name": "x"}, None),
    ({"nosuch": 1}, "bridge 'plain-bridge' has no option 'nosuch'; its options: depth, flag, name, rate"),
    ({"width": 3}, "has no option 'width'"),  # the harness passes it
    ({"depth": "abc"}, "option depth of bridge 'plain-bridge' must be int, got 'abc'"),
    ({"depth": 2.0}, "option depth of bridge 'plain-bridge' must be int"),
    ({"depth": 2**63}, "must be int"),
    ({"depth": True}, "must be int"),
    ({"rate": float("nan")}, "option rate of bridge 'plain-bridge' must be finite, got nan"),
    ({"rate": "fast"}, "must be float"),
    ({"name": 3}, "must be str | None"),
    ({"flag": 1}, "must be bool"),
])
def test_plugin_options_are_checked_against_the_signature(option_plugins, options, message):
    if message is None:
        check_options("bridge", "plain-bridge", options, "bridge.options", harness_arguments=1)
    else:
        with pytest.raises(DihalError, match=f"^bridge.options: .*{message.replace('(', '.').replace(')', '.')}"):
            check_options("bridge", "plain-bridge", options, "bridge.options", harness_arguments=1)


def test_untyped_options_are_checked_by_their_defaults_and_required_ones_must_be_there(option_plugins):
    check_options("bridge", "untyped-bridge", {"depth": 4, "anything": [1, "x"]}, "k", harness_arguments=1)
    with pytest.raises(DihalError, match="option depth of bridge 'untyped-bridge' must be int"):
        check_options("bridge", "untyped-bridge", {"depth": "4"}, "k", harness_arguments=1)
    with pytest.raises(DihalError, match=r"^ckpt: bridge 'plain-bridge' needs option\(s\) width$"):
        check_options("bridge", "plain-bridge", {"depth": 1}, "ckpt", harness_arguments=0, required=("width",))


def test_a_baselines_options_dataclass_is_what_its_options_are_checked_against():
    check_options("baseline", "sed", {"embed_dim": 16, "d_model": None, "eta": 0}, "--option", harness_arguments=3)
    with pytest.raises(DihalError, match="option d_model of baseline 'sed' must be int | None, got 'wide'"):
        check_options("baseline", "sed", {"d_model": "wide"}, "--option", harness_arguments=3)


def test_a_refused_ray_address_is_refused_at_once():
    started = time.perf_counter()
    with pytest.raises(DihalError, match=r"^--address '127.0.0.1:1': no Ray cluster answers there \("):
        check_ray_address("127.0.0.1:1")
    with pytest.raises(DihalError, match="no Ray cluster answers there"):
        check_ray_address("ray://127.0.0.1:1")
    assert time.perf_counter() - started < 2.0  # a refusal needs no timeout
    for malformed in ("nowhere", "127.0.0.1:", "127.0.0.1:99999", ":6379"):
        with pytest.raises(DihalError, match="is not host:port"):
            check_ray_address(malformed)
    for left_to_ray in (None, "", "auto", "local"):
        check_ray_address(left_to_ray)


def test_a_store_in_use_is_found_without_writing_anything(tmp_path):
    check_store_free(tmp_path / "none")  # no store yet
    assert not (tmp_path / "none").exists()
    store = JobStore(tmp_path / "jobs")
    with store.lock():
        before = (tmp_path / "jobs" / ".lock").read_text()
        with pytest.raises(DihalError, match=rf"job store {tmp_path / 'jobs'} is in use by another dihal-bench run "
                                             rf"\(pid {os.getpid()}\)"):
            check_store_free(tmp_path / "jobs")
        assert (tmp_path / "jobs" / ".lock").read_text() == before
    check_store_free(tmp_path / "jobs")
    with (tmp_path / "jobs" / ".lock").open() as handle:  # the probe let go of the lock
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_raising_backbone_factory_is_one_line_naming_the_plugin_with_its_cause(inline_plugin):
    from dihal_bench import hookimpl

    def broken(**options):
        raise OSError("no weights here\nsecond line")

    class Broken:
        @hookimpl
        def register_backbones(self, register):
            register("broken-bb", broken)

    inline_plugin(Broken(), "broken-plugin")
    with pytest.raises(DihalError) as raised:
        load_backbone("broken-bb", device="cpu")
    assert str(raised.value) == ("backbone 'broken-bb' from broken-plugin (not installed) failed: "
                                 "OSError: no weights here")
    assert isinstance(raised.value.__cause__, OSError)  # --debug shows the plugin's traceback
