"""Errors, atomic writes, cache paths and output checks: what every floor above uses."""
