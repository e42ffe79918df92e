"""Error types: every bad input names what was wrong and how to fix it."""

from __future__ import annotations


class TopoTunerError(Exception):
    """Base class. ``problem`` says what is wrong, ``fix`` what the user should do."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  How to fix: {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Pickle by ``(problem, fix)``, so an error raised in a worker process reaches the user intact."""
        return (self.__class__, (self.problem, self.fix))


class InputFileError(TopoTunerError):
    """A file is missing, unreadable or not of the expected kind."""


class ModelLoadError(TopoTunerError):
    """A model could not be found, downloaded or loaded (a wrong name, a damaged file, missing tokenizer files)."""


class UnsupportedArchitectureError(TopoTunerError):
    """The model's attention projections cannot be enumerated."""


class SnapshotMismatchError(TopoTunerError):
    """Two snapshots (or a snapshot and a card) do not describe the same model."""


class InvalidMatrixError(TopoTunerError):
    """A weight matrix cannot be turned into a point cloud (NaN/Inf, too few rows)."""


class ProfileError(TopoTunerError):
    """A profile card is invalid, or does not fit the model it is applied to."""


class TaskError(TopoTunerError):
    """An unknown task, or a data file without the expected columns."""


class ParameterError(TopoTunerError):
    """A parameter (CLI option, notebook parameter) has the wrong type or value."""
