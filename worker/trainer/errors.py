"""Errors a training run ends with, each with a kind the runner and users can act on."""

from __future__ import annotations


class TrainerError(Exception):
    """A run that cannot go on; `kind` says why in one word, the message in words."""

    kind = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SpecFileError(TrainerError):
    """The spec file is missing, unreadable or invalid."""

    kind = "spec"


class DatasetError(TrainerError):
    """The dataset cannot be found or read, or does not fit the model."""

    kind = "dataset"


class ModelError(TrainerError):
    """The model cannot be found or built."""

    kind = "model"


class DeviceError(TrainerError):
    """The devices asked for cannot be set up (missing GPUs, bad memory settings)."""

    kind = "device"


class NanLossError(TrainerError):
    """The loss became NaN or infinite."""

    kind = "nan_loss"


class OutOfMemoryError(TrainerError):
    """A device ran out of memory."""

    kind = "oom"
