"""Faults and hostile inputs, battery style (issue 40; what the tool promises: docs/faults.md).

Each row of CASES names a fault, the outcome expected, and what must survive it; its check
injects the fault for real (a small tmpfs that fills up or is remounted read-only, signals to a
child process, plugin modules on sys.path loaded through their entry points, records and
checkpoints built to hurt) and asserts the outcome. What every failing case must show: one
``Error:`` line that names the fault and what to do, a non-zero exit, no traceback, no
half-written file where a reader looks, and (for runs) the jobs finished before the fault kept
and a rerun giving the numbers an undisturbed run gives.

Runs use the conftest's tiny random-weight suite cut to one DiHAL method, one reference and two
cheap metrics (seconds); the memory cases price the real ``smoke`` suite without loading it. The
rows that mount file systems need root (CI runs as root); elsewhere they skip, saying why.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from dihal_bench import hookimpl
from dihal_bench.base.files import is_temporary, write_json_atomic
from dihal_bench.cli import cli
from dihal_bench.study.records import seal_record

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPOSITORY = Path(__file__).resolve().parents[1]
#: the committed record the publish and record cases start from: the smallest group to publish
PUBLISHED_RECORD = "sanity-smollm2-135m-20261207T211945Z.json"
#: the tiny suite cut to what a run-level fault needs: training, samples, metrics and the record
TRIM = {"methods.dihal": '["chosen"]', "methods.controls": "[]", "methods.references": '["unigram"]',
        "methods.baselines": "[]", "bridge.steps_axis": "[]", "metrics.names": '["gen_ppl", "entropy"]'}
#: wall-clock measurements, which differ run to run: left out when two records are compared
TIMINGS = ("latency", "timings", "train_seconds", "wall_seconds")


# --- running the tool -------------------------------------------------------------------------


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str


def dihal(*args: str, env: dict | None = None, timeout: float = 300) -> Outcome:
    """The command line in a child process, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "dihal_bench", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    return Outcome(done.returncode, done.stdout, done.stderr)


