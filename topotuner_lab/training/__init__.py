"""Fine-tuning: full, LoRA and profile-card runs on the HF ``Trainer``.

Config, data, model and trainer per method, callbacks (topological early stopping), evaluation, memory, results.
"""

from topotuner_lab._io.lazy import lazy_exports

_EXPORTS = {
    "FinetuneConfig": ".config",
    "run_finetune": ".finetune",
    "FinetuneResult": ".results",
    "RunResults": ".results",
    "load_results": ".results",
    "TopologicalEarlyStopping": ".early_stopping",
    "DEFAULT_STOP_THRESHOLD": ".early_stopping",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
