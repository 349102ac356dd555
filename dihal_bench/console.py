"""The ``dihal-bench`` program (and ``python -m dihal_bench``): the command line, with a Ctrl-C
that lands before the commands are loaded, or after one has finished, ending it as quietly as
one that lands during a command (``Interrupted.``, exit 130) instead of with a traceback."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    try:
        from dihal_bench.cli import cli  # torch, transformers and pandas: a second or more
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        sys.exit(130)
    try:
        cli(prog_name="dihal-bench")
    finally:
        # the exit handlers that run next (a library's clean-up) would print a late SIGINT's traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)
