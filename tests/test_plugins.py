"""Plugin loading: inline plugins, name clashes, broken plugins, each kind's registration
contract, resolution of references by the plugins that handle them, and a real installed
plugin package."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from dihal_builtin.baselines.ar_backbone import ARBackbone

from dihal_bench import __version__, hookimpl
from dihal_bench.api.baseline import Baseline
from dihal_bench.cli import cli
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import (
    GROUP,
    PluginFailure,
    build_registry,
    get_registry,
    unregister_plugin,
)
from dihal_bench.registry.resolve import backbone_factory, corpus_factory, load_backbone

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
        register("half-registered", spread, higher_is_better=True)
        raise RuntimeError("boom\nand a second line that the report leaves out")

    @hookimpl
    def register_metrics(self, register):
        register("exploding-metric", spread)


class ClashingPlugin:
    """Registers a proxy under a built-in proxy's name."""

    @hookimpl
    def register_proxies(self, register):
        register("effective_rank", spread, higher_is_better=False)


def builtin_entry_points() -> list[importlib.metadata.EntryPoint]:
    return [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.dist.name == "dihal-bench"]


# --- inline plugins ------------------------------------------------------------------------


def test_inline_plugin_appears_with_its_meta(inline_plugin):
    inline_plugin(SpreadPlugin(), "spread-plugin")
    registration = get_registry().get("proxy", "test-spread")
    assert registration.obj is spread
    assert registration.meta == {"higher_is_better": False, "description": "standard deviation of the entries"}
    assert (registration.kind, registration.plugin) == ("proxy", "spread-plugin")
    assert (registration.distribution, registration.version) == (None, None)
    assert registration.source == "spread-plugin (not installed)"
    assert "effective_rank" in get_registry().names("proxy")  # the built-ins are still there


def test_unregistered_plugin_is_gone(inline_plugin):
    inline_plugin(SpreadPlugin(), "spread-plugin")
    unregister_plugin("spread-plugin")
    with pytest.raises(DihalError, match=r"^unknown proxy 'test-spread'; known: .*effective_rank"):
        get_registry().get("proxy", "test-spread")


def test_same_name_of_the_same_kind_from_two_plugins_is_used_by_neither_and_both_are_listed():
    registry = build_registry(entry_points=[], extra_plugins=[("first", SpreadPlugin()), ("second", SpreadPlugin()),
                                                               ("third", SpreadPlugin())])
    assert "test-spread" not in registry.names("proxy")  # either choice would be arbitrary
    reasons = {(failure.plugin, failure.reason) for failure in registry.failures}
    both = ("proxy 'test-spread' is registered twice: by plugin 'first' (first (not installed)) and by plugin "
            "'second' (second (not installed)); neither is used")
    assert reasons == {("first", both), ("second", both),
                       ("third", "proxy 'test-spread' is registered twice; skipped")}


def test_a_plugin_that_reregisters_a_builtin_is_skipped_and_listed(inline_plugin):
    inline_plugin(ClashingPlugin(), "clash")  # not fatal: every command still works
    registration = get_registry().get("proxy", "effective_rank")
    assert registration.plugin == "proxies" and registration.obj is not spread
    [failure] = [f for f in get_registry().failures if f.plugin == "clash"]
    assert failure.reason == (f"proxy 'effective_rank' is registered twice: by the built-in plugin 'proxies' "
                              f"(dihal-bench {__version__}), which keeps it, and by plugin 'clash' (clash (not "
                              f"installed)); skipped")
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0, result.output
    assert "effective_rank" in result.stdout
    assert f"Warning: plugin 'clash' (no distribution) failed to load: {failure.reason}" in result.stderr


def test_same_name_in_different_kinds_is_fine():
    class TwoKinds:
        @hookimpl
        def register_proxies(self, register):
            register("shared-name", spread, higher_is_better=True)

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


# --- each kind's registration contract -------------------------------------------------------


def no_tensor(*, k: int = 1) -> float:
    return float(k)


def needs_k(hidden, k) -> float:
    return float(hidden.std()) * k


def make_baseline(backbone, budget, seed=0):
    return ARBackbone(backbone, budget, seed)


class NotABaseline:
    name = "not-a-baseline"


class RenamedAR(ARBackbone):
    name = "ar-renamed"


class HalfBaseline(Baseline):
    name = "half-baseline"


MISSING_SUITE = Path(__file__).with_name("no-such-suite.toml")


def one_hook_plugin(hook: str, *registrations: tuple[str, object, dict]) -> SimpleNamespace:
    """A plugin object whose one hook ``hook`` makes the given ``register`` calls in order."""

    def implementation(register):
        for name, obj, meta in registrations:
            register(name, obj, **meta)

    return SimpleNamespace(**{hook: hookimpl(implementation)})


