"""The package's layering (docs/architecture.md) holds: `lint-imports` checks the contracts in
pyproject.toml against every import, function-local ones included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the study's modules stay small enough to read in one sitting
STUDY_MODULE_LINES = 300


def test_every_import_follows_the_layers_and_no_package_has_a_cycle():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    if lint is None:
        pytest.fail("lint-imports is missing: install the test extra (pip install -e '.[test]')")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_package_module_is_in_a_layer():
    """The layers contract is exhaustive: a new top-level package or module must be placed."""
    from dihal_bench.config.suite import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    layered = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    present = {p.stem if p.is_file() else p.name for p in (ROOT / "dihal_bench").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert present == layered


def test_no_study_module_is_longer_than_a_sitting():
    long = {p.name: n for p in (ROOT / "dihal_bench" / "study").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > STUDY_MODULE_LINES}
    assert not long, long
