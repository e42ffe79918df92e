"""Error types: every bad input names what was wrong and how to fix it."""

from __future__ import annotations


class TopoTunerError(Exception):
    """Base class of every user error: ``problem`` says what is wrong, ``fix`` what the user should do.

    The CLI prints both lines and exits without a traceback; notebooks and widgets show them in place.

    Parameters
    ----------
    problem : str
        What is wrong, naming the value, file or field.
    fix : str
        What to do about it (a command, a value to give).

    Attributes
    ----------
    problem, fix : str
        The two texts, as given; ``str(error)`` joins them.

    Examples
    --------
    >>> from topotuner_lab import TopoTunerError
    >>> print(TopoTunerError("budget 0 is not positive", "give a count >= 1"))
    budget 0 is not positive
      How to fix: give a count >= 1
    """

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}\n  How to fix: {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        """Pickle by ``(problem, fix)``, so an error raised in a worker process reaches the user intact."""
        return (self.__class__, (self.problem, self.fix))


class InputFileError(TopoTunerError):
    """A file is missing, unreadable or not of the expected kind.

    Examples
    --------
    >>> from topotuner_lab import InputFileError, load_snapshot
    >>> try:
    ...     load_snapshot("no-such-file.safetensors")
    ... except InputFileError as err:
    ...     print(err.problem)
    ...     print(err.fix)
    snapshot no-such-file.safetensors does not exist
    create it with `topotuner-lab extract MODEL -o FILE` (or check the path)
    """


class ModelLoadError(TopoTunerError):
    """A model could not be found, downloaded or loaded (a wrong name, a damaged file, missing tokenizer files).

    Examples
    --------
    >>> from topotuner_lab import ModelLoadError, load_model
    >>> try:
    ...     load_model("tiny-lama")
    ... except ModelLoadError as err:
    ...     print(err.problem, "|", err.fix)
    unknown model 'tiny-lama' | did you mean 'tiny-llama'? Known names: ...
    """


class UnsupportedArchitectureError(TopoTunerError):
    """The model's attention projections cannot be enumerated.

    Examples
    --------
    >>> import torch
    >>> from topotuner_lab import UnsupportedArchitectureError, extract_snapshot
    >>> try:
    ...     extract_snapshot(torch.nn.Sequential(torch.nn.Linear(4, 4)))
    ... except UnsupportedArchitectureError as err:
    ...     print(err.problem)
    ...     print(err.fix)
    architecture 'Sequential' is not supported for attention-projection enumeration
    use a model of a supported type: bert, electra, gemma, ...
    """


class SnapshotMismatchError(TopoTunerError):
    """Two snapshots (or a snapshot and a card) do not describe the same model.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import Snapshot, SnapshotMismatchError, drift_table
    >>> a = Snapshot({"L0.q": np.ones((3, 2), np.float32)}, "a", "a", "r0", "llama")
    >>> b = Snapshot({"L0.q": np.ones((4, 2), np.float32)}, "b", "a", "r0", "llama")
    >>> try:
    ...     drift_table(a, b)
    ... except SnapshotMismatchError as err:
    ...     print(err.problem, "|", err.fix)
    snapshots are of different models: ... shapes differ at ['L0.q'] ((3, 2) vs (4, 2)) | compare a pretrained ...
    """


class InvalidMatrixError(TopoTunerError):
    """A weight matrix cannot be turned into a point cloud (NaN/Inf, too few rows).

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import InvalidMatrixError, diagrams
    >>> try:
    ...     diagrams(np.array([[np.nan, 1.0], [0.0, 1.0]]))
    ... except InvalidMatrixError as err:
    ...     print(err.problem, "|", err.fix)
    matrix contains 1 NaN/Inf value(s) | the weights are corrupt or training diverged: re-extract the snapshot ...
    """


class ProfileError(TopoTunerError):
    """A profile card is invalid, or does not fit the model it is applied to.

    Examples
    --------
    >>> from topotuner_lab import CardSettings, ProfileError
    >>> try:
    ...     CardSettings(prior_task="sst2")  # no budget
    ... except ProfileError as err:
    ...     print(err.problem)
    card settings: give exactly one of count (matrices), budget fraction or per-kind counts
    """


class TaskError(TopoTunerError):
    """An unknown task, or a data file without the expected columns.

    Examples
    --------
    >>> from topotuner_lab import FinetuneConfig, TaskError
    >>> try:
    ...     FinetuneConfig(task="sst3")
    ... except TaskError as err:
    ...     print(err.problem, "|", err.fix)
    unknown task 'sst3' | use one of agnews, ..., sst2, xsum, or give the path of a task spec .yaml file
    """


class ParameterError(TopoTunerError):
    """A parameter (CLI option, notebook parameter) has the wrong type or value.

    Examples
    --------
    >>> from topotuner_lab import ParameterError, wasserstein
    >>> try:
    ...     wasserstein([[0.0, 1.0]], [[0.0, 2.0]], p=0.5)
    ... except ParameterError as err:
    ...     print(err.problem, "|", err.fix)
    Wasserstein order p=0.5 is not a finite number >= 1 | use p=1 or p=2 (bottleneck is a separate metric)
    """
