"""Persistence diagrams of row point clouds, distances between diagrams, magnitude baselines (numpy/scipy only, no
torch).
"""
