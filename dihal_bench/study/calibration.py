"""The estimate's rates measured on this machine (``run --calibrate``, ``run --dry-run --calibrate``):
a few timed forwards, decodes and training steps of the suite's own models, each baseline's step and
decode, a bridge's evaluation, a store of hidden states and locate's proxies on one layer, in seconds
(minutes on a suite with LoRA rows, whose decode runs the whole backbone). Without it the estimate
uses the assumed rates of ``dihal_bench.study.estimate``."""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from dihal_bench.base.timing import WARM_UP_TOKENS, fastest, seconds, timed_rate
from dihal_bench.config.settings import SuiteConfig
from dihal_bench.study.baseline_calibration import baseline_timings
from dihal_bench.study.estimate import (
    Throughput,
    assumed_throughput,
    backbone_parameters,
)
from dihal_bench.training.budget import Budget

#: steps of the timed bridge training: a few, so that the calibration takes seconds; the shapes are
#: the suite's own, since a rate depends on them
CALIBRATION_STEPS = 3
#: windows of the timed bridge evaluation and of the timed extraction and store of bridge targets:
#: enough that a pass runs at the batch sizes the jobs use
CALIBRATION_EVAL_WINDOWS = 16
#: the targets job and locate's proxies are timed this many times and the fastest taken: each is a
#: second or two, and one timing of it moved by a factor of 2.6 (targets) and 1.7 (proxies) between two
#: diagnostic runs on the same machine (benchmarks/results/eta_record.json), where their stages did not
REPEATS = 3
#: windows of the timed extraction of bridge targets (the job's forward passes, nothing written)
EXTRACTION_WINDOWS = 64
#: the largest file the store's write is timed on: a targets job writes one file per kept layer,
#: hundreds of MiB each on the diagnostic suite, and a disk writes a small file several times faster
#: per byte than a large one (9 MiB at 481 MB/s, 236 MiB at 243 MB/s, fsynced, one disk of this
#: machine), since its small writes end in the page cache
STORE_PROBE_BYTES = 256 * 2**20


