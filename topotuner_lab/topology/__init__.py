"""Persistence diagrams of row point clouds, distances between diagrams, magnitude baselines.

Numpy and scipy only, no torch.
"""
