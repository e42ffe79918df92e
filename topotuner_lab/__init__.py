"""TopoTuner Lab: topology-guided fine-tuning of language models, as a Jupyter workbench.

Attention projection matrices are point clouds of their rows; their Vietoris–Rips persistence
diagrams and the Wasserstein drift between them rank matrices for freezing profiles and drive
topology-based early stopping.
"""

__version__ = "0.1.0"
