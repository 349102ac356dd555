"""Built-in suites, as data: one TOML file each (docs/method.md#suites)."""

from pathlib import Path

from dihal_bench import hookimpl
from dihal_bench.config.suite import (
    tomllib,  # the standard library's, or tomli before Python 3.11
)

HERE = Path(__file__).parent


@hookimpl
def register_suites(register):
    for path in sorted(HERE.glob("*.toml")):
        register(path.stem, path, description=tomllib.loads(path.read_text())["description"])
