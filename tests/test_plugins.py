"""Plugin loading: inline plugins, name clashes, broken plugins, and a real installed plugin package."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dihal_bench import __version__, hookimpl
from dihal_bench.errors import DihalError
from dihal_bench.plugins import (
    GROUP,
    PluginFailure,
    build_registry,
    factory,
    get_registry,
    lookup,
    unregister_plugin,
)

DIHAL_BENCH = Path(sys.executable).with_name("dihal-bench")


def spread(hidden) -> float:
    return float(hidden.std())


class SpreadPlugin:
    """Registers one proxy, ``test-spread``."""

    @hookimpl
    def register_proxies(self, register):
        register("test-spread", spread, higher_is_better=False, description="standard deviation of the entries")


class ExplodingPlugin:
    """Its proxy hook registers one proxy and then fails; its metric hook works."""

    @hookimpl
    def register_proxies(self, register):
        register("half-registered", spread)
        raise RuntimeError("boom\nand a second line that the report leaves out")

    @hookimpl
    def register_metrics(self, register):
        register("exploding-metric", spread)


class ClashingPlugin:
    """Registers a proxy under a built-in proxy's name."""

    @hookimpl
    def register_proxies(self, register):
        register("effective_rank", spread)


def builtin_entry_points() -> list[importlib.metadata.EntryPoint]:
    return [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.dist.name == "dihal-bench"]


# --- inline plugins ------------------------------------------------------------------------


def test_inline_plugin_appears_with_its_meta(inline_plugin):
    inline_plugin(SpreadPlugin(), "spread-plugin")
    registration = lookup("proxy", "test-spread")
    assert registration.obj is spread
    assert factory("proxy", "test-spread") is spread
    assert registration.meta == {"higher_is_better": False, "description": "standard deviation of the entries"}
    assert (registration.kind, registration.plugin) == ("proxy", "spread-plugin")
    assert (registration.distribution, registration.version) == (None, None)
    assert registration.source == "spread-plugin (not installed)"
    assert "effective_rank" in get_registry().names("proxy")  # the built-ins are still there


def test_unregistered_plugin_is_gone(inline_plugin):
    inline_plugin(SpreadPlugin(), "spread-plugin")
    unregister_plugin("spread-plugin")
    with pytest.raises(DihalError, match=r"^unknown proxy 'test-spread'; known: .*effective_rank"):
        lookup("proxy", "test-spread")


def test_same_name_of_the_same_kind_from_two_plugins_names_both():
    with pytest.raises(DihalError) as error:
        build_registry(entry_points=[], extra_plugins=[("first", SpreadPlugin()), ("second", SpreadPlugin())])
    message = str(error.value)
    assert message.startswith("proxy 'test-spread' is registered twice")
    assert "plugin 'first' (first (not installed))" in message
    assert "plugin 'second' (second (not installed))" in message


def test_clash_with_a_builtin_names_the_builtin_distribution(inline_plugin):
    with pytest.raises(DihalError) as error:
        inline_plugin(ClashingPlugin(), "clash")
    message = str(error.value)
    assert "proxy 'effective_rank' is registered twice" in message
    assert f"plugin 'proxies' (dihal-bench {__version__})" in message
    assert "plugin 'clash'" in message


def test_rejected_inline_plugin_is_not_kept(inline_plugin):
    with pytest.raises(DihalError):
        inline_plugin(ClashingPlugin(), "clash")
    assert "effective_rank" in get_registry(refresh=True).names("proxy")


def test_same_name_in_different_kinds_is_fine():
    class TwoKinds:
        @hookimpl
        def register_proxies(self, register):
            register("shared-name", spread)

        @hookimpl
        def register_metrics(self, register):
            register("shared-name", spread)

    registry = build_registry(entry_points=[], extra_plugins=[("two-kinds", TwoKinds())])
    assert registry.names("proxy") == registry.names("metric") == ["shared-name"]


# --- broken plugins ------------------------------------------------------------------------


def test_failing_hook_is_reported_and_the_rest_survives():
    registry = build_registry(extra_plugins=[("exploding", ExplodingPlugin()), ("spread-plugin", SpreadPlugin())])
    assert registry.failures == [PluginFailure("exploding", None, "register_proxies: RuntimeError: boom")]
    assert "test-spread" in registry.names("proxy")  # another plugin's registration
    assert "effective_rank" in registry.names("proxy")  # the built-ins
    assert "exploding-metric" in registry.names("metric")  # the failing plugin's other hook
    assert "half-registered" not in registry.names("proxy")  # a failing hook counts as a whole or not at all


def test_entry_point_that_fails_to_import_is_reported_and_skipped():
    ghost = importlib.metadata.EntryPoint(name="ghost", value="dihal_test_no_such_module", group=GROUP)
    registry = build_registry(entry_points=[*builtin_entry_points(), ghost])
    assert registry.failures == [
        PluginFailure("ghost", None, "ModuleNotFoundError: No module named 'dihal_test_no_such_module'")
    ]
    assert {"smollm2-135m", "gemma3-270m", "hf"} <= set(registry.names("backbone"))


def test_second_entry_point_with_a_taken_plugin_name_is_skipped():
    impostor = importlib.metadata.EntryPoint(name="proxies", value="dihal_builtin.metrics", group=GROUP)
    registry = build_registry(entry_points=[*builtin_entry_points(), impostor])
    assert registry.failures == [PluginFailure("proxies", None, "a plugin of this name is already loaded")]
    assert registry.get("proxy", "effective_rank").plugin == "proxies"
    assert registry.names("metric") == build_registry(entry_points=builtin_entry_points()).names("metric")


