"""The plugin contract: one hook per kind of plugin, each handed a ``register`` callback.

A plugin module implements any subset of these with ``@dihal_bench.hookimpl`` and calls
``register(name, obj, **meta)`` once per thing it contributes. The built-in plugins in
``plugins/dihal_builtin`` use exactly this contract and are found through the same
``dihal_bench`` entry-point group as third-party packages.
"""

import pluggy

hookspec = pluggy.HookspecMarker("dihal_bench")


@hookspec
def register_backbones(register):
    """Register backbone factories: ``register(name, factory, description=...)``.

    ``factory(device="cpu", dtype="float32", **options) -> dihal_bench.backbone.Backbone``.
    """


@hookspec
def register_corpora(register):
    """Register corpus factories: ``register(name, factory, description=...)``.

    ``factory(**options) -> dihal_bench.corpus.Corpus``.
    """


@hookspec
def register_proxies(register):
    """Register geometry proxies: ``register(name, fn, higher_is_better=True)``.

    ``fn(hidden: torch.Tensor, **params) -> float`` takes an (N, d) float tensor of one
    layer's preprocessed hidden states. Keyword parameters with defaults are the proxy's
    constants; the harness records them and may override them. A parameter named ``seed``
    receives the run's seed.
    """


@hookspec
def register_bridges(register):
    """Register hidden-state bridges: ``register(name, factory, description=...)``.

    ``factory(width: int, **options) -> torch.nn.Module`` implementing the bridge
    contract in ``dihal_bench.bridge``.
    """


@hookspec
def register_baselines(register):
    """Register baselines (text generators trained under a Budget): ``register(name, factory, ...)``."""


@hookspec
def register_metrics(register):
    """Register metrics: ``register(name, fn, description=..., higher_is_better=...)``."""


@hookspec
def register_suites(register):
    """Register suites: ``register(name, path_to_toml_file, description=...)``."""