BROKEN_REGISTRATIONS = {
    "misspelt direction": (
        "register_proxies", ("spread", spread, {"higher_is_beter": False}),
        "proxy 'spread': unknown meta key 'higher_is_beter' (did you mean 'higher_is_better'?)"),
    "missing direction": (
        "register_proxies", ("spread", spread, {}),
        "proxy 'spread': missing required meta higher_is_better="),
    "proxy direction not a bool": (
        "register_proxies", ("spread", spread, {"higher_is_better": 1}),
        "proxy 'spread': higher_is_better=1 is not True or False"),
    "proxy without a positional parameter": (
        "register_proxies", ("no-tensor", no_tensor, {"higher_is_better": True}),
        "proxy 'no-tensor': no_tensor takes no positional parameter for the (N, d) hidden-state tensor"),
    "proxy constant without a default": (
        "register_proxies", ("needs-k", needs_k, {"higher_is_better": True}),
        ("proxy 'needs-k': needs_k: parameter(s) k after the tensor have no default "
         "(a proxy's constants need defaults)")),
    "blank name": (
        "register_proxies", (" ", spread, {"higher_is_better": True}),
        "proxy name ' ' is not a non-empty string without surrounding blanks"),
    "metric direction not a bool": (
        "register_metrics", ("spread-metric", spread, {"higher_is_better": "yes"}),
        "metric 'spread-metric': higher_is_better='yes' is not True, False or None (no better direction)"),
    "unknown key with no close match": (
        "register_metrics", ("spread-metric", spread, {"colour": "red"}),
        "metric 'spread-metric': unknown meta key 'colour' (allowed: higher_is_better, display_name, description, "
        "default, reads_evaluator)"),
    "baseline factory instead of a class": (
        "register_baselines", ("made", make_baseline, {}),
        "baseline 'made': make_baseline is not a class: a baseline registers its Baseline subclass itself"),
    "baseline not a Baseline": (
        "register_baselines", ("not-a-baseline", NotABaseline, {}),
        "baseline 'not-a-baseline': class NotABaseline is not a subclass of dihal_bench.api.baseline.Baseline"),
    "baseline with another name": (
        "register_baselines", ("ar-other", RenamedAR, {}),
        "baseline 'ar-other': class RenamedAR has name 'ar-renamed', not the registered 'ar-other'"),
    "abstract baseline": (
        "register_baselines", ("half-baseline", HalfBaseline, {}),
        "baseline 'half-baseline': class HalfBaseline leaves components, loss, sample, training_data unimplemented"),
    "bridge not callable": (
        "register_bridges", ("forty-two", 42, {}),
        "bridge 'forty-two': 42 is not callable"),
    "backbone parameter count not an int": (
        "register_backbones", ("big", make_baseline, {"parameters": 1.5e8}),
        "backbone 'big': parameters=150000000.0 is not a positive int (the parameter count) or a callable(*arguments) -> it or None"),
    "corpus handles not callable": (
        "register_corpora", ("mine", make_baseline, {"handles": "mine:"}),
        "corpus 'mine': handles='mine:' is not a callable(reference: str) -> bool"),
    "missing suite file": (
        "register_suites", ("missing", MISSING_SUITE, {}),
        f"suite 'missing': suite file {MISSING_SUITE} does not exist"),
}


