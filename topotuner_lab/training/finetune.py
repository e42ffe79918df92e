"""One entry point for full fine-tuning, LoRA (peft) and TopoTuner profile fine-tuning, on HF ``Trainer``.

:func:`run_finetune` runs the five steps of :mod:`topotuner_lab.training.recipe`: prepare, train, evaluate,
assemble (one :class:`~topotuner_lab.training.results.FinetuneResult`) and persist. Every run writes ``results.json``
(atomically, with a checksum) with accuracy, the train-test gap, forgetting (out-of-domain accuracy and held-out
perplexity before/after; None where ``n_ood`` / ``n_ppl`` is 0), trainable parameters, time per epoch, memory and
the seeds, and ``predictions.jsonl``: each test row's prediction and metrics. Checkpoints are saved each epoch, so a
stopped run resumes.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from topotuner_lab._io.errors import TopoTunerError
from topotuner_lab.training.recipe import assemble, evaluate, persist, prepare, train

if TYPE_CHECKING:
    from topotuner_lab.training.config import FinetuneConfig
    from topotuner_lab.training.results import FinetuneResult
    from topotuner_lab.weights.models import LoadedModel


class PeerProcessError(TopoTunerError):
    """Another process of a distributed (``accelerate launch``) run died or stopped answering."""


#: how gloo and NCCL report a peer that went away (killed, crashed, out of memory)
_PEER_LOST = re.compile(r"connection (?:reset|closed) by peer|broken pipe|socket timeout|gloo|nccl", re.IGNORECASE)


def _world() -> tuple[int, int] | None:
    """``(rank, world size)`` of this process when it is one of several in a process group, else None."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


@contextlib.contextmanager
def peer_loss_reported() -> Iterator[None]:
    """Turn a collective's failure after a peer process died into a :class:`PeerProcessError` (one line)."""
    try:
        yield
    except RuntimeError as exc:
        world = _world()
        if world is None or not _PEER_LOST.search(str(exc)):
            raise
        detail = re.sub(r"^\[[^\]]*\]\s*", "", str(exc).strip()).splitlines()[0].split(". ")[0][:160]
        raise PeerProcessError(
            f"rank {world[0]} of {world[1]}: a peer process of this distributed run died or stopped answering "
            f"({detail})",
            "see the other ranks' output for why it stopped (killed, out of memory), then run the same accelerate "
            "launch command again: it resumes from the last epoch checkpoint",
        ) from exc


def run_finetune(loaded: LoadedModel, cfg: FinetuneConfig) -> FinetuneResult:
    """Fine-tune ``loaded`` as ``cfg`` says; write ``results.json`` and ``predictions.jsonl`` into ``cfg.output_dir``.

    Five steps (:mod:`topotuner_lab.training.recipe`): prepare (rows, scorers, the pretrained model's scores, a
    trainer of a trainable copy), train, evaluate, assemble (one
    :class:`~topotuner_lab.training.results.FinetuneResult`) and persist. The input card is read, never rewritten:
    the task it was transferred to is recorded in the results (``transferred_to``), so several runs can share one
    card. A stopped run resumes from its last epoch checkpoint; a finished one removes its checkpoints unless
    ``keep_checkpoints``. Under ``accelerate launch`` every process trains and scores, the first writes.

    Parameters
    ----------
    loaded : LoadedModel
        The pretrained model (:func:`~topotuner_lab.weights.models.load_model`); it is copied, never changed.
    cfg : FinetuneConfig
        What to train: method, task, ``epochs``, example counts, ``learning_rate``, ``output_dir``...

    Returns
    -------
    FinetuneResult
        Accuracies (train, validation, test and per-example ``test_correct``), validation log-loss, forgetting
        (out-of-domain accuracy and perplexity before/after, with each text's NLL), trainable parameters and
        fraction, seconds per epoch, memory, the early-stopping record, the config and seeds;
        ``result.to_dict()`` is what ``results.json`` holds (less its checksum).

    Raises
    ------
    ParameterError
        A LoRA rank above the model's largest useful rank (before any data is read).
    ProfileError
        A card built for another model, or ``stop_threshold="card"`` with a card that records none.
    TaskError
        A task whose rows cannot be read.
    PeerProcessError
        Another process of a distributed run died or stopped answering.

    Examples
    --------
    A run takes tens of seconds even on the tiny random model (``"tiny-llama"``, most of it importing
    ``transformers``), longer than a doctest should; the call is shown, not run:

    >>> from topotuner_lab import FinetuneConfig, load_model, run_finetune
    >>> cfg = FinetuneConfig(method="lora", task="sst2", output_dir="runs/lora-sst2", epochs=1, n_train=64)
    >>> cfg.method, cfg.epochs, cfg.n_train
    ('lora', 1, 64)
    >>> result = run_finetune(load_model("tiny-llama"), cfg)  # doctest: +SKIP
    >>> result.to_dict()["test_accuracy"] == result.test_accuracy  # doctest: +SKIP
    True
    """
    run = prepare(loaded, cfg)
    with peer_loss_reported():
        memory = train(run)
        scores = evaluate(loaded, run)
    result = assemble(loaded, run, memory, scores)
    return persist(loaded, run, scores, result)