def calibrate(config: SuiteConfig, backbone, evaluator, seed: int = 0, sequences=None,
              store: Path | None = None) -> Throughput:
    """Each kind of :class:`Work`'s rate measured on the loaded models in seconds: a forward pass
    of the backbone and of the evaluator, a decode of one sampling batch and of one sequence by a
    hybrid of the suite's bridge at the first layer with the suite's sample steps (what DiHAL's rows
    sample with), a few training steps of that bridge through the one training loop, its validation
    measures at the middle layer (:func:`evaluate_layer`), the extraction of bridge targets and their
    store (written under ``store``, the run's job store, or the nearest folder of it that exists),
    and locate's proxies on one layer. Forwards run one
    batch of the suite's training budget (the shape of the targets and evaluation passes). Each is
    timed after a warm-up call, which pays for lazy setup. Each baseline of the suite is timed by
    the step through its own ``fit`` and by its decode of one sampling batch and of one sequence
    (:func:`~dihal_bench.study.baseline_calibration.baseline_timings`), trained on ``sequences``
    (the run's training windows) or random ids."""
    import torch

    from dihal_bench.hybrid.model import HybridLM
    from dihal_bench.study.protocol import bridge_spec

    generator = torch.Generator().manual_seed(seed)
    shape = Budget.from_dict(config.budget)
    ids = torch.randint(backbone.vocab_size, (shape.batch_size, shape.seq_len), generator=generator)

    def forward_rate(model) -> float:
        ids_of = ids.remainder(model.vocab_size).to(model.device)
        with torch.no_grad():
            return timed_rate(lambda: model.logits(ids_of), ids_of.numel(), model.device)

    spec = bridge_spec(config, "budget", seed)
    layer = max(1, backbone.num_layers // 2)
    torch.manual_seed(seed)
    bridge = spec.build(backbone.width).to(backbone.device)
    # a hybrid decodes through the upper stack, so the first layer's is the costliest decode; the
    # layers DiHAL and the oracle pick are unknown until locate and the sweep have run, and shallow
    # on the built-in backbones (3 and 1 on SmolLM2-135M in every diagnostic seed); diagnostic seed 4's
    # calibration at the middle layer decoded 1.3 times faster than its latency job's DiHAL at layer 3
    hybrid = HybridLM(backbone, bridge, 1, sink_passthrough=spec.sink_passthrough, steps=spec.sample_steps)
    rows, length = config.sampling.batch_size, config.sampling.seq_len
    # the whole sequence: a hybrid's decode step costs more the longer its prefix
    decode = timed_rate(lambda: hybrid.generate(rows, length, seed=seed, batch_size=rows), rows * length,
                         backbone.device,
                         warm_up=lambda: hybrid.generate(rows, WARM_UP_TOKENS, seed=seed, batch_size=rows))
    single = seconds(lambda: hybrid.generate(1, length, seed=seed, batch_size=1), backbone.device)
    windows = torch.randint(backbone.vocab_size, (EXTRACTION_WINDOWS, shape.seq_len), generator=generator)
    return Throughput(forward=forward_rate(backbone), decode=decode,
                      evaluator=_scoring_rate(config, backbone, evaluator, ids if sequences is None else sequences),
                      trained=_training_rate(spec, backbone.width, backbone.device, seed),
                      source=f"measured on this machine ({backbone.device}, {config.dtype})",
                      baselines=baseline_timings(config, backbone, seed, sequences),
                      evaluated=_evaluation_rate(backbone, bridge, layer, spec, windows[:CALIBRATION_EVAL_WINDOWS]),
                      extracted=_extraction_rate(config, backbone, windows, store),
                      proxy_seconds=_proxy_seconds(config, backbone, seed), single_decode=single)


def _scoring_rate(config: SuiteConfig, backbone, evaluator, windows) -> float:
    """Backbone tokens per second of a metrics job's evaluator pass (``evaluate_texts``: the text
    re-tokenised, scored and featurised at every position, the log-softmax over the evaluator's
    whole vocabulary) on texts of the suite's sample length decoded from ``windows``: a bare
    forward of as many tokens ran 1.7 times faster (Gemma-3-270M, whose head is 262k wide, one
    thread of a 2-core CPU), so a forward's rate overstates what a metrics job scores per second by that much."""
    from dihal_bench.api.metrics import evaluate_texts

    length = config.sampling.seq_len
    texts = [backbone.tokenizer.decode(row[:length].tolist()) for row in windows[:CALIBRATION_EVAL_WINDOWS]]

    def score(batch: list[str]) -> None:
        evaluate_texts(evaluator, batch, max_length=config.metrics.max_length)

    return timed_rate(lambda: score(texts), len(texts) * length, evaluator.device, warm_up=lambda: score(texts[:2]))


def _evaluation_rate(backbone, bridge, layer: int, spec, windows) -> float:
    """Tokens per second of a bridge's validation measures (bridgeability, the hybrid's and the skip
    control's perplexity, KL to the backbone) on ``windows``, at ``layer`` (the middle one: the
    upper stack costs the swept layers' average)."""
    from dihal_bench.hybrid.training import evaluate_layer, with_states

    valid = with_states(backbone, windows, [layer], progress=False)
    return timed_rate(lambda: evaluate_layer(backbone, bridge, layer, spec, valid), windows.numel(), backbone.device)


def _extraction_rate(config: SuiteConfig, backbone, windows, store: Path | None) -> float:
    """Tokens per second of a bridge-targets job: the forward passes over ``windows`` that keep as
    many layers' states as the suite's job keeps (every swept layer and the embedding output), the
    deepest of them (the worst-scored layer a suite sweeps is usually deep), and the bytes each
    token adds to the store at the seconds per byte of :func:`_store_seconds_per_byte`."""
    from dihal_bench.hybrid.training import with_states
    from dihal_bench.study.plan import sweep_size, target_budgets

    kept = max(sweep_size(config, backbone.num_layers), 1)
    layers = list(range(backbone.num_layers - kept, backbone.num_layers))
    computed = timed_rate(lambda: with_states(backbone, windows, layers, progress=False), windows.numel(),
                          backbone.device, repeats=REPEATS)
    per_token = (kept + 1) * backbone.width * 4  # float32 states of the kept layers and the embedding output
    windows_stored = max((b.distinct_sequences * b.seq_len for b in target_budgets(config)), default=0)
    seconds_per_byte = _store_seconds_per_byte(min(windows_stored * backbone.width * 4, STORE_PROBE_BYTES), store)
    return 1.0 / (1.0 / computed + per_token * seconds_per_byte)


def _store_seconds_per_byte(size: int, store: Path | None) -> float:
    """Seconds per byte of writing a file of ``size`` bytes as the job store writes its results
    (atomically, synced to disk) and hashing it (``result.json``'s sha256), the fastest of two, in
    ``store`` or the nearest folder of it that exists (nothing is left there)."""
    import torch

    from dihal_bench.base.files import file_sha256, write_safetensors_atomic

    folder = Path(store) if store is not None else Path(tempfile.gettempdir())
    while not folder.is_dir():
        folder = folder.parent
    states = torch.zeros(max(size // 4, 1))
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        target = Path(scratch) / "states.safetensors"

        def write_and_hash() -> None:
            write_safetensors_atomic(target, {"states": states})
            file_sha256(target)

        return fastest(write_and_hash, 2) / max(size, 1)


def _proxy_seconds(config: SuiteConfig, backbone, seed: int) -> float:
    """Seconds of locate's proxies over every candidate layer: every proxy it measures, in every
    preprocessing, timed on one layer of Gaussian states of its sample's size (a proxy's cost
    depends on the shape, not the values), the fastest of ``REPEATS`` timings, and multiplied by the
    candidate layers."""
    import torch

    from dihal_bench.locate.pipeline import (
        check_variants,
        layer_geometry,
        measured_proxies,
    )
    from dihal_bench.study.stages.locate import locate_config

    located = locate_config(config.locate, seed)
    selected, measured = measured_proxies(located)
    hidden = {1: torch.randn(located.tokens, backbone.width, generator=torch.Generator().manual_seed(seed))}
    variants = check_variants(located.variants)
    seconds = fastest(lambda: layer_geometry(hidden, located, selected, measured, variants), REPEATS)
    return seconds * (backbone.num_layers - 1)


def _training_rate(spec, width: int, device, seed: int) -> float:
    """Tokens per second of ``spec``'s bridge trained by the one training loop on random states
    (a step's cost does not depend on the values)."""
    import torch

    from dihal_bench.api.bridge import training_loss
    from dihal_bench.training.loop import train

    budget = replace(spec.budget, steps=CALIBRATION_STEPS, epochs=1, checkpoint_every=CALIBRATION_STEPS)
    generator = torch.Generator().manual_seed(seed)
    shape = (budget.batch_size * CALIBRATION_STEPS, budget.seq_len, width)
    cond, target = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
    mask = torch.ones(shape[:2], dtype=torch.bool)
    torch.manual_seed(seed)
    bridge = spec.build(width).to(device)
    bridge.fit_standardizer(cond, target, mask)
    data = {"cond": cond, "target": target, "mask": mask}

    def run(steps: int) -> None:
        train(bridge, training_loss, data, replace(budget, steps=steps), progress=False)

    return timed_rate(lambda: run(CALIBRATION_STEPS), CALIBRATION_STEPS * budget.tokens_per_step, device,
                       warm_up=lambda: run(1))


def calibrate_run(run) -> Throughput:
    """:func:`calibrate` on a loaded run: its models, its first seed's training windows for the
    baselines' steps, and its job store for the store's writes."""
    from dihal_bench.study.protocol import matched_budget

    seed = run.config.seeds[0]
    windows = run.train_sequences(matched_budget(run.config, seed, run.backbone.width), seed)
    return calibrate(run.config, run.backbone, run.evaluator, seed=seed, sequences=windows, store=run.store.root)


def run_throughput(run, calibrated: bool) -> Throughput:
    """The rates a run's estimate and progress bar use: measured on the run's own models when asked
    (``calibrated``), else the assumed ones."""
    if calibrated:
        return calibrate_run(run)
    params = backbone_parameters(run.config.backbone) or float(run.backbone.num_parameters())
    return assumed_throughput(run.config, params)