def write_module(directory: Path, name: str, source: str) -> None:
    (directory / f"{name}.py").write_text(textwrap.dedent(source))


def test_entry_point_with_a_mistyped_hook_argument_is_reported(tmp_path, monkeypatch):
    write_module(tmp_path, "dihal_test_bad_argument", """
        from dihal_bench import hookimpl

        @hookimpl
        def register_proxies(add):  # the hook's argument is called `register`
            add("never", len)
    """)
    monkeypatch.syspath_prepend(tmp_path)
    bad = importlib.metadata.EntryPoint(name="bad-argument", value="dihal_test_bad_argument", group=GROUP)
    registry = build_registry(entry_points=[*builtin_entry_points(), bad])
    (failure,) = registry.failures
    assert (failure.plugin, failure.reason.split(":")[0]) == ("bad-argument", "PluginValidationError")
    assert "never" not in registry.names("proxy")
    assert "effective_rank" in registry.names("proxy")


def test_entry_point_with_a_misspelt_hook_is_reported_and_skipped(tmp_path, monkeypatch):
    write_module(tmp_path, "dihal_test_misspelt_hook", """
        from dihal_bench import hookimpl

        @hookimpl
        def register_proxy(register):  # the hook is register_proxies
            register("never", len)
    """)
    monkeypatch.syspath_prepend(tmp_path)
    misspelt = importlib.metadata.EntryPoint(name="misspelt", value="dihal_test_misspelt_hook", group=GROUP)
    registry = build_registry(entry_points=[*builtin_entry_points(), misspelt])
    assert [f.plugin for f in registry.failures] == ["misspelt"]
    assert "register_proxy" in registry.failures[0].reason
    assert "smollm2-135m" in registry.names("backbone")


def test_inline_plugin_with_an_unknown_hook_is_an_error_naming_it():
    class Misspelt:
        @hookimpl
        def register_proxy(self, register):
            register("never", len)

    with pytest.raises(DihalError, match=r"^plugin 'misspelt': .*register_proxy"):
        build_registry(entry_points=[], extra_plugins=[("misspelt", Misspelt())])


# --- the built-ins -------------------------------------------------------------------------


def test_builtin_registry_lists_the_embedded_backbones_and_stdlib_docs():
    registry = get_registry()
    assert registry.failures == []
    assert __version__ == importlib.metadata.version("dihal-bench")
    for kind, name in [("backbone", "smollm2-135m"), ("backbone", "gemma3-270m"), ("corpus", "stdlib-docs")]:
        registration = registry.get(kind, name)
        assert (registration.distribution, registration.version) == ("dihal-bench", __version__)
        assert registration.source == f"dihal-bench {__version__}"
        assert registration.meta["description"]


# --- a real plugin package, installed with pip ---------------------------------------------


def install_plugin_package(root: Path, distribution: str, module: str, source: str) -> Path:
    """Write a one-module package whose module is a ``dihal_bench`` entry point, pip-install it
    into ``root/site`` (offline, no dependencies) and return that directory."""
    package = root / "package"
    (package / module).mkdir(parents=True)
    (package / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{distribution}"
        version = "1.2.3"

        [project.entry-points.dihal_bench]
        {module} = "{module}"
    """))
    (package / module / "__init__.py").write_text(textwrap.dedent(source))
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(site), str(package)],
        check=True, capture_output=True, cwd=root,
    )
    return site


def run_dihal_bench(*args: str, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run([str(DIHAL_BENCH), *args], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def myplug_site(tmp_path_factory) -> Path:
    return install_plugin_package(tmp_path_factory.mktemp("myplug"), "dihal-test-myplug", "myplug", """
        from dihal_bench import hookimpl


        def spread(hidden, **params):
            return float(hidden.std())


        @hookimpl
        def register_proxies(register):
            register("myplug-spread", spread, higher_is_better=False, description="std of the entries")
    """)


@pytest.fixture(scope="module")
def brokenplug_site(tmp_path_factory) -> Path:
    return install_plugin_package(tmp_path_factory.mktemp("brokenplug"), "dihal-test-brokenplug", "brokenplug", """
        raise ImportError("brokenplug needs a library that is not installed")
    """)


def test_installed_plugin_is_listed_with_its_distribution(myplug_site):
    result = run_dihal_bench("plugins", "--json", site=myplug_site)
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    assert listing["failures"] == []
    mine = [row for row in listing["plugins"] if row["name"] == "myplug-spread"]
    assert mine == [{
        "kind": "proxy", "name": "myplug-spread", "plugin": "myplug", "distribution": "dihal-test-myplug",
        "version": "1.2.3", "description": "std of the entries",
    }]
    assert {"smollm2-135m", "stdlib-docs"} <= {row["name"] for row in listing["plugins"]}


def test_plugin_that_fails_to_import_only_warns(brokenplug_site):
    result = run_dihal_bench("plugins", site=brokenplug_site)
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m" in result.stdout and f"dihal-bench {__version__}" in result.stdout
    assert "brokenplug" not in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "Warning: plugin 'brokenplug' (dihal-test-brokenplug) failed to load: "
        "ImportError: brokenplug needs a library that is not installed"
    )
