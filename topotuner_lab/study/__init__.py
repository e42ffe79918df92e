"""Experiments: presets, the planned runs, the resumable protocol, claims as data and their statistics."""
