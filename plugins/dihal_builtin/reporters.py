"""The built-in reporter: a finished run as a TensorBoard run (``dihal-bench run --report-to tensorboard``).

It writes one event file under ``<--out>/reports/tensorboard/<record stem>/`` (``tensorboard --logdir
runs/reports/tensorboard`` shows every run reported so): each metric value as a scalar at step 0,
tagged ``seed<seed>/<method>/<metric>`` and stored in double precision (the record's exact value);
the suite config in the HPARAMS tab (one column per dotted key: numbers as numbers, text as text,
anything else as its JSON), with the metrics as its metric columns; and, as text, the config as a
table and the record's and samples file's paths. It needs the ``tensorboard`` package (extra
``[tensorboard]``); without it a run that names this reporter stops before it starts.
"""

from __future__ import annotations

import json

from dihal_bench import hookimpl
from dihal_bench.errors import DihalError

INSTALL = "pip install 'dihal-bench[tensorboard]'"


def summary_writer():
    """``torch.utils.tensorboard.SummaryWriter``; DihalError naming the extra when it is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise DihalError(f"reporter 'tensorboard' needs the tensorboard package, which is not installed ({exc}); "
                         f"install the extra: {INSTALL}") from None
    return SummaryWriter


def check_tensorboard() -> None:
    summary_writer()


def hparam_value(value):
    """A value TensorBoard's HPARAMS tab holds: numbers and text as they are, anything else as JSON."""
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        return value
    return json.dumps(value)


def config_table(params: dict) -> str:
    """The config as a markdown table (TensorBoard's text tab renders it)."""
    rows = [f"| `{key}` | `{json.dumps(value)}` |" for key, value in params.items()]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def report_tensorboard(report) -> None:
    """Write ``report`` (a dihal_bench.study.reporting.RunReport) as one TensorBoard run."""
    writer_class = summary_writer()
    from torch.utils.tensorboard.summary import hparams

    logdir = report.out_dir / report.record_path.stem
    with writer_class(log_dir=str(logdir)) as writer:
        for summary in hparams({key: hparam_value(value) for key, value in report.params.items()},
                               dict(report.metrics)):
            writer.file_writer.add_summary(summary)
        for tag, value in report.metrics.items():
            writer.add_scalar(tag, float(value), global_step=0, new_style=True, double_precision=True)
        writer.add_text("config", config_table(report.params))
        for name, path in report.artifacts.items():
            writer.add_text(name, f"`{path}`")


@hookimpl
def register_reporters(register):
    register("tensorboard", report_tensorboard, check=check_tensorboard,
             description=f"a TensorBoard run per record under <--out>/reports/tensorboard (needs {INSTALL})")