def listed(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["plugins", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("case", list(BROKEN_REGISTRATIONS))
def test_a_registration_that_breaks_its_contract_fails_its_plugin(case, inline_plugin):
    hook, registration, reason = BROKEN_REGISTRATIONS[case]
    inline_plugin(one_hook_plugin(hook, registration), "broken")
    listing = listed()
    assert listing["failures"] == [{"plugin": "broken", "distribution": None, "reason": f"{hook}: {reason}"}]
    names = {(row["kind"], row["name"]) for row in listing["plugins"]}
    assert registration[0] not in {name for _, name in names}
    builtins = {("backbone", "smollm2-135m"), ("corpus", "stdlib-docs"), ("proxy", "effective_rank"),
                ("bridge", "dihal-bridge"), ("baseline", "ar-backbone"), ("metric", "gen_ppl"), ("suite", "smoke")}
    assert builtins <= names


def test_a_broken_registration_fails_the_whole_hook_and_nothing_else():
    plugin = one_hook_plugin("register_proxies", ("first-spread", spread, {"higher_is_better": True}),
                             ("second-spread", spread, {"higher_is_beter": True}))
    plugin.register_metrics = hookimpl(lambda register: register("spread-metric", spread, display_name="Spread"))
    registry = build_registry(entry_points=[], extra_plugins=[("half-broken", plugin)])
    (failure,) = registry.failures
    assert failure.reason.startswith("register_proxies: proxy 'second-spread': unknown meta key")
    assert registry.names("proxy") == []  # not even the valid first registration
    assert registry.get("metric", "spread-metric").meta == {"display_name": "Spread"}


def test_proxy_signatures_that_fit_the_contract_are_accepted():
    def positional_only(hidden, /, *, k=3, seed=0):
        return 0.0

    def variadic(*arrays, **params):
        return 0.0

    class CallableProxy:
        def __call__(self, hidden, scale=1.0):
            return 0.0

    plugin = one_hook_plugin("register_proxies", *[(f"ok-{i}", fn, {"higher_is_better": False}) for i, fn in
                                                   enumerate((positional_only, variadic, CallableProxy(), spread))])
    registry = build_registry(entry_points=[], extra_plugins=[("fine", plugin)])
    assert registry.failures == []
    assert registry.names("proxy") == ["ok-0", "ok-1", "ok-2", "ok-3"]


# --- resolving references by what plugins declare they handle ----------------------------------


def mine_backbone(reference: str = "mine:default", **options):
    """Stands in for a backbone factory: returns what it was called with."""
    return reference, options


def handles_mine(reference: str) -> bool:
    return reference.startswith("mine:")


def test_a_backbone_plugin_that_handles_a_reference_loads_it(inline_plugin):
    inline_plugin(one_hook_plugin("register_backbones", ("mine", mine_backbone, {"handles": handles_mine})), "mine")
    assert backbone_factory("mine:x") == (mine_backbone, ("mine:x",))
    assert backbone_factory("mine") == (mine_backbone, ())  # by its registered name: no reference
    # loading calls the factory, then checks what it made: a tuple is no backbone, and is refused naming the plugin
    with pytest.raises(DihalError, match=r"^backbone 'tuple' from mine \(not installed\): hidden_states failed"):
        load_backbone("mine:x", device="cpu")
    assert backbone_factory("org/model")[1] == ("org/model",)  # the built-in hf still takes hub ids
    with pytest.raises(DihalError, match=r"^unknown backbone 'yours:x'; known: gemma3-270m, hf, mine, "
                                         r"smollm2-135m; or a reference handled by hf \(.*\); mine \(.*\)$"):
        backbone_factory("yours:x")


def test_a_registered_name_wins_over_the_handlers(inline_plugin):
    def named(**options):
        return "named", options

    inline_plugin(one_hook_plugin("register_backbones", ("mine", mine_backbone, {"handles": handles_mine}),
                                  ("mine:special", named, {})), "mine")
    assert backbone_factory("mine:special") == (named, ())


def test_two_plugins_that_handle_one_reference_are_an_error_naming_both(inline_plugin):
    inline_plugin(one_hook_plugin("register_backbones", ("mine", mine_backbone, {"handles": handles_mine})), "mine")
    inline_plugin(one_hook_plugin("register_backbones", ("mine-too", mine_backbone, {"handles": handles_mine})),
                  "mine-too")
    with pytest.raises(DihalError, match=r"^backbone 'mine:x' is accepted by more than one plugin: "
                                         r"mine \(from mine \(not installed\)\), "
                                         r"mine-too \(from mine-too \(not installed\)\); "):
        backbone_factory("mine:x")
    assert backbone_factory("mine")[0] is mine_backbone  # names stay unambiguous


def test_a_handles_that_raises_is_named_in_the_error(inline_plugin):
    def handles_badly(reference):
        raise KeyError(reference)

    inline_plugin(one_hook_plugin("register_corpora", ("bad-handler", mine_backbone, {"handles": handles_badly})),
                  "bad-handler")
    with pytest.raises(DihalError, match=r"^corpus 'bad-handler' from bad-handler \(not installed\): "
                                         r"handles\('elsewhere'\) failed: KeyError: 'elsewhere'$"):
        corpus_factory("elsewhere")
    assert corpus_factory("stdlib-docs")[1] == ()  # a registered name never asks the handlers


def test_builtin_backbone_references(tmp_path):
    registry = get_registry()
    assert backbone_factory("smollm2-135m") == (registry.get("backbone", "smollm2-135m").obj, ())
    from_pretrained = registry.get("backbone", "hf").obj
    for reference in (str(tmp_path), "HuggingFaceTB/SmolLM2-135M"):  # a local directory, a hub id
        assert backbone_factory(reference) == (from_pretrained, (reference,))
    for not_a_model in ("./model", "org/name/extra", str(tmp_path / "weights.gguf")):
        with pytest.raises(DihalError, match=f"^unknown backbone {re.escape(repr(not_a_model))}; known: "):
            backbone_factory(not_a_model)


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


def test_builtin_metrics_have_column_titles_and_directions():
    # the metrics plugin's own (other built-in plugins, such as a known-answer corpus, add theirs)
    metrics = {name: reg for name, reg in get_registry().items["metric"].items() if reg.plugin == "metrics"}
    assert {name: reg.meta["display_name"] for name, reg in metrics.items()} == {
        "gen_ppl": "Gen.PPL", "gen_ppl_sample_mean": "Gen.PPL (mean)", "entropy": "Entropy",
        "diversity": "Diversity", "diversity_pooled": "Diversity (pooled)", "mauve": "MAUVE",
        "copied_8grams": "copied 8-grams",
    }
    # copied_8grams measures memorisation, which has no better direction
    assert {name: reg.meta["higher_is_better"] for name, reg in metrics.items()
            if not isinstance(reg.meta["higher_is_better"], bool)} == {"copied_8grams": None}


@pytest.mark.integration
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_builtin_backbone_parameter_counts_are_the_loaded_models(name):
    declared = get_registry().get("backbone", name).meta["parameters"]
    assert load_backbone(name).num_parameters() == declared


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
        "version": "1.2.3", "description": "std of the entries; lower is better",
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
