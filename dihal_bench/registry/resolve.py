"""Names to built plugins: what a suite or a command names (a registered name, or a reference a
plugin handles) resolved through the registry and built by its factory. The contracts in
``dihal_bench.api`` never look names up; this module is where that happens."""

from __future__ import annotations

import torch

from dihal_bench.api.backbone import Backbone, BackboneShape
from dihal_bench.api.bridge import HiddenStateBridge
from dihal_bench.api.corpus import Corpus
from dihal_bench.errors import DihalError
from dihal_bench.registry.plugins import Registration, build_named, call_factory, get_registry


def load_backbone(name: str, **options) -> Backbone:
    """A registered backbone name, or a reference a backbone plugin handles (the built-in ``hf``
    takes any Hugging Face model id or local model directory). Its hidden states are checked
    on a few tokens (`dihal_bench.api.conformance.check_states`) before it is handed out."""
    from dihal_bench.api.conformance import check_states

    registration, arguments = get_registry().resolve("backbone", name)
    backbone = call_factory(registration, *arguments, **options)
    check_states(backbone, registration.source)
    return backbone


def load_evaluator(name: str, **options):
    """The model that scores and featurises a suite's samples (``dihal_bench.api.metrics.Evaluator``):
    what the backbone plugin's ``evaluator`` hook builds from the factory's arguments and ``options``
    where it declares one, else the backbone itself (`load_backbone`). **Why:** the metrics read only
    the logits and the final state, so a scorer need not be enterable midway; the built-in ``hf``
    hook also loads causal LMs a backbone cannot be, such as GPT-2, the field's Gen.PPL scorer. A
    hook that builds a backbone has it checked as `load_backbone` does."""
    from dataclasses import replace

    from dihal_bench.api.conformance import check_states

    registration, arguments = get_registry().resolve("backbone", name)
    hook = registration.meta.get("evaluator")
    if hook is None:
        return load_backbone(name, **options)
    evaluator = call_factory(replace(registration, obj=hook), *arguments, **options)
    missing = [attribute for attribute in ("tokenizer", "device", "logits_and_final_hidden", "final_hidden")
               if not hasattr(evaluator, attribute)]
    if missing:
        raise DihalError(f"backbone {registration.name!r} from {registration.source}: its evaluator hook built a "
                         f"{type(evaluator).__qualname__} without {', '.join(missing)}")
    if isinstance(evaluator, Backbone):
        check_states(evaluator, registration.source)
    return evaluator


def backbone_factory(name: str):
    """(the backbone factory, its positional arguments) for ``name``, without loading
    anything: what the pre-flight check of a suite calls to refuse an unknown backbone up front.
    See :meth:`dihal_bench.registry.plugins.Registry.resolve`."""
    registration, arguments = get_registry().resolve("backbone", name)
    return registration.obj, arguments


def describe_backbone(name: str) -> BackboneShape | None:
    """The depth and width of backbone ``name`` from its plugin's ``describe`` meta key, without
    loading weights; None when the plugin declares none or cannot say cheaply (the checks that
    need them then run after the load)."""
    registration, arguments = get_registry().resolve("backbone", name)
    described = _call_meta(registration, "describe", arguments)
    if described is None:
        return None
    layers = described.get("layers") if isinstance(described, dict) else None
    width = described.get("width") if isinstance(described, dict) else None
    if not (_positive_int(layers) and _positive_int(width)):
        raise DihalError(f"backbone {registration.name!r} from {registration.source}: describe returned "
                         f"{described!r}, not {{'layers': int >= 1, 'width': int >= 1}}")
    return BackboneShape(name, layers, width)


def backbone_tokenizer(name: str):
    """The tokenizer backbone ``name`` would carry, from its plugin's ``tokenizer`` meta key,
    without loading weights; None when the plugin declares none or cannot load it cheaply."""
    registration, arguments = get_registry().resolve("backbone", name)
    tokenizer = _call_meta(registration, "tokenizer", arguments)
    if tokenizer is not None and not callable(tokenizer):
        raise DihalError(f"backbone {registration.name!r} from {registration.source}: its tokenizer hook returned "
                         f"a {type(tokenizer).__qualname__}, not a callable Hugging Face tokenizer")
    return tokenizer


def backbone_parameters_declared(name: str) -> int | None:
    """The parameter count backbone ``name``'s plugin declares (its ``parameters`` meta key, a
    number or a callable of the factory's arguments), without loading weights; None when it
    declares none, cannot say, or no plugin takes the name."""
    try:
        registration, arguments = get_registry().resolve("backbone", name)
    except DihalError:
        return None
    declared = registration.meta.get("parameters")
    if callable(declared):
        declared = _call_meta(registration, "parameters", arguments)
    if declared is not None and not _positive_int(declared):
        raise DihalError(f"backbone {registration.name!r} from {registration.source}: parameters returned "
                         f"{declared!r}, not a positive int")
    return declared


def _call_meta(registration: Registration, key: str, arguments: tuple):
    """``registration.meta[key](*arguments)``, or None without that key; a plugin's exception
    other than DihalError becomes one line naming the plugin, as its factory's would."""
    hook = registration.meta.get(key)
    if hook is None:
        return None
    try:
        return hook(*arguments)
    except DihalError:
        raise
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise DihalError(f"backbone {registration.name!r} from {registration.source}: {key} failed: "
                         f"{type(exc).__name__}: {first}".rstrip(": ")) from exc


def _positive_int(value) -> bool:
    # bool is an int subclass; True layers is a plugin's bug, not 1
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def load_corpus(spec: str, **options) -> Corpus:
    """The corpus a user names: a registered name (``stdlib-docs``) or a reference a corpus
    plugin handles (the built-ins take a local .txt/.jsonl/.parquet file or directory of them,
    and ``hf:<dataset>[:<config>]`` for any `datasets` dataset)."""
    # through the registry's factory call, so a corpus plugin that raises is named in one line
    return build_named("corpus", spec, **options)


def corpus_factory(spec: str):
    """(the corpus factory, its positional arguments) for ``spec``, without loading anything:
    what the pre-flight check of a suite calls to refuse an unknown corpus up front. See
    :meth:`dihal_bench.registry.plugins.Registry.resolve`."""
    registration, args = get_registry().resolve("corpus", spec)
    return registration.obj, args


@torch.no_grad()
def build_bridge(name: str, *args, **options) -> HiddenStateBridge:
    """The registered bridge ``name`` built by its factory; registration only checks that the
    factory is callable, so what it returns is checked here."""
    registration = get_registry().get("bridge", name)
    bridge = registration.obj(*args, **options)
    if not isinstance(bridge, HiddenStateBridge):
        raise DihalError(f"bridge {name!r} ({registration.source}) built a {type(bridge).__qualname__}, "
                         "not a dihal_bench.api.bridge.HiddenStateBridge")
    return bridge

