"""Attention projections of a model, snapshots of their weights, streaming extraction, model loading."""
