"""What a drift table measures (:class:`DriftSettings`); part of every cache key and recorded in every table."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from topotuner_lab._io.config import NON_NEGATIVE_INT, Check, Config, is_real, opt, optional
from topotuner_lab._io.errors import ParameterError
from topotuner_lab._io.yaml_files import YamlFolder, in_file, read_mapping
from topotuner_lab.drift import columns
from topotuner_lab.topology.distances import SOLVERS, Solver
from topotuner_lab.topology.persistence import AT_LEAST_3_ROWS, METRICS, Metric, PersistenceSettings

#: bumped when a cached value would change meaning; part of every cache key
CACHE_VERSION = 2

ORDERS = Check(
    lambda v: isinstance(v, tuple) and len(v) > 0 and all(is_real(p) and p >= 1 for p in v),
    "a non-empty tuple of Wasserstein orders, each a finite number >= 1 (e.g. orders=(1, 2))",
)
SUBSAMPLE = optional(AT_LEAST_3_ROWS)
#: rows kept per matrix for cosine H1 (``subsample``), measured on SmolLM2-135M (benchmarks/bench_cosine_h1.py)
COSINE_H1_SUBSAMPLE = 256
GROUND = Check(lambda v: is_real(v) and v >= 1 or v == float("inf"), "a number >= 1, or inf")
#: where the named recipes live, one commented YAML file each: ``default`` (the lab's) and ``reference`` (the
#: authors' scripts)
RECIPE_DIR = Path(__file__).parent / "recipes"


def read_recipe(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The fields a recipe file sets, checked as :class:`DriftSettings` fields (lists read as the declared tuples)."""
    data = read_mapping(path, "drift recipe", f"give a recipe file in {RECIPE_DIR}")
    with in_file(path):
        settings = DriftSettings.from_dict(data)
    return {name: getattr(settings, name) for name in data}


#: the named recipes, by name: the settings each file of :data:`RECIPE_DIR` sets (the rest take their defaults)
RECIPES: YamlFolder[dict[str, Any]] = YamlFolder(RECIPE_DIR, read_recipe, "drift recipe")


