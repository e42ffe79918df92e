"""Drift tables: settings, column names, the verified on-disk cache, computation on local or Dask workers, table
files, the noise floor.
"""
