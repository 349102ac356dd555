"""Time a suite on a machine the embedded weights cannot reach, with random-weight checkpoints of
the embedded models' exact shapes and tokenizers.

A GPU machine reached through a transfer limit (the device machine here takes 64 MiB a call) cannot
receive the 98 MB SmolLM2 and 253 MB Gemma-3 GGUF files, but a model's cost depends on its shapes,
not on its values. `export` writes each embedded model's config and tokenizer (a few MB, here);
`build` gives them random weights (there); the suite then runs on the two directories as local
Hugging Face checkpoints, its estimate and its job times real, its samples and scores noise;
`times` sums a job store's finished jobs by kind.

    python benchmarks/gpu_shapes.py export shapes/                  # here
    python benchmarks/gpu_shapes.py build shapes/ /tmp/models        # there
    dihal-bench run --suite diagnostic --seeds 1 --backbone /tmp/models/smollm2-135m \\
        --evaluator /tmp/models/gemma3-270m --out /tmp/store --dry-run --calibrate
    python benchmarks/gpu_shapes.py times /tmp/store
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from dihal_bench.study.jobs import RESULT

EMBEDDED = ("smollm2-135m", "gemma3-270m")


def export(folder: Path) -> None:
    from dihal_bench.registry.resolve import load_backbone

    for name in EMBEDDED:
        backbone = load_backbone(name)
        backbone.model.config.save_pretrained(folder / name)
        backbone.tokenizer.save_pretrained(folder / name)
        print(f"{name}: config and tokenizer in {folder / name}")


def build(folder: Path, out: Path) -> None:
    for name in EMBEDDED:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder / name), dtype=torch.float32)
        shutil.copytree(folder / name, out / name, dirs_exist_ok=True)
        model.save_pretrained(out / name)
        print(f"{name}: {model.num_parameters():,} random parameters in {out / name}")


def times(store: Path) -> dict:
    """Per job kind: how many finished and the sum of their ``seconds`` (each job's own
    result file), with the span from the first to the last one's finishing time."""
    results = [(path.stat().st_mtime, json.loads(path.read_text())) for path in store.rglob(RESULT)]
    kinds: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "seconds": 0.0})
    for _, result in results:
        kinds[result["kind"]]["jobs"] += 1
        kinds[result["kind"]]["seconds"] += result.get("seconds") or 0.0
    finished = sorted(mtime for mtime, _ in results)
    return {"kinds": dict(kinds), "span_s": finished[-1] - finished[0] if finished else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("export").add_argument("folder", type=Path)
    built = commands.add_parser("build")
    built.add_argument("folder", type=Path)
    built.add_argument("out", type=Path)
    commands.add_parser("times").add_argument("store", type=Path)
    args = parser.parse_args()
    if args.command == "export":
        export(args.folder)
    elif args.command == "build":
        build(args.folder, args.out)
    else:
        print(json.dumps(times(args.store), indent=1))


if __name__ == "__main__":
    main()