@dataclass(frozen=True)
class DriftSettings(Config):
    """What the drift table measures; part of every cache key.

    Parameters
    ----------
    maxdim : {1, 0}
        0 for H0 only, 1 for H0 and H1.
    metric : {"euclidean", "cosine"}
        Distance between rows (``"cosine"``: 1 - cos).
    orders : tuple of float, default (1.0, 2.0)
        Wasserstein orders p (each >= 1): one ``h{k}_w{p}`` column per dimension and order.
    bottleneck : bool, default True
        Also the bottleneck distance (``h{k}_bottleneck``).
    solver : {"auto", "assignment", "pot", "hera", "h0"}
        Wasserstein solver for H1 (``"auto"``: the exact assignment up to ``distances.ASSIGNMENT_UP_TO``
        points, exact POT up to ``distances.HERA_ABOVE``, hera beyond; see :func:`wasserstein`).
    n_perm, seed : int or None, int
        Optional greedy subsample of rows for H1 (approximate; None = all rows); ``seed`` also draws ``subsample``.
    magnitude : bool, default True
        Also the magnitude baselines (``rel_frobenius``, ``rel_spectral``, ``row_cosine_change``); the
        magnitude control card ranks by ``rel_frobenius``. Off for a topology-only table (early stopping).
    internal_p : float, default 2.0
        Ground metric of the Wasserstein distance in the birth–death plane: 2 (Euclidean, as persim) or ``inf``
        (gudhi's default, the authors' scripts).
    subsample : int or None
        Rows kept per matrix for H1, drawn at random by ``seed`` (the same rows for a matrix and its
        fine-tuned copy); None (the default) computes H1 on every row. H0 always uses every row. Exact cosine H1 is
        impractical on real models (SmolLM2-135M's deep ``o`` projections: minutes to tens of minutes per matrix);
        :data:`COSINE_H1_SUBSAMPLE` is the measured choice for cosine H1 (benchmarks/bench_cosine_h1.py).

    Raises
    ------
    ParameterError
        A field out of its range or choices, or both ``n_perm`` and ``subsample`` given; :meth:`recipe` of an
        unknown name.

    See Also
    --------
    drift_table : the table these settings describe.
    DriftSettings.recipe : the named recipes ``default`` and ``reference`` (the authors' scripts).

    Examples
    --------
    >>> from topotuner_lab import DriftSettings
    >>> DriftSettings(maxdim=0, orders=(1, 2)).columns()
    ['h0_w1', 'h0_w2', 'h0_bottleneck']
    >>> reference = DriftSettings.recipe("reference")
    >>> reference.metric, reference.maxdim, reference.internal_p, reference.recipe_name
    ('cosine', 0, inf, 'reference')
    >>> DriftSettings(orders=(0.5,))
    Traceback (most recent call last):
    topotuner_lab._io.errors.ParameterError: drift settings: orders=(0.5,) is not a non-empty tuple of Wasserstein ...
    """

    label = "drift settings"

    maxdim: int = opt(1, "highest homology dimension: 0 (H0) or 1 (H0 and H1)", choices=(0, 1))
    metric: Metric = opt("euclidean", "distance between rows", choices=METRICS)
    orders: tuple[float, ...] = opt((1.0, 2.0), "Wasserstein orders, each >= 1", check=ORDERS, flags=("-p",))
    bottleneck: bool = opt(True, "also the bottleneck distance")
    solver: Solver = opt("auto", "Wasserstein solver for H1 diagrams", choices=SOLVERS)
    n_perm: int | None = opt(None, "greedy subsample size for H1 (approximate; default: all rows)", check=SUBSAMPLE)
    seed: int = opt(0, "seed of the H1 row subsample (start point of the greedy one)", check=NON_NEGATIVE_INT)
    magnitude: bool = opt(True, "also the magnitude baselines (the magnitude control card needs them)")
    internal_p: float = opt(
        2.0,
        "the L-p norm the Wasserstein distance measures diagram points by (the birth-death plane): 2 (Euclidean, "
        "persim) or inf (gudhi's default, the authors' scripts)",
        check=GROUND,
    )
    subsample: int | None = opt(
        None,
        f"rows kept per matrix for H1, a seeded random subsample (approximate; default: all rows; "
        f"{COSINE_H1_SUBSAMPLE} recommended for cosine H1)",
        check=SUBSAMPLE,
    )

    def check(self) -> None:
        """One H1 subsample at a time (as :class:`PersistenceSettings` requires)."""
        if self.n_perm is not None and self.subsample is not None:
            self.fail(
                f"subsample={self.subsample} and n_perm={self.n_perm} are both set",
                "give one: subsample (seeded random rows, the same for a matrix and its fine-tuned copy) or n_perm",
            )

    @classmethod
    def recipe(cls, name: str) -> DriftSettings:
        """The settings of a named recipe (:data:`RECIPES`): ``default`` or ``reference`` (the authors' scripts)."""
        if name not in RECIPES:
            raise ParameterError(f"unknown drift recipe {name!r}", f"use one of {', '.join(RECIPES)}")
        return cls(**RECIPES[name])

    @property
    def recipe_name(self) -> str:
        """The recipe these settings are, or ``custom``."""
        return next((name for name in RECIPES if self == DriftSettings.recipe(name)), "custom")

    def persistence(self, n_threads: int = 1) -> PersistenceSettings:
        """The diagram settings these drift settings imply (threads do not change a diagram)."""
        return PersistenceSettings(self.maxdim, self.metric, self.n_perm, self.seed, n_threads, self.subsample)

    def key(self) -> dict[str, Any]:
        """The cache key: every field (orders as floats) and the cache version."""
        key = {**asdict(self), "orders": [float(p) for p in self.orders], "v": CACHE_VERSION}
        if self.magnitude:  # the default, and the only behaviour before the switch: earlier cache entries stay valid
            del key["magnitude"]
        if self.internal_p == 2.0:  # likewise: the only ground metric before the setting
            del key["internal_p"]
        if self.subsample is None:  # likewise: every row, the only H1 before the setting
            del key["subsample"]
        return key

    @classmethod
    def from_key(cls, key: dict[str, Any]) -> DriftSettings:
        """Settings from a :meth:`key` (as a card or a table records it)."""
        return cls.from_dict({k: v for k, v in key.items() if k != "v"})

    def columns(self) -> list[str]:
        """The drift columns a table of these settings holds, per dimension: each order, then the bottleneck."""
        cols = []
        for dim in range(self.maxdim + 1):
            cols += [columns.wasserstein(dim, p) for p in self.orders]
            cols += [columns.bottleneck(dim)] if self.bottleneck else []
        return cols

    def value_columns(self) -> list[str]:
        """Every column a pair's cached values hold for these settings."""
        dims = range(self.maxdim + 1)
        sizes = [columns.diagram_size(dim, side) for dim in dims for side in ("before", "after")]
        persistence = [columns.total_persistence(dim) for dim in dims]
        magnitude = list(columns.MAGNITUDE_COLUMNS) if self.magnitude else []
        return ["rows", "cols", *self.columns(), *sizes, *persistence, *magnitude]