def dihal_inline(*args: str) -> Outcome:
    """The command line in this process (so that inline plugins are seen), as CliRunner runs it."""
    result = CliRunner().invoke(cli, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a crash: shown with its traceback
    return Outcome(result.exit_code, result.stdout, result.stderr)


def refused(outcome: Outcome, *says: str) -> str:
    """The one ``Error:`` line of a refused command, checked to hold each of ``says``."""
    assert outcome.returncode != 0, (outcome.stdout, outcome.stderr)
    assert "Traceback" not in outcome.stderr, outcome.stderr
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, outcome.stderr
    for words in says:
        assert words in errors[0], errors[0]
    return errors[0]


def run_args(suite: Path, out: Path, results: Path, **settings: str) -> list[str]:
    args = ["run", "--suite", str(suite), "--quiet", "--out", str(out), "--results", str(results)]
    for key, value in {**TRIM, **settings}.items():
        args += ["--set", f"{key}={value}"]
    return args


def comparable(record: dict) -> list[dict]:
    """A record's per-seed results without wall-clock measurements."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMINGS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return strip(record["per_seed"])


def the_record(results: Path) -> dict:
    [path] = results.glob("*.json")
    return json.loads(path.read_text())


def no_temporaries(*folders: Path) -> None:
    for folder in folders:
        left = [path for path in folder.rglob("*") if is_temporary(path)] if folder.exists() else []
        assert not left, left


def finished_jobs(store: Path) -> dict[str, int]:
    """Each finished job's folder name and its result's mtime (unchanged: the job was kept)."""
    return {path.parent.name: path.stat().st_mtime_ns for path in store.rglob("result.json")}


# --- file systems -------------------------------------------------------------------------------


class Mount:
    """A tmpfs of ``size`` mounted at ``path`` for one test: a real file system that fills up
    and can be remounted read-only. Skips the test where mounting is not permitted."""

    def __init__(self, path: Path, size: str):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")

    def remount(self, options: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{options}", str(self.path)], check=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def mounts():
    made: list[Mount] = []

    def mount(path: Path, size: str) -> Mount:
        made.append(Mount(path, size))
        return made[-1]

    yield mount
    for each in reversed(made):
        each.unmount()


# --- shared fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suite(tiny_suite_file) -> Path:
    return tiny_suite_file


@pytest.fixture(scope="module")
def undisturbed(suite, tmp_path_factory) -> tuple[dict, Path]:
    """The trimmed tiny suite run once without a fault: its record and its job store's --out."""
    root = tmp_path_factory.mktemp("undisturbed")
    outcome = dihal_inline(*run_args(suite, root / "runs", root / "results"))
    assert outcome.returncode == 0, outcome.stderr[-3000:]
    return the_record(root / "results"), root / "runs"


@dataclass
class Context:
    """What a case's check gets: a fresh folder, the suite and the fixtures it asks for."""

    tmp: Path
    suite: Path
    request: pytest.FixtureRequest

    def fixture(self, name: str):
        return self.request.getfixturevalue(name)

    def rerun_matches_undisturbed(self, out: Path, results: Path, kept: dict[str, int] | None = None) -> None:
        """The same command again completes, reuses every job ``kept`` unchanged, and writes
        the record an undisturbed run writes (every number equal; timings aside)."""
        record, _ = self.fixture("undisturbed")
        again = dihal_inline(*run_args(self.suite, out, results))  # in this process: no second start-up
        assert again.returncode == 0, again.stderr[-3000:]
        store = next(out.glob("*/jobs"))
        now = finished_jobs(store)
        assert all(now.get(name) == mtime for name, mtime in (kept or {}).items())
        assert comparable(the_record(results)) == comparable(record)
        no_temporaries(out, results)



# --- the publish step on a copy of a committed record ---------------------------------------------


@pytest.fixture(scope="module")
def publish_source(tmp_path_factory) -> Path:
    """results/ (a copy of one committed record) and a README.md with its group's block."""
    from dihal_bench.leaderboard.read import read_groups

    root = tmp_path_factory.mktemp("publish-source")
    (root / "results").mkdir()
    shutil.copy(REPOSITORY / "results" / PUBLISHED_RECORD, root / "results")
    [group] = read_groups(root / "results", warn=lambda message: None)
    (root / "README.md").write_text(f"# A README\n\nprose\n\n<!-- results:{group.folder}:start -->\nold table\n"
                                    f"<!-- results:{group.folder}:end -->\n\nmore prose\n")
    return root


def publish_args(work: Path) -> list[str]:
    return ["leaderboard", "--results", str(work / "results"), "--out", str(work / "out"),
            "--readme", str(work / "README.md")]


@pytest.fixture(scope="module")
def published(publish_source, tmp_path_factory) -> dict[str, bytes]:
    """What an undisturbed publish writes: each file's path (relative to --out; README.md as
    ``../README.md``) and content."""
    work = tmp_path_factory.mktemp("published")
    shutil.copytree(publish_source, work, dirs_exist_ok=True)
    outcome = dihal_inline(*publish_args(work))
    assert outcome.returncode == 0, outcome.stderr
    files = {path.relative_to(work / "out").as_posix(): path.read_bytes()
             for path in (work / "out").rglob("*") if path.is_file()}
    return {**files, "../README.md": (work / "README.md").read_bytes()}


@pytest.fixture
def publish_copy(publish_source, tmp_path) -> Path:
    work = tmp_path / "publish"
    shutil.copytree(publish_source, work)
    return work


def old_and_new(work: Path, published: dict[str, bytes]) -> dict[str, tuple[bytes, bytes]]:
    """An output folder of an earlier publish: every file the publish writes, with other
    ("old") content. Returns each file's (old, new) content."""
    pairs = {}
    for name, new in published.items():
        path = work / "out" / name
        old = path.read_bytes() if name == "../README.md" else f"old {name}\n".encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(old)
        pairs[name] = (old, new)
    return pairs


def each_file_old_or_new(work: Path, pairs: dict[str, tuple[bytes, bytes]]) -> int:
    """Assert that a reader finds every file whole, its old content or its new, and the README
    new only when every other file is; returns how many are new. Nothing else is in the folder
    but the temporary files of writes a kill cut short."""
    new = 0
    for name, (old, fresh) in pairs.items():
        content = (work / "out" / name).read_bytes()
        assert content in (old, fresh), f"{name} is half-written ({len(content)} bytes)"
        new += content == fresh
    extra = [path for path in (work / "out").rglob("*")
             if path.is_file() and not is_temporary(path) and path.relative_to(work / "out").as_posix() not in pairs]
    assert not extra, extra
    readme_old, readme_new = pairs["../README.md"]
    if readme_new != readme_old and (work / "README.md").read_bytes() == readme_new:
        assert new == len(pairs), "the README was rewritten before every table and page"
    return new


# --- (a) the disk ------------------------------------------------------------------------------


def disk_full_mid_run(ctx: Context) -> None:
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    disk = ctx.fixture("mounts")(out, "1m")  # the trimmed suite's store needs about 2 MB
    outcome = dihal_inline(*run_args(ctx.suite, out, results))
    refused(outcome, "cannot write", "No space left on device", "free space")
    kept = finished_jobs(out)
    assert kept and (not results.exists() or not list(results.iterdir()))  # jobs done before it stay; no record
    no_temporaries(out)
    disk.remount("size=64m")
    ctx.rerun_matches_undisturbed(out, results, kept)


def disk_full_writing_the_record(ctx: Context) -> None:
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    ctx.fixture("mounts")(results, "64k")
    filler = results / "filler"
    with filler.open("wb", buffering=0) as f:  # the disk full but for a file's name: the writable check passes
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass
    outcome = dihal_inline(*run_args(ctx.suite, out, results))
    refused(outcome, f"cannot write {results}/", "No space left on device", "run the same command again")
    kept = finished_jobs(out)
    assert len(kept) == len(finished_jobs(ctx.fixture("undisturbed")[1]))  # every job done and kept
    assert sorted(path.name for path in results.iterdir()) == ["filler"]  # no record, whole or half
    filler.unlink()
    ctx.rerun_matches_undisturbed(out, results, kept)


def read_only_results(ctx: Context) -> None:
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    disk = ctx.fixture("mounts")(results, "1m")
    disk.remount("ro")  # as root, a chmod would not stop a write: a read-only mount does
    refused(dihal_inline(*run_args(ctx.suite, out, results)),
            f"cannot write to the results folder '{results}'", "Read-only file system")
    assert not out.exists()  # refused before any work


def read_only_publish_folder(ctx: Context) -> None:
    work = ctx.fixture("publish_copy")
    disk = ctx.fixture("mounts")(work / "out", "1m")
    disk.remount("ro")
    readme = (work / "README.md").read_bytes()
    refused(dihal_inline(*publish_args(work)), "cannot write to the output folder --out", "Read-only file system")
    assert (work / "README.md").read_bytes() == readme


def store_deleted_mid_run(ctx: Context) -> None:
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    stop = threading.Event()

    def delete_the_store() -> None:  # another process's rm -r, the moment a sweep job has finished
        while not stop.is_set():
            if list(out.glob("*/jobs/sweep-layer-*/result.json")):
                shutil.rmtree(next(out.glob("*/jobs")), ignore_errors=True)
                return
            time.sleep(0.01)

    deleter = threading.Thread(target=delete_the_store)
    deleter.start()
    try:
        outcome = dihal_inline(*run_args(ctx.suite, out, results))
    finally:
        stop.set()
        deleter.join()
    if outcome.returncode != 0:  # a job that needed a deleted one's files: one line naming it
        refused(outcome, "run the same command again")
    no_temporaries(out, results)
    shutil.rmtree(results, ignore_errors=True)
    ctx.rerun_matches_undisturbed(out, results)


def store_truncated(ctx: Context) -> None:
    _, done = ctx.fixture("undisturbed")
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    shutil.copytree(done, out)
    store = next(out.glob("*/jobs"))
    # the cheapest jobs to redo: a reference's samples (an artifact cut short) and a metrics result
    damaged = next(path for path in store.glob("samples-*/*.jsonl"))
    damaged.write_bytes(damaged.read_bytes()[:100])
    broken = next(store.glob("metrics-*/result.json"))
    broken.write_bytes(broken.read_bytes()[:50])
    others = {name: mtime for name, mtime in finished_jobs(store).items()
              if name not in (damaged.parent.name, broken.parent.name)}
    ctx.rerun_matches_undisturbed(out, results, others)


def unicode_and_spaces(ctx: Context) -> None:
    _, done = ctx.fixture("undisturbed")
    base = ctx.tmp / "with spaces" / "ünïcødé 日本語 $HOME ;"
    out, results = base / "runs", base / "résults"
    shutil.copytree(done, out)
    ctx.rerun_matches_undisturbed(out, results, finished_jobs(out))


def name_too_long(ctx: Context) -> None:
    out = ctx.tmp / ("x" * 300)
    refused(dihal_inline(*run_args(ctx.suite, out, ctx.tmp / "results")), "File name too long")
    assert sorted(path.name for path in ctx.tmp.iterdir()) == []


def symlink_out_of_the_folder(ctx: Context) -> None:
    work, published = ctx.fixture("publish_copy"), ctx.fixture("published")
    victim = ctx.tmp / "victim.txt"
    victim.write_text("not the tool's to write\n")
    target = work / "out" / next(name for name in published if name.endswith("methods.md"))
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    outcome = dihal_inline(*publish_args(work))
    assert outcome.returncode == 0, outcome.stderr
    assert victim.read_text() == "not the tool's to write\n"  # the link is replaced, not written through
    assert not target.is_symlink() and target.read_bytes() == published[target.relative_to(work / "out").as_posix()]


# --- (b) kills ---------------------------------------------------------------------------------

#: when a publish is signalled: while it renders (nothing written yet), as its first file is
#: renamed into place, and a little later (some files new, the rest old)
PUBLISH_KILL_POINTS = (("rendering", None, 0.3), ("first write", 0.0, None), ("writing", 0.02, None))
#: seconds after a record writer starts that it is signalled: mid-serialisation, mid-write, later
RECORD_KILL_DELAYS = (0.05, 0.25, 0.6)


def _first_write(work: Path, pairs: dict, child: subprocess.Popen) -> None:
    """Wait until the publish has replaced a file of the output folder (or finished)."""
    inodes = {name: (work / "out" / name).stat().st_ino for name in pairs}
    deadline = time.monotonic() + 120
    while child.poll() is None and time.monotonic() < deadline:
        if any((work / "out" / name).stat().st_ino != inode for name, inode in inodes.items()):
            return
        time.sleep(0.001)


def kill_publish(stop: signal.Signals) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        published, source = ctx.fixture("published"), ctx.fixture("publish_source")
        new_counts = []
        for point, after_write, after_start in PUBLISH_KILL_POINTS:
            work = ctx.tmp / point.replace(" ", "-")
            shutil.copytree(source, work)
            pairs = old_and_new(work, published)
            child = subprocess.Popen([sys.executable, "-m", "dihal_bench", *publish_args(work)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if after_start is not None:
                time.sleep(after_start)
            else:
                _first_write(work, pairs, child)
                time.sleep(after_write)
            child.send_signal(stop)
            _, stderr = child.communicate(timeout=120)
            assert "Traceback" not in stderr, stderr
            new_counts.append(each_file_old_or_new(work, pairs))
        assert new_counts[0] == 0, new_counts  # signalled while rendering: nothing written yet
    return check


_RECORD_WRITER = """
import json, sys
from pathlib import Path
from dihal_bench.study.records import write_record
target, sources = Path(sys.argv[1]), [json.loads(Path(a).read_text()) for a in sys.argv[2:]]
print("writing", flush=True)
for turn in range(10**6):
    write_record(target, sources[turn % 2])
"""


def kill_record_writer(stop: signal.Signals) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        base = json.loads((REPOSITORY / "results" / PUBLISHED_RECORD).read_text())
        versions = []
        for label in ("old", "new"):  # two records of ~8 MB: a write takes long enough to be cut
            record = {**copy.deepcopy(base), "notes": label * 4_000_000}
            (ctx.tmp / f"{label}.json").write_text(json.dumps(record))
            versions.append(seal_record(record))
        folder = ctx.tmp / "results"
        folder.mkdir()
        target = folder / "record.json"
        write_json_atomic(target, versions[0])
        for delay in RECORD_KILL_DELAYS:
            child = subprocess.Popen([sys.executable, "-c", _RECORD_WRITER, str(target),
                                      str(ctx.tmp / "old.json"), str(ctx.tmp / "new.json")],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert child.stdout.readline().strip() == "writing"
            time.sleep(delay)
            child.send_signal(stop)
            child.communicate(timeout=60)
            assert json.loads(target.read_text()) in versions  # whole: the old record or the new
            assert [path.name for path in folder.iterdir() if not is_temporary(path)] == ["record.json"]
    return check


# --- (c) plugins -------------------------------------------------------------------------------

#: seconds the import-hang case gives a plugin's import (DIHAL_PLUGIN_IMPORT_TIMEOUT)
IMPORT_LIMIT = 2


def installed_plugin(site: Path, module: str, source: str) -> dict[str, str]:
    """``module`` installed into ``site`` as a distribution with a ``dihal_bench`` entry point
    (the metadata pip would write, written directly: no build, no index); the environment
    that puts ``site`` on a child's path."""
    site.mkdir(parents=True, exist_ok=True)
    (site / f"{module}.py").write_text(textwrap.dedent(source))
    info = site / f"{module}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[dihal_bench]\n{module} = {module}\n")
    return {"PYTHONPATH": str(site)}


def load_with(ctx: Context, module: str, source: str):
    """The registry built from the built-ins and ``module`` installed into a folder on sys.path
    (loaded in this process, as every command loads its plugins)."""
    from dihal_bench.registry.plugins import GROUP, build_registry

    import importlib.metadata

    site = ctx.tmp / "site"
    installed_plugin(site, module, source)
    monkeypatch = ctx.fixture("monkeypatch")
    monkeypatch.syspath_prepend(str(site))
    found = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == module]
    assert found and found[0].dist.name == module  # found through its distribution's metadata
    builtins = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.dist.name == "dihal-bench"]
    return build_registry(entry_points=[*builtins, *found])


def plugin_import_raises(ctx: Context) -> None:
    registry = load_with(ctx, "fault_raises", "raise RuntimeError('no GPU driver found')\n")
    assert [(f.plugin, f.distribution, f.reason) for f in registry.failures] == [
        ("fault_raises", "fault_raises", "RuntimeError: no GPU driver found")]
    assert "smollm2-135m" in registry.names("backbone")


def plugin_import_hangs(ctx: Context) -> None:
    env = installed_plugin(ctx.tmp / "site", "fault_hangs", "import time\ntime.sleep(3600)\n")
    started = time.monotonic()
    outcome = dihal("plugins", "--json", env={**env, "DIHAL_PLUGIN_IMPORT_TIMEOUT": str(IMPORT_LIMIT)}, timeout=120)
    assert outcome.returncode == 0 and "Traceback" not in outcome.stderr, outcome.stderr
    [failure] = json.loads(outcome.stdout)["failures"]
    assert failure["plugin"] == "fault_hangs" and f"did not finish within {IMPORT_LIMIT} s" in failure["reason"]
    warning = [line for line in outcome.stderr.splitlines() if "fault_hangs" in line]
    assert warning and warning[0].startswith("Warning: plugin 'fault_hangs'")
    # skipped within its limit: the rest of the command (imports, the listing) takes seconds, not an hour
    assert time.monotonic() - started < IMPORT_LIMIT + 60


def plugin_prints(ctx: Context) -> None:
    capsys = ctx.fixture("capsys")
    capsys.readouterr()
    registry = load_with(ctx, "fault_prints", """
        print("hello from a chatty plugin")
        from dihal_bench import hookimpl

        @hookimpl
        def register_proxies(register):
            print("registering!")
            register("chatty-std", lambda hidden: float(hidden.std()), higher_is_better=False)
    """)
    assert "chatty-std" in registry.names("proxy") and registry.failures == []
    printed = capsys.readouterr()
    assert printed.out == ""  # stdout belongs to the command's output (--json)
    warnings = [line for line in printed.err.splitlines() if "fault_prints" in line]
    assert len(warnings) == 2 and all("printed to stdout" in line for line in warnings), printed.err


def plugin_registers_thousands(ctx: Context) -> None:
    started = time.monotonic()
    registry = load_with(ctx, "fault_floods", """
        from dihal_bench import hookimpl

        @hookimpl
        def register_proxies(register):
            for i in range(5000):
                register(f"flood-{i}", lambda hidden: 0.0, higher_is_better=False)
    """)
    assert not [name for name in registry.names("proxy") if name.startswith("flood-")]
    [failure] = registry.failures
    assert failure.plugin == "fault_floods" and "more than 1000 registrations" in failure.reason
    assert "effective_rank" in registry.names("proxy")
    assert time.monotonic() - started < 30


def _metric(value_of: Callable[[object], dict]):
    def metric(samples, ctx) -> dict:
        return value_of(samples)
    return metric


#: metrics that break the value contract: name -> (its function, words the error line holds)
BAD_METRICS = {
    "nan_metric": (_metric(lambda s: {"nan_metric": float("nan")}), "'nan_metric' is nan, not a number"),
    "text_metric": (_metric(lambda s: {"text_metric": "0.5"}), "is str '0.5', not a number or None"),
    "negative_count": (_metric(lambda s: {"negative_count": 1.0, "n": -3}), "'n' is -3, not a count"),
    "short_list": (_metric(lambda s: {"short_list": 1.0, "words_per_sample": [1.0] * (len(s.texts) - 1)}),
                   "'words_per_sample' has"),
}


class BadMetric:
    def __init__(self, name: str):
        self.name = name

    @hookimpl
    def register_metrics(self, register):
        register(self.name, BAD_METRICS[self.name][0], higher_is_better=None)


def metric_value(name: str) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        ctx.fixture("inline_plugin")(BadMetric(name), f"fault-{name}")
        _, done = ctx.fixture("undisturbed")
        out, results = ctx.tmp / "out", ctx.tmp / "results"
        shutil.copytree(done, out)
        kept = finished_jobs(out)
        names = json.dumps(["gen_ppl", "entropy", name])
        refused(dihal_inline(*run_args(ctx.suite, out, results, **{"metrics.names": names})),
                f"metric {name!r} (fault-{name} (not installed))", BAD_METRICS[name][1], "nothing was recorded")
        store = next(out.glob("*/jobs"))
        now = finished_jobs(store)
        assert {name: mtime for name, mtime in now.items() if name in kept} == kept  # every earlier job kept
        # and no job stored the value: the one new job is the estimate the run under its own config
        # printed before its work (study/first_estimate.py)
        [new] = now.keys() - kept.keys()
        assert new.startswith("estimate-")
        assert not results.exists() or not list(results.glob("*.json"))
        ctx.rerun_matches_undisturbed(out, results, kept)
    return check


def _bad_states(kind: str):
    def factory(tiny_models, char_tokenizer):
        from dihal_builtin.hf_backbone import HFBackbone

        backbone = HFBackbone(copy.deepcopy(tiny_models["llama"]), char_tokenizer, f"bad-{kind}")
        honest = backbone.hidden_states

        def hidden_states(*args, **kwargs):
            states = honest(*args, **kwargs)
            if kind == "shape":
                return [state.transpose(0, 1) for state in states]
            if kind == "dtype":
                return [state.double() for state in states]
            return states[:-1]
        backbone.hidden_states = hidden_states
        return backbone
    return factory


def backbone_states(kind: str, says: str) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        from dihal_bench import hookimpl

        tiny_models, tokenizer = ctx.fixture("tiny_models"), ctx.fixture("char_tokenizer")

        class Plugin:
            @hookimpl
            def register_backbones(self, register):
                register(f"bad-{kind}", lambda **options: _bad_states(kind)(tiny_models, tokenizer))

        ctx.fixture("inline_plugin")(Plugin(), f"fault-states-{kind}")
        refused(dihal_inline("check", "backbone", f"bad-{kind}"),
                f"backbone 'bad-{kind}' from fault-states-{kind} (not installed): hidden_states", says,
                "breaks the backbone contract")
    return check


# --- (d) hostile records and checkpoints --------------------------------------------------------


def _sealed(mutate: Callable[[dict], None]) -> dict:
    record = json.loads((REPOSITORY / "results" / PUBLISHED_RECORD).read_text())
    mutate(record)
    return seal_record(record)


def _every_entropy(value) -> Callable[[dict], None]:
    def mutate(record: dict) -> None:
        for seed in record["per_seed"]:
            for method in seed["methods"].values():
                method["metrics"]["entropy"] = value
    return mutate


def _deep(path: Path) -> None:
    path.write_text('{"format": "dihal-bench/run-record/v2", "x": ' + "[" * 10_000 + "]" * 10_000 + "}")


def _sparse(path: Path) -> None:
    with path.open("wb") as f:  # 200 MB that take no disk: a hole, then a byte
        f.seek(200 * 2**20)
        f.write(b"}")


def _duplicate(path: Path) -> None:
    text = json.dumps(_sealed(lambda r: None))
    path.write_text(text.replace('"suite": ', '"suite": "other", "suite": ', 1))


def _invalid_utf8(path: Path) -> None:
    path.write_bytes(json.dumps(_sealed(lambda r: None)).encode().replace(b'"sanity"', b'"san\xff\xfeity"', 1))


#: hostile record writers: name -> (writes the file, words the error line holds)
HOSTILE_RECORDS = {
    "NaN": (lambda path: path.write_text(json.dumps(_sealed(_every_entropy(float("nan"))))),
            "NaN is not a JSON number"),
    "Infinity": (lambda path: path.write_text(json.dumps(_sealed(_every_entropy(float("inf"))))),
                 "Infinity is not a JSON number"),
    "1e308": (lambda path: path.write_text(json.dumps(_sealed(_every_entropy(1e308)))), "is past 1e+150"),
    "huge string": (lambda path: path.write_text(json.dumps(_sealed(lambda r: r.update(suite="s" * 20_000_000)))),
                    "'suite' is 20,000,000 characters long"),
    "nesting 10,000 deep": (_deep, "not readable JSON"),
    "200 MB": (_sparse, "is 200 MiB, over the 64 MiB"),
    "duplicate keys": (_duplicate, "key 'suite' appears twice"),
    "invalid UTF-8": (_invalid_utf8, "not readable JSON ('utf-8' codec can't decode byte 0xff"),
}


def hostile_record(name: str) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        work = ctx.fixture("publish_copy")
        write, says = HOSTILE_RECORDS[name]
        write(work / "results" / "hostile.json")
        readme = (work / "README.md").read_bytes()
        refused(dihal_inline(*publish_args(work)), f"run record {work / 'results' / 'hostile.json'}", says)
        assert not (work / "out").exists() and (work / "README.md").read_bytes() == readme  # nothing written
    return check


def _bridge_checkpoint(ctx: Context) -> Path:
    """A copy of the undisturbed run's trained DiHAL bridge: a real checkpoint of the tiny model."""
    _, done = ctx.fixture("undisturbed")
    [trained] = done.glob("*/jobs/dihal-train-*/bridge")
    return Path(shutil.copytree(trained, ctx.tmp / "bridge"))


def _describe(checkpoint: Path, **changes) -> None:
    meta = json.loads((checkpoint / "bridge.json").read_text())
    (checkpoint / "bridge.json").write_text(json.dumps({**meta, **changes}))


def bridge_enormous_header(ctx: Context) -> None:
    checkpoint = _bridge_checkpoint(ctx)
    header = json.dumps({"weight": {"dtype": "F32", "shape": [2**31, 2**31],
                                    "data_offsets": [0, 2**64 - 16]}}).encode()
    weights = len(header).to_bytes(8, "little") + header + b"\0" * 64
    (checkpoint / "model.safetensors").write_bytes(weights)
    import hashlib

    _describe(checkpoint, weights_sha256=hashlib.sha256(weights).hexdigest())  # its own sha256: it is read
    refused(dihal_inline("generate", "--checkpoint", str(checkpoint), "-n", "1", "--max-new-tokens", "2"),
            f"{checkpoint / 'model.safetensors'} is not a readable safetensors file", "train it again")


def bridge_names_outside_path(ctx: Context) -> None:
    checkpoint = _bridge_checkpoint(ctx)
    _describe(checkpoint, weights="../../../../etc/passwd")
    refused(dihal_inline("generate", "--checkpoint", str(checkpoint), "-n", "1"),
            "'weights' names the path '../../../../etc/passwd', outside the checkpoint's folder")


def bridge_weights_link_out(ctx: Context) -> None:
    checkpoint = _bridge_checkpoint(ctx)
    outside = ctx.tmp / "elsewhere.safetensors"
    (checkpoint / "model.safetensors").rename(outside)
    (checkpoint / "model.safetensors").symlink_to(outside)
    refused(dihal_inline("generate", "--checkpoint", str(checkpoint), "-n", "1"),
            "model.safetensors leads outside the bridge checkpoint", "copy them in instead of linking")


# --- (e) concurrency ---------------------------------------------------------------------------


def _locked(folder: Path) -> bool:
    """Whether a process holds an flock on ``folder``, as the kernel lists it."""
    try:
        inode = folder.stat().st_ino
        return any(line.split()[1] == "FLOCK" and line.split()[5].endswith(f":{inode}")
                   for line in Path("/proc/locks").read_text().splitlines())
    except (OSError, IndexError):
        return False


def two_publishes(ctx: Context) -> None:
    if not Path("/proc/locks").exists():
        pytest.skip("no /proc/locks to see when the first publish holds its folder")
    work, published = ctx.fixture("publish_copy"), ctx.fixture("published")
    first = subprocess.Popen([sys.executable, "-m", "dihal_bench", *publish_args(work)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while first.poll() is None and time.monotonic() < deadline and not _locked(work / "out"):
        time.sleep(0.005)  # until the first holds the folder: read from /proc/locks, not by taking it
    second = dihal_inline(*publish_args(work))
    assert first.wait(timeout=120) == 0, first.stderr.read()
    refused(second, f"the leaderboard folder --out '{work / 'out'}' is being written by another dihal-bench "
                    "process", "wait for it to finish")
    for name, content in published.items():  # the first finished, whole
        assert (work / "out" / name).read_bytes() == content, name


def publish_beside_a_run(ctx: Context) -> None:
    """A run writing its records into the results folder while a publish reads it: the publish
    reads each record whole (written atomically), never a half-written one."""
    work, published = ctx.fixture("publish_copy"), ctx.fixture("published")
    extra = _sealed(lambda r: r.update(suite="beside"))
    write_json_atomic(work / "results" / "beside.json", extra)  # there before the publish starts reading
    stop = threading.Event()

    def run_writing_records() -> None:
        turn = 0
        while not stop.is_set():
            write_json_atomic(work / "results" / "beside.json", extra)
            turn += 1

    writer = threading.Thread(target=run_writing_records)
    writer.start()
    try:
        outcome = dihal_inline(*publish_args(work))
    finally:
        stop.set()
        writer.join()
    assert outcome.returncode == 0, outcome.stderr
    assert "beside" in (work / "out" / "index.md").read_text()  # the record being rewritten was read whole
    assert (work / "README.md").read_bytes() == published["../README.md"]


def stale_publish_lock(ctx: Context) -> None:
    """A publish killed with SIGKILL while it held the folder and was writing: the next one is
    not locked out, removes the temporary files the kill left, and completes."""
    work, published = ctx.fixture("publish_copy"), ctx.fixture("published")
    pairs = old_and_new(work, published)
    child = subprocess.Popen([sys.executable, "-m", "dihal_bench", *publish_args(work)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _first_write(work, pairs, child)
    child.kill()
    child.wait()
    each_file_old_or_new(work, pairs)
    (work / "out" / ".methods.md.left.tmp").write_text("a write a kill cut short")
    again = dihal_inline(*publish_args(work))
    assert again.returncode == 0, again.stderr
    for name, content in published.items():
        assert (work / "out" / name).read_bytes() == content, name
    no_temporaries(work / "out")


def stale_store_lock(ctx: Context) -> None:
    """A job store whose lock file names a run that died: the kernel lock died with it, so the
    next run goes ahead (and the store's finished jobs are all kept)."""
    _, done = ctx.fixture("undisturbed")
    out, results = ctx.tmp / "out", ctx.tmp / "results"
    shutil.copytree(done, out)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (next(out.glob("*/jobs")) / ".lock").write_text(dead.stdout)
    ctx.rerun_matches_undisturbed(out, results, finished_jobs(out))


# --- (f) requests that would exhaust memory -----------------------------------------------------


def memory_request(settings: dict[str, str], setting: str) -> Callable[[Context], None]:
    def check(ctx: Context) -> None:
        from dihal_bench.config.suite import apply_overrides, resolve_suite
        from dihal_bench.registry.resolve import backbone_tokenizer, describe_backbone
        from dihal_bench.study.estimate import worker_memory
        from dihal_bench.study.memory import machine_memory, memory_needs

        _, config = resolve_suite("smoke")
        config = apply_overrides(config, settings)
        needs = memory_needs(config, describe_backbone(config.backbone), len(backbone_tokenizer(config.backbone)))
        price = max(need.bytes for need in needs if need.setting.startswith(setting)) + worker_memory(config)
        available, _ = machine_memory(config.device)
        if available is None or price <= available:
            pytest.skip(f"this machine has {available} bytes, enough for the {price} bytes priced")
        args = ["run", "--suite", "smoke", "--out", str(ctx.tmp / "runs"), "--results", str(ctx.tmp / "results")]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        line = refused(dihal_inline(*args), f"Error: {setting}=", "GiB of memory", "more than this machine's memory",
                       f"lower {setting}")
        assert f"{price / 2**30:,.1f} GiB" in line and f"{available / 2**30:,.1f} GiB" in line
        assert not (ctx.tmp / "runs").exists()  # refused before any work
    return check


# --- the battery ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One row: the fault, the outcome expected, what must survive it, and the check that
    injects it and asserts all three."""

    kind: str
    fault: str
    expect: str
    survives: str
    check: Callable[[Context], None]
    slow: bool = False


ONE_LINE = "one Error: line naming it and what to do, non-zero exit, no traceback"
RERUN = "finished jobs kept; the same command again gives the undisturbed record"

CASES: dict[str, Fault] = {
    # (a) the disk
    "disk full mid-run": Fault("disk", "the job store's 1 MB file system fills up part-way", ONE_LINE, RERUN,
                               disk_full_mid_run, slow=True),
    "disk full writing the record": Fault("disk", "no space left for the run record", ONE_LINE,
                                          f"no record, whole or half; {RERUN}", disk_full_writing_the_record,
                                          slow=True),
    "read-only results folder": Fault("disk", "--results on a read-only mount", f"{ONE_LINE}, before any work",
                                      "nothing written", read_only_results),
    "read-only publish folder": Fault("disk", "--out of the publish on a read-only mount", ONE_LINE,
                                      "the README untouched", read_only_publish_folder),
    "job store deleted mid-run": Fault("disk", "rm -r of the job store while the run is in its sweep",
                                       "the run completes or stops with one Error: line", RERUN,
                                       store_deleted_mid_run, slow=True),
    "job store truncated": Fault("disk", "a finished job's result.json and a checkpoint cut short",
                                 "both jobs redone, with a warning", f"every other job kept; {RERUN}",
                                 store_truncated),
    "spaces and unicode in paths": Fault("disk", "--out and --results under 'with spaces/ünïcødé 日本語 $HOME ;'",
                                         "the run completes", RERUN, unicode_and_spaces),
    "a name too long": Fault("disk", "--out with a 300-character folder name", f"{ONE_LINE}, before any work",
                             "nothing written", name_too_long),
    "symlink out of the output folder": Fault("disk", "a table in --out is a symlink to a file outside it",
                                              "the publish completes", "the file outside untouched",
                                              symlink_out_of_the_folder),
    # (b) kills, each at several moments
    **{f"{stop.name} mid-publish": Fault("kill", f"{stop.name} to `dihal-bench leaderboard --readme` while it "
                                                 "renders, at its first write and while it writes",
                                         "the publish stops", "every table, page and README whole: old or new; "
                                         "the README new only when every file is", kill_publish(stop), slow=True)
       for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)},
    **{f"{stop.name} mid-record": Fault("kill", f"{stop.name} to a process writing 8 MB run records, at "
                                                f"{', '.join(map(str, RECORD_KILL_DELAYS))} s",
                                        "the writer stops", "the record whole: the old one or the new",
                                        kill_record_writer(stop))
       for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)},
    # (c) plugins
    "plugin import raises": Fault("plugin", "an installed plugin's import raises", "listed as a failure, skipped",
                                  "every other plugin", plugin_import_raises),
    "plugin import hangs": Fault("plugin", "an installed plugin's import sleeps for an hour",
                                 f"named and skipped after {IMPORT_LIMIT} s ($DIHAL_PLUGIN_IMPORT_TIMEOUT)",
                                 "the command completes", plugin_import_hangs),
    "plugin prints": Fault("plugin", "a plugin prints to stdout at import and in its hook",
                           "a warning naming it on stderr", "stdout: the --json listing alone", plugin_prints),
    "plugin registers thousands": Fault("plugin", "a plugin registers 5,000 proxies",
                                        "its hook fails, named, none of them used", "every other plugin",
                                        plugin_registers_thousands),
    **{f"metric returns {label}": Fault("plugin", f"a metric plugin returns {label}", ONE_LINE + " naming the plugin",
                                        f"no record or job holds the value; {RERUN}", metric_value(name))
       for name, label in (("nan_metric", "NaN"), ("text_metric", "a string"), ("negative_count", "a negative count"),
                           ("short_list", "a per-sample list of the wrong length"))},
    **{f"backbone states of the wrong {kind}": Fault("plugin", f"a backbone plugin's hidden states have the wrong {kind}",
                                                     ONE_LINE + " naming the plugin", "nothing computed from them",
                                                     backbone_states(kind, says))
       for kind, says in (("shape", "has shape (5, 2, 32)"), ("dtype", "has dtype torch.float64"),
                          ("count", "returned 3 states for 3 layers"))},
    # (d) hostile records and checkpoints
    **{f"record: {name}": Fault("record", f"a run record holding {name}", ONE_LINE + " naming the record",
                                "nothing written: no table, page or README changed", hostile_record(name))
       for name in HOSTILE_RECORDS},
    "checkpoint: enormous safetensors header": Fault(
        "record", "model.safetensors whose header claims a 2^31 x 2^31 tensor", ONE_LINE, "nothing allocated",
        bridge_enormous_header),
    "checkpoint: bridge.json names a path outside": Fault(
        "record", "bridge.json with weights=../../../../etc/passwd", ONE_LINE, "nothing read through it",
        bridge_names_outside_path),
    "checkpoint: weights link out of the folder": Fault(
        "record", "model.safetensors is a symlink to a file outside the checkpoint", ONE_LINE,
        "nothing read through it", bridge_weights_link_out),
    # (e) concurrency
    "two publishes at once": Fault("concurrency", "a second publish into the folder a first is writing",
                                   "the second refused at once, naming the folder", "the first completes whole",
                                   two_publishes),
    "publish beside a run": Fault("concurrency", "a run rewrites a record in --results throughout a publish",
                                  "the publish completes", "every record read whole", publish_beside_a_run),
    "stale publish lock": Fault("concurrency", "a publish killed (-9) while holding the folder, mid-write",
                                "the next publish goes ahead and removes the kill's temporary files",
                                "every file whole; then all new", stale_publish_lock),
    "stale job store lock": Fault("concurrency", "a job store's .lock names a dead run", "the run goes ahead",
                                  RERUN, stale_store_lock),
    # (f) memory
    "budget.batch_size=100000": Fault("memory", "a training batch of 100,000 sequences (smoke suite)",
                                      ONE_LINE + ", the price and the machine's memory stated", "nothing written",
                                      memory_request({"budget.batch_size": "100000", "budget.epochs": "1000"},
                                                     "budget.batch_size")),
    "sampling.samples=100000": Fault("memory", "100,000 samples of 1,024 tokens scored with MAUVE (smoke suite)",
                                     ONE_LINE + ", the price and the machine's memory stated", "nothing written",
                                     memory_request({"sampling.samples": "100000", "sampling.seq_len": "1024",
                                                     "metrics.mauve": "true"}, "sampling.samples")),
    "sampling.batch_size=100000": Fault("memory", "a sampling batch of 100,000 (smoke suite)",
                                        ONE_LINE + ", the price and the machine's memory stated", "nothing written",
                                        memory_request({"sampling.batch_size": "100000", "sampling.seq_len": "1024"},
                                                       "sampling.batch_size")),
}


def test_every_class_of_fault_has_three_cases():
    kinds = [case.kind for case in CASES.values()]
    assert {kind: kinds.count(kind) >= 3 for kind in dict.fromkeys(kinds)} == dict.fromkeys(
        ("disk", "kill", "plugin", "record", "concurrency", "memory"), True)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.slow if case.slow else ())
                                  for name, case in CASES.items()])
def test_fault(name, tmp_path, suite, request):
    CASES[name].check(Context(tmp_path, suite, request))


def test_the_fault_page_lists_every_case():
    page = (REPOSITORY / "docs" / "faults.md").read_text(encoding="utf-8")
    rows = {line.split(" | ")[1].removesuffix(" (slow)") for line in page.splitlines() if line.startswith("| ")}
    assert set(CASES) <= rows, sorted(set(CASES) - rows)
