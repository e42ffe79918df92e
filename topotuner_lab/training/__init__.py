"""Fine-tuning: config, trainer, callbacks (topological early stopping), evaluation and results."""
