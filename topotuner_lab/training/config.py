"""What a fine-tune trains and how (:class:`FinetuneConfig`).

The config is recorded verbatim in a run's results, and its fields are the options of ``topotuner-lab finetune``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from topotuner_lab._io.config import NON_NEGATIVE_INT, OPEN_UNIT, POSITIVE_INT, Check, Config, is_int, opt, optional
from topotuner_lab.tasks.registry import TASKS, get_task

#: ``spectrum-top5``: Spectrum's top 5% of every weight type, the embeddings and the head (training.spectrum)
Method = Literal["full", "lora", "profile", "spectrum-top5"]
#: untuned defaults, recorded in results; Spectrum at full fine-tuning's rate, as the authors ran it
DEFAULT_LR = {"full": 3e-5, "lora": 3e-4, "profile": 2e-4, "spectrum-top5": 3e-5}
LrScheduler = Literal["linear", "constant", "cosine"]
#: training precisions: float32, or bfloat16 / float16 mixed precision (float32 weights, autocast compute)
Precision = Literal["fp32", "bf16", "fp16"]

TEXT = Check(lambda v: isinstance(v, str) and v != "", "a non-empty string")
FLAG = Check(lambda v: isinstance(v, bool), "True or False")
LORA_RANK = Check(lambda v: v == "match" or (is_int(v) and v >= 1), "a whole number >= 1, or 'match'")
THRESHOLD = Check(lambda v: v is None or v == "card" or OPEN_UNIT(v), "a number in (0, 1), 'card' or None")
DATA_SOURCE = Check(
    lambda v: v is None or v == "hub" or (isinstance(v, str) and Path(v).is_dir()),
    "None (the offline copies, else each spec's hub dataset), 'hub', or an existing data folder laid out like "
    "shared/data",
)


def _rank(text: str) -> int | str:
    """A LoRA rank on the command line: an integer, else the text (then the field's check names the problem)."""
    try:
        return int(text)
    except ValueError:
        return text


def _threshold(text: str) -> float | str:
    """A stopping threshold on the command line: a number, else the text ('card', or what the check refuses)."""
    try:
        return float(text)
    except ValueError:
        return text


@dataclass(frozen=True)
class FinetuneConfig(Config):
    """What to train and how; recorded verbatim in the results. The CLI's ``finetune`` options are these fields.

    Parameters
    ----------
    method : {"full", "lora", "profile", "spectrum-top5"}
        Full fine-tuning, LoRA (peft), the matrices a card selects, or Spectrum's top 5 percent.
    task : str, default "sst2"
        The task to train and test on: a built-in name or a task spec ``.yaml``.
    output_dir : str, default "runs/finetune"
        The run folder (``results.json``, checkpoints while training).
    profile : str or None
        A card ``.json``: the matrices ``method="profile"`` trains; ``lora_rank="match"`` and
        ``stop_threshold="card"`` read it too.
    lora_rank : int or "match"
        LoRA rank, or the rank whose parameter count matches the card's.
    epochs : int, default 3
        Epoch budget.
    n_train, n_val, n_test : int
        Training rows drawn (128), validation rows carved from the training data (0: none; never the test set), and
        test rows drawn (128).
    n_ood : int, default 64
        Out-of-domain rows per forgetting task; 0: no forgetting battery.
    ood_tasks : tuple of str
        The forgetting battery's tasks (empty: the default other task).
    n_ppl : int, default 32
        Held-out texts for perplexity before and after; 0: no perplexity probe.
    batch_size, max_length : int
        Training batch size (8) and tokens per example, prompt and target (64).
    num_fewshot : int or None
        Few-shot examples before each scored prompt (None: each task spec's own).
    learning_rate : float or None
        Peak learning rate in (0, 1); None: the method's untuned default (``DEFAULT_LR``).
    lr_scheduler : {"linear", "constant", "cosine"}
        Learning-rate schedule over the epoch budget.
    precision : {"fp32", "bf16", "fp16"}
        float32, or bfloat16 / float16 mixed precision (float32 weights).
    gradient_checkpointing : bool, default False
        Recompute activations in the backward pass: less memory for more compute.
    seed, data_seed : int
        The training seed, and the seed of which rows are drawn and their order.
    stop_threshold : float, "card" or None
        Topological early stopping on normalized drift, in (0, 1), or the card's own threshold; None: off.
    observe_only : bool, default False
        Record the stop epoch but train the whole budget.
    eval_each_epoch : bool, default False
        Test accuracy after every epoch.
    save_checkpoints, keep_checkpoints : bool
        Checkpoint each epoch so a stopped run resumes (True), and keep the last one after a finished run (False).
    save_snapshot, save_epoch_snapshots : bool
        Write the fine-tuned attention matrices (``after.safetensors``), and after every epoch too (both False).
    confirm_run_unsafe_code : bool, default False
        Where no sandbox can run, run code tasks' generated programs with resource limits only.
    data_source : str or None
        None: the offline copies (else each spec's hub dataset); ``"hub"``; or a data folder laid out like
        ``shared/data``.

    Raises
    ------
    ParameterError
        A field out of its range or choices, or a method or option that needs a card without ``profile``.
    TaskError
        An unknown task or forgetting task.

    See Also
    --------
    run_finetune : runs a config.

    Examples
    --------
    >>> from topotuner_lab import FinetuneConfig
    >>> cfg = FinetuneConfig(method="lora", task="sst2", epochs=1, output_dir="runs/lora")
    >>> cfg.lora_rank, cfg.learning_rate, cfg.n_train
    (8, None, 128)
    >>> FinetuneConfig.from_dict(cfg.to_dict()) == cfg
    True
    >>> FinetuneConfig(method="profile")
    Traceback (most recent call last):
    topotuner_lab._io.errors.ParameterError: fine-tune config: method 'profile' needs a profile card
      How to fix: pass ...
    """

    label = "fine-tune config"

    method: Method = opt(
        "full",
        "full fine-tuning, LoRA (peft), the matrices a card selects (profile), or Spectrum's top 5 percent "
        "(spectrum-top5)",
    )
    task: str = opt("sst2", f"task to train and test on: {', '.join(TASKS)}, or a task spec .yaml", check=TEXT)
    output_dir: str = opt(
        "runs/finetune",
        "run folder: results.json, checkpoints while training",
        check=TEXT,
        flags=("-o", "--output", "--output-dir"),
    )
    profile: str | None = opt(
        None,
        "card .json from `topotuner-lab profile`: the matrices method profile trains; LoRA rank 'match' and stop "
        "threshold 'card' read it too",
        check=optional(TEXT),
    )
    lora_rank: int | str = opt(
        8,
        "LoRA rank: an integer >= 1, or 'match' for the rank whose parameter count matches the card",
        check=LORA_RANK,
        parse=_rank,
    )
    epochs: int = opt(3, "epochs to train (topological early stopping may end sooner)", check=POSITIVE_INT)
    n_train: int = opt(128, "training examples drawn", check=POSITIVE_INT)
    n_val: int = opt(
        0, "validation examples carved from the training data (never the test set); 0: none", check=NON_NEGATIVE_INT
    )
    n_test: int = opt(128, "test examples drawn", check=POSITIVE_INT)
    n_ood: int = opt(
        64,
        "out-of-domain examples (the other task) for forgetting; 0: no forgetting battery",
        check=NON_NEGATIVE_INT,
    )
    ood_tasks: tuple[str, ...] = opt(
        (),
        "the forgetting battery: tasks (built-in names or spec files) scored before and after fine-tuning on n_ood "
        "rows each, each on its own metric (empty: one other task, agnews for an sst2 run, sst2 for any other)",
        check=Check(lambda v: isinstance(v, tuple) and all(isinstance(t, str) and t for t in v), "task names"),
    )
    n_ppl: int = opt(
        32,
        "held-out texts (GSM8K test questions) for perplexity before and after; 0: no perplexity probe",
        check=NON_NEGATIVE_INT,
    )
    batch_size: int = opt(8, "training batch size", check=POSITIVE_INT)
    max_length: int = opt(64, "tokens per example (prompt + target)", check=POSITIVE_INT)
    num_fewshot: int | None = opt(
        None,
        "few-shot examples (the task's fewshot_split, default train, drawn with a fixed seed) before each scored "
        "prompt: test, validation and the forgetting battery; training rows stay zero-shot (left out: each "
        "task spec's num_fewshot, 0 unless it says)",
        check=optional(NON_NEGATIVE_INT),
    )
    learning_rate: float | None = opt(
        None,
        "peak learning rate; default per method, untuned: "
        + ", ".join(f"{method} {rate:g}" for method, rate in DEFAULT_LR.items()),
        check=optional(OPEN_UNIT),
        flags=("--lr", "--learning-rate"),
        parse=float,
    )
    lr_scheduler: LrScheduler = opt("linear", "learning-rate schedule over the epochs")
    precision: Precision = opt(
        "fp32",
        "training precision: fp32, or bf16 / fp16 mixed precision (float32 weights, the forward and backward in "
        "bfloat16 / float16); fp16 needs a CUDA GPU, bf16 runs on a GPU with bfloat16 (Ampere or newer) and on CPU",
    )
    gradient_checkpointing: bool = opt(
        False,
        "recompute each layer's activations in the backward pass instead of keeping them (non-reentrant, so frozen "
        "embeddings and matrices pass their gradients on): less memory for about a third more compute",
        check=FLAG,
    )
    seed: int = opt(0, "training seed", check=NON_NEGATIVE_INT)
    data_seed: int = opt(0, "which rows are drawn and their order", check=NON_NEGATIVE_INT)
    stop_threshold: float | str | None = opt(
        None,
        "topological early stopping: normalized drift in (0, 1), or 'card' for the card's own",
        check=THRESHOLD,
        parse=_threshold,
    )
    observe_only: bool = opt(False, "record the stop epoch but train every epoch", check=FLAG)
    eval_each_epoch: bool = opt(False, "test accuracy after every epoch", check=FLAG)
    save_checkpoints: bool = opt(
        True, "checkpoint each epoch (only the last is kept), so a stopped run resumes", check=FLAG
    )
    keep_checkpoints: bool = opt(False, "keep the last checkpoint after a finished run (default: removed)", check=FLAG)
    save_snapshot: bool = opt(False, "write the fine-tuned attention matrices (after.safetensors)", check=FLAG)
    save_epoch_snapshots: bool = opt(
        False,
        "write the attention matrices after every epoch (epoch-1.safetensors, ...; float32, ~100 MB an epoch for "
        "SmolLM2-135M), for drift aggregated over epochs",
        check=FLAG,
    )
    confirm_run_unsafe_code: bool = opt(
        False,
        "where no bubblewrap sandbox can run, run code tasks' generated programs anyway with resource limits only: "
        "they can read and change your files and use your network (a throw-away machine or container only)",
        check=FLAG,
    )
    data_source: str | None = opt(
        None,
        "'hub' for the Hugging Face hub, or a data folder laid out like shared/data (default: the offline copies; "
        "where a task's copy is absent, its spec's hub dataset, with a warning)",
        check=DATA_SOURCE,
    )

    def check(self) -> None:
        """The methods and options that need a profile card have one; the task exists."""
        get_task(self.task)
        for task in self.ood_tasks:
            get_task(task)
        needs_card = {
            "method 'profile'": self.method == "profile",
            "stop_threshold='card'": self.stop_threshold == "card",
            "lora_rank='match'": self.lora_rank == "match",
        }
        for what, needed in needs_card.items():
            if needed and not self.profile:
                self.fail(f"{what} needs a profile card", "pass --card card.json")
