"""The noise-input control of the two-stage baselines (LD4LG, CoDAR): what their autoregressive
decoder reads at sampling, the reverse chain's output ("denoised") or the chain's starting draw
itself ("noise", no denoiser call), so that a row shows what the diffusion adds over the decoder
alone (docs/rivals.md#noise-input-controls).

``DecoderInputOption`` goes before the baseline's own class (it calls ``super()``); its option is
a sampling option, so a checkpoint of the row loads into its control and back. A control row is
``NoiseInputControl`` over its row, registered under ``<row>-noise-input``.
"""

from __future__ import annotations

from pathlib import Path

from dihal_bench.errors import DihalError

DECODER_INPUTS = ("denoised", "noise")
#: the suffix of a control row's name: ``ld4lg-noise-input`` is the control of ``ld4lg``
CONTROL_SUFFIX = "-noise-input"


class DecoderInputOption:
    """A baseline's ``decoder_input`` option, checked, reported and kept out of checkpoint matching."""

    name: str
    settings: object
    options: dict

    @property
    def row(self) -> str:
        """The row this model is trained as: its own name, or the one it is the control of."""
        return self.name.removesuffix(CONTROL_SUFFIX)

    @property
    def reads_noise(self) -> bool:
        return self.settings.decoder_input == "noise"

    def check_decoder_input(self) -> None:
        if self.settings.decoder_input not in DECODER_INPUTS:
            raise DihalError(f"{self.name}: decoder_input must be one of {', '.join(DECODER_INPUTS)}, "
                             f"got {self.settings.decoder_input!r}")

    def check_saved(self, saved: dict, directory: Path) -> None:
        """As the contract's, but ``decoder_input`` shapes sampling only and the noise-input control
        is this model trained the same way: a checkpoint of either row loads into either."""
        options = saved.get("options")
        if saved.get("name") in (self.row, self.row + CONTROL_SUFFIX) and isinstance(options, dict):
            options = {k: v for k, v in options.items() if k != "decoder_input"}
            options.update({k: v for k, v in self.options.items() if k == "decoder_input"})
            saved = {**saved, "name": self.name, "options": options}
        super().check_saved(saved, directory)

    def sampling_options(self) -> dict:
        return {**super().sampling_options(), "decoder_input": self.settings.decoder_input}


class NoiseInputControl:
    """A control row: its row's model trained the same way (same seed, same weights), sampled with
    ``decoder_input = "noise"`` only. A row of its own, because a suite lists baselines by name."""

    def __init__(self, *args, **options):
        super().__init__(*args, **options)
        if not self.reads_noise:
            raise DihalError(f"{self.name} is the noise-input control; for decoder_input = "
                             f"{self.settings.decoder_input!r} use {self.row}")
