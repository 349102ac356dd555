"""The plugin contract: one hook per kind of plugin, each handed a ``register`` callback.

A plugin module implements any subset of these with ``@dihal_bench.hookimpl`` and calls
``register(name, obj, **meta)`` once per thing it contributes. The built-in plugins (the
repository's ``plugins/`` folder) use exactly this contract and are found through the same
``dihal_bench`` entry-point group as third-party packages.

Every call is checked against its kind's rules (``dihal_bench.registry.plugins.META_RULES`` for the
meta keys, ``OBJECT_CHECKS`` for ``obj``) as it is made: an unknown or mistyped meta key, a missing required
one or an ``obj`` of the wrong shape makes that plugin's hook fail as a whole, and
``dihal-bench plugins`` lists it as a failure while everything else loads. ``description`` is
accepted by every kind: one line for ``dihal-bench plugins``. docs/plugins.md has an example
of each hook.
"""

import pluggy

hookspec = pluggy.HookspecMarker("dihal_bench")


@hookspec
def register_backbones(register):
    """Register backbone factories: ``register(name, factory, description=..., handles=..., parameters=...)``.

    ``factory(device="cpu", dtype="float32", **options) -> dihal_bench.api.backbone.Backbone``.

    ``handles`` (optional): ``handles(reference: str) -> bool``, true for the references this
    factory can load besides its registered name (the built-in ``hf`` takes local model
    directories and ``org/name`` hub ids). A reference that is no registered name goes to the
    one registration whose ``handles`` accepts it, as ``factory(reference, device=..., ...)``;
    two that accept it are an error.
    ``parameters`` (optional): the backbone's parameter count, a positive int, which
    ``run --dry-run`` uses to estimate memory and time without loading the model.
    """


@hookspec
def register_corpora(register):
    """Register corpus factories: ``register(name, factory, description=..., handles=...)``.

    ``factory(**options) -> dihal_bench.api.corpus.Corpus``. ``handles`` (optional) works as for
    backbones: ``handles(reference) -> bool``, and an accepted reference is loaded as
    ``factory(reference, **options)`` (the built-in ``files`` takes paths, ``hf-dataset``
    takes ``hf:<dataset>[:<config>]``).
    """


@hookspec
def register_proxies(register):
    """Register geometry proxies: ``register(name, fn, higher_is_better=..., description=...)``.

    ``fn(hidden: torch.Tensor, **params) -> float`` takes an (N, d) float tensor of one
    layer's preprocessed hidden states as its first positional parameter. Every other
    parameter has a default: these are the proxy's constants, which the harness records and
    may override. A parameter named ``seed`` receives the run's seed.
    ``higher_is_better`` (required, bool): whether a larger value marks a layer as a better
    place for the bridge; locate ranks layers by it.
    """


@hookspec
def register_bridges(register):
    """Register hidden-state bridges: ``register(name, factory, description=...)``.

    ``factory(width: int, **options) -> dihal_bench.api.bridge.HiddenStateBridge``, usually the
    subclass itself; ``options`` come from the suite's ``[bridge]`` table.
    """


@hookspec
def register_baselines(register):
    """Register baselines: ``register(name, cls, description=...)``.

    ``cls`` is a concrete subclass of ``dihal_bench.api.baseline.Baseline`` (the class itself, not
    a factory) whose ``name`` attribute equals the registered ``name``: the runner builds it as
    ``cls(backbone, budget, seed, **options)`` and reads class attributes such as
    ``steps_option`` before it builds one.
    """


@hookspec
def register_metrics(register):
    """Register metrics: ``register(name, fn, higher_is_better=..., display_name=..., description=...)``.

    ``fn(samples, ctx) -> dict`` scores one method's generations (``dihal_bench.api.metrics``
    holds the contract; the built-in metrics are examples) and returns its value under ``name``.
    ``higher_is_better``: True, False, or None for a metric that has no better direction;
    ``display_name``: a short column title for leaderboards, such as ``"Gen.PPL"``;
    ``reads_evaluator``: False for a metric that never runs the evaluator model (entropy, n-gram
    counts), so that the dry run and the FLOP count price no evaluator pass for it (default True).
    """


@hookspec
def register_suites(register):
    """Register suites: ``register(name, path, description=...)``, where ``path`` (a ``str`` or
    ``pathlib.Path``) is an existing TOML suite file."""


@hookspec
def register_reporters(register):
    """Register run reporters (trackers): ``register(name, fn, description=..., check=...)``.

    ``fn(report: dihal_bench.study.reporting.RunReport) -> None`` is called once per run that names
    it (``dihal-bench run --report-to NAME``, repeatable; none by default), after the run's record
    and its samples file are written. ``report`` holds ``record_path`` and ``record`` (the sealed
    record as written), ``params`` (the resolved suite config flattened to dotted keys,
    ``"budget.steps": 6``), ``metrics`` (every numeric metric value of every seed and method,
    ``"seed1/dihal-chosen/gen_ppl": 31.2``), ``artifacts`` (``"record"``, and ``"samples"`` where
    ``<record stem>.samples.jsonl`` is beside it) and ``out_dir`` (``<--out>/reports/<name>``, not
    yet created: where a reporter that writes files puts them). A reporter that raises loses
    nothing: the record stays, and the error is one warning line naming the reporter.
    ``check`` (optional): ``check() -> None``, raising ``DihalError`` when the reporter cannot run
    on this machine (a missing package; say which extra to install): called before the run starts.
    """
