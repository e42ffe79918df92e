"""Profile cards: a reusable freezing profile as versioned JSON, valid by construction, readable without torch.

A card names the pretrained model it was built for, where its ranking came from (prior task, strategy, drift
column, normalization, drift settings and their recipe, how the drift aggregated epochs, the task of a gradient
ranking) and which attention projections train. Every field is checked when a
card is made, by :func:`~topotuner_lab.profiles.select.build_profile` or from a file, so a card that is saved
can always be loaded. Files of an older schema are read through :data:`MIGRATIONS`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from topotuner_lab._io import atomic
from topotuner_lab._io.config import NON_NEGATIVE_INT, REQUIRED, Check, Config, is_int, is_real, opt, optional
from topotuner_lab._io.errors import InputFileError, ProfileError, TopoTunerError
from topotuner_lab._io.json_files import read_json
from topotuner_lab.drift.settings import RECIPES, DriftSettings
from topotuner_lab.drift.signals import ELTWISE_COLUMN
from topotuner_lab.drift.tables import AGGREGATIONS
from topotuner_lab.weights.snapshot import Snapshot

#: v2: ``normalization`` defaults to ``per-point`` (v1 cards without the field were ranked ``raw``);
#: v3: ``recipe``, ``aggregation`` and ``gradient_task`` (v2 cards: the recipe of their drift settings, ``final``)
SCHEMA_VERSION = 3
#: strategies that rank by a fixed column of the drift table (not the card's drift metric), and in which direction:
#: the magnitude control; Spectrum's SNR, WeightWatcher's alpha (highest first), PEFT KappaTune's kappa (lowest
#: first); the gradient-magnitude selector: the RMS entry of each matrix's loss gradient on the target task at the
#: pretrained weights (highest first; ``training.transfer.with_gradient_signal`` adds the column); the authors'
#: element-wise relative change from the pretrained to the prior fine-tune's weights (highest first, like the magnitude
#: control; ``drift.signals.with_relchange`` adds the column)
FIXED_RANKINGS: dict[str, tuple[str, bool]] = {
    "magnitude": ("rel_frobenius", True),
    "relchange": (ELTWISE_COLUMN, True),
    "snr": ("spectrum_snr", True),
    "alpha": ("ww_alpha", True),
    "kappa": ("kappa", False),
    "gradient": ("grad_norm", True),
}
#: the authors' joint drift x magnitude selector (FDataLab/TopoTuner,
#: ``codes/helpers/joint_wass_norm_layer_selection.py``): strategy -> (drift high, magnitude high); the magnitude is
#: the magnitude control's column (``rel_frobenius``: their normalized L2 change ||W - W0|| / ||W0||)
JOINT: dict[str, tuple[bool, bool]] = {
    "joint-hh": (True, True),
    "joint-hl": (True, False),
    "joint-lh": (False, True),
    "joint-ll": (False, False),
}
STRATEGIES: tuple[str, ...] = ("high-drift", "low-drift", "random", *FIXED_RANKINGS, *JOINT)
#: drift recipes a card can record: the named ones (``DriftSettings.recipe_name``) or ``custom``
RECIPE_NAMES: tuple[str, ...] = (*RECIPES, "custom")
#: how a drift column is made comparable across matrices of different sizes before ranking:
#: raw W; W per diagram point; W over the pretrained diagram's total persistence; z-score against noise drift
NORMALIZATIONS: tuple[str, ...] = ("raw", "per-point", "relative", "noise-z")
#: the normalization cards use unless told otherwise (raw W ranks big matrices high by size alone)
DEFAULT_NORMALIZATION = "per-point"
REBUILD = "rebuild the card with `topotuner-lab profile`"
#: scores closer than this (relative) are one score computed with other rounding (:meth:`ProfileCard.same_as`)
SCORE_RTOL = 1e-9

COUNT = NON_NEGATIVE_INT
SHAPES = Check(
    lambda v: (
        isinstance(v, dict)
        and all(
            isinstance(k, str) and isinstance(s, list) and len(s) == 2 and all(is_int(x) and x > 0 for x in s)
            for k, s in v.items()
        )
    ),
    "a mapping of projection id to [rows, cols]",
)
IDS = Check(lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of projection ids")
TEXT = Check(lambda v: isinstance(v, str), "a string")
RANKING = Check(
    lambda v: (
        isinstance(v, list)
        and all(
            isinstance(r, dict) and set(r) == {"pid", "score"} and isinstance(r["pid"], str) and is_real(r["score"])
            for r in v
        )
    ),
    'a list of {"pid": id, "score": finite number}',
)
BUDGET = Check(
    lambda v: (
        isinstance(v, dict)
        and len(v) == 1
        and (
            ("count" in v and is_real(v["count"]))
            or ("fraction" in v and is_real(v["fraction"]))
            or ("per_kind" in v and isinstance(v["per_kind"], dict) and all(is_int(n) for n in v["per_kind"].values()))
        )
    ),
    '{"count": k}, {"fraction": f} or {"per_kind": {kind: k}}',
)
MAPPING = Check(lambda v: isinstance(v, dict), "a JSON object")
PRIOR_SPEC = Check(
    lambda v: (
        isinstance(v, dict)
        and isinstance(v.get("hash"), str)
        and len(set(v) & {"builtin", "path"}) == 1
        and set(v) <= {"builtin", "path", "hash"}
        and all(isinstance(v[k], str) for k in v)
    ),
    'a JSON object {"builtin": NAME, "hash": ...} or {"path": ABSOLUTE_PATH, "hash": ...}',
)


@dataclass(frozen=True)
class ModelIdentity(Config):
    """The pretrained model a card was built for: its name, weight fingerprint, architecture, size and shapes.

    Parameters
    ----------
    name : str
        The pretrained model's name (a snapshot's ``base_model``).
    weights_hash : str
        Content hash of its attention matrices (``Snapshot.weights_hash``); ``"config-only"`` for a card built from
        config shapes alone (:func:`upstream_card`).
    architecture : str
        Its ``model_type``.
    total_params : int
        Parameters of the whole model (budgets are shares of it).
    shapes : dict of str to list of int
        Projection id -> [rows, cols], in model order.

    Raises
    ------
    ProfileError
        A field of the wrong kind, or :meth:`from_snapshot` of a snapshot without a parameter count (or with one below
        its attention matrices' parameters).

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import ModelIdentity, Snapshot
    >>> snap = Snapshot({"L0.q": np.ones((4, 2), np.float32)}, "toy-ft", "toy", "r0", "llama", total_params=100)
    >>> identity = ModelIdentity.from_snapshot(snap)
    >>> identity.name, identity.total_params, identity.shapes
    ('toy', 100, {'L0.q': [4, 2]})
    """

    label = "card's model"
    error = ProfileError
    remedy = REBUILD

    name: str = opt(REQUIRED, "the pretrained model's name", check=TEXT)
    weights_hash: str = opt(REQUIRED, "content hash of its attention matrices", check=TEXT)
    architecture: str = opt(REQUIRED, "its model_type", check=TEXT)
    total_params: int = opt(REQUIRED, "parameters of the whole model", check=COUNT)
    shapes: dict[str, list[int]] = opt(REQUIRED, "projection id -> [rows, cols]", check=SHAPES)

    @classmethod
    def from_snapshot(cls, snap: Snapshot, total_params: int | None = None) -> ModelIdentity:
        """The identity of the snapshot's model; ``total_params`` defaults to the count the snapshot records."""
        total = snap.total_params if total_params is None else total_params
        attention = sum(int(np.prod(s)) for s in snap.shapes.values())
        if total is None:
            raise ProfileError(
                f"snapshot of {snap.model!r} records no parameter count (written by an older version)",
                "re-extract it with `topotuner-lab extract`, or pass --total-params N / --model MODEL",
            )
        if isinstance(total, bool) or not isinstance(total, (int, np.integer)) or total < attention:
            raise ProfileError(
                f"total parameter count {total!r} is below the {attention:,} parameters of the attention matrices "
                "alone",
                "pass the whole model's parameter count (or omit --total-params to use the one the snapshot records)",
            )
        return cls(
            snap.base_model,
            snap.weights_hash,
            snap.architecture,
            int(total),
            {k: list(v) for k, v in snap.shapes.items()},
        )


def recipe_of(drift_settings: Any) -> str | None:
    """The recipe a card's drift settings (``DriftSettings.key()``) are: a name of :data:`RECIPE_NAMES`.

    None when there are none (a table without recorded settings); ``custom`` for settings this version cannot read.
    """
    if not isinstance(drift_settings, dict) or not drift_settings:
        return None
    try:
        return DriftSettings.from_key(drift_settings).recipe_name
    except TopoTunerError:
        return "custom"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ProfileCard(Config):
    """A reusable freezing profile (JSON, schema ``SCHEMA_VERSION``), checked field by field when it is made.

    ``trainable`` and ``frozen`` split the model's projection ids; ``ranking`` lists ``{"pid", "score"}`` best first
    for the strategy; ``trainable_fraction`` is the trainable share of all model parameters (0.01 is 1%). Cards are
    made by :func:`build_profile` and :func:`upstream_card`, read by :meth:`load`, written by :meth:`save`.

    Parameters
    ----------
    model : ModelIdentity
        The pretrained model it was built for.
    prior_task : str
        The task whose drift ranked the projections.
    strategy : str
        Which end of the ranking trains, or a control (one of ``STRATEGIES``: ``high-drift``, ``low-drift``,
        ``random``, ``magnitude``...).
    metric : str
        The drift-table column ranked by (for an upstream card: the source of its list).
    drift_settings : dict
        The drift settings of the table (``DriftSettings.key()``); empty when none were recorded.
    ranking : list of dict
        ``{"pid": id, "score": value}`` for the ranked projections, best first.
    trainable, frozen : list of str
        The projection ids that train and that stay frozen: together every id of ``model``, each once.
    trainable_params : int
        Parameters that train.
    trainable_fraction : float
        Their share of all the model's parameters, in [0, 1].
    budget : dict
        The budget asked for: ``{"count": n}``, ``{"fraction": f}`` or ``{"per_kind": {kind: n}}``.
    stop_threshold : float or None
        Early-stopping threshold on normalized drift, in (0, 1).
    transferred_to : list of str
        Tasks the card was transferred to.
    seed : int
        Seed of the random control.
    normalization : str
        How scores were made comparable across matrix sizes (one of ``NORMALIZATIONS``).
    recipe : str or None
        The drift recipe of the table (``default``, ``reference`` or ``custom``); None when it recorded no settings.
    aggregation : {"final", "mean"}
        How the table's drift aggregated the prior run's epochs.
    gradient_task : str or None
        The task whose gradient ranked a ``gradient`` card (None for other strategies).
    prior_spec : dict or None
        The prior task's spec as found when the card was built (its content hash and path, or a built-in's name).
    created : str
        When the card was made (UTC, ISO 8601; default: now).
    schema_version : int
        The card schema (``SCHEMA_VERSION``); older files are migrated when read.

    Raises
    ------
    ProfileError
        A field of the wrong kind or out of its choices, ids that do not split the model's projections, no trainable
        projection, a recipe that contradicts the drift settings; :meth:`load` of a file that is not a valid card.
    InputFileError
        :meth:`load` of a missing or unreadable file.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from topotuner_lab import ProfileCard, upstream_card
    >>> card = upstream_card("Qwen3-8B-Base", size=3)  # the authors' published list, no weights needed
    >>> card.strategy, card.budget, len(card.trainable) + len(card.frozen) == len(card.model.shapes)
    ('high-drift', {'per_kind': {'q': 3, 'k': 3, 'v': 3}}, True)
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     path = card.save(Path(folder) / "card.json")  # and card.md beside it
    ...     print(ProfileCard.load(path) == card, sorted(p.name for p in Path(folder).iterdir()))
    True ['card.json', 'card.md']
    """

    label = "profile card"
    error = ProfileError
    remedy = REBUILD

    model: ModelIdentity = opt(
        REQUIRED,
        "the pretrained model it was built for",
        check=Check(
            lambda v: isinstance(v, ModelIdentity),
            "a model identity (name, weights_hash, architecture, total_params, shapes)",
        ),
    )
    prior_task: str = opt(REQUIRED, "the task whose drift ranked the projections", check=TEXT)
    strategy: str = opt(REQUIRED, "which end of the ranking trains, or a control", choices=STRATEGIES)
    metric: str = opt(REQUIRED, "the drift-table column ranked by", check=TEXT)
    drift_settings: dict[str, Any] = opt(
        REQUIRED, "the drift settings of the table (DriftSettings.key())", check=MAPPING
    )
    ranking: list[dict[str, Any]] = opt(REQUIRED, "projection ids with their scores, best first", check=RANKING)
    trainable: list[str] = opt(REQUIRED, "projection ids that train", check=IDS)
    frozen: list[str] = opt(REQUIRED, "projection ids that stay frozen", check=IDS)
    trainable_params: int = opt(REQUIRED, "parameters that train", check=COUNT)
    trainable_fraction: float = opt(
        REQUIRED,
        "trainable share of all parameters",
        check=Check(lambda v: is_real(v) and 0 <= v <= 1, "a fraction in [0, 1]"),
    )
    budget: dict[str, Any] = opt(
        REQUIRED, "the budget: a count of matrices or a fraction of the parameters", check=BUDGET
    )
    stop_threshold: float | None = opt(
        None,
        "early-stopping threshold on normalized drift",
        check=optional(Check(lambda v: is_real(v) and 0 < v < 1, "a number in (0, 1)")),
    )
    transferred_to: list[str] = opt([], "tasks the card was transferred to", check=IDS)
    seed: int = opt(0, "seed of the random control", check=COUNT)
    normalization: str = opt(
        DEFAULT_NORMALIZATION, "how scores were made comparable across sizes", choices=NORMALIZATIONS
    )
    recipe: str | None = opt(
        None,
        "the drift recipe of the table (DriftSettings.recipe_name: default, reference or custom); None when the "
        "table recorded no settings",
        choices=(*RECIPE_NAMES, None),
    )
    aggregation: str = opt("final", "how the table's drift aggregated epochs: final or mean", choices=AGGREGATIONS)
    gradient_task: str | None = opt(
        None, "the task whose gradient ranked a gradient card (None for other strategies)", check=optional(TEXT)
    )
    prior_spec: dict[str, Any] | None = opt(
        None,
        "the prior task's spec as found when the card was built: its content hash and absolute path (a built-in "
        "task: its name), so the card finds it from any folder (profiles.prior); None: a name of no spec, or an "
        "older card (prior_task as typed)",
        check=optional(PRIOR_SPEC),
    )
    created: str = opt(REQUIRED, "when the card was made (UTC, ISO 8601)", factory=_now, check=TEXT)
    schema_version: int = opt(SCHEMA_VERSION, "card schema version", choices=(SCHEMA_VERSION,))

    def check(self) -> None:
        """Every projection of the model is trainable or frozen, once; the ranking names only its projections."""
        known = set(self.model.shapes)
        unknown = sorted(set(self.trainable + self.frozen + [r["pid"] for r in self.ranking]) - known)
        if unknown:
            self.fail(f"lists projection ids {unknown[:5]} that the model does not have", REBUILD)
        listed = self.trainable + self.frozen
        twice = sorted({p for p in listed if listed.count(p) > 1})
        if twice:
            self.fail(f"lists projection ids {twice[:5]} more than once (trainable and frozen, or repeated)", REBUILD)
        if set(listed) != known:
            self.fail(f"leaves projection ids {sorted(known - set(listed))[:5]} neither trainable nor frozen", REBUILD)
        if not self.trainable:
            self.fail("has no trainable projection", REBUILD)
        if (self.strategy == "gradient") != (self.gradient_task is not None):
            self.fail("names a gradient task exactly when its strategy is 'gradient'", REBUILD)
        if self.recipe is not None and self.drift_settings and self.recipe != recipe_of(self.drift_settings):
            self.fail(
                f"records recipe {self.recipe!r}, but its drift settings are recipe {recipe_of(self.drift_settings)!r}",
                REBUILD,
            )

    # --- files ---------------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the card atomically as JSON, with its Markdown view beside it (``.md``)."""
        from topotuner_lab.profiles.views import card_markdown

        path = Path(path)
        atomic.write_json(path, self.to_dict())
        atomic.write_text(path.with_suffix(".md"), card_markdown(self))
        return path

    def save_unless_same(self, path: str | os.PathLike[str]) -> Path:
        """:meth:`save`, but keep a card already at ``path`` that is :meth:`same_as` this one.

        A resumed study rebuilds its cards; an unchanged card keeps its file as first written (its time, the tasks it
        was since transferred to), also where another CPU rounds its scores differently in the last bits. A file of
        an older schema is written afresh in the current one.
        """
        path = Path(path)
        if path.is_file() and path.with_suffix(".md").is_file():
            try:
                data = _card_json(path)
                same = self.same_as(ProfileCard.from_dict(data, str(path)))
                same = same and data.get("schema_version") == self.schema_version  # from_dict checked it is a dict
            except TopoTunerError:  # unreadable or invalid: written afresh
                same = False
            if same:
                return path
        return self.save(path)

    def same_as(self, other: ProfileCard) -> bool:
        """Whether ``other`` is this card but for its ``created`` time, rounded scores and its transfers' record.

        The same selection ranked in the same order from the same inputs: a score computed on another CPU (an SVD, a
        float sum in another order) can differ in its last bits (relative 1e-9), which is no reason to call a card
        another; nor is the record a finished study adds of the tasks the card was used on (``transferred_to``).
        """
        ours, theirs = [r["pid"] for r in self.ranking], [r["pid"] for r in other.ranking]
        close = ours == theirs and bool(
            np.allclose(
                [r["score"] for r in self.ranking], [r["score"] for r in other.ranking], rtol=SCORE_RTOL, atol=0.0
            )
        )
        as_ours = replace(other, created=self.created, ranking=self.ranking, transferred_to=self.transferred_to)
        return close and as_ours == self

    @classmethod
    def from_dict(cls, data: Any, where: str = "card") -> ProfileCard:
        """A card from parsed JSON of any schema version this package reads; a problem names the field."""
        if not isinstance(data, dict):
            raise ProfileError(
                f"{where} is not a JSON object", "load a file written by ProfileCard.save / `topotuner-lab profile`"
            )
        data = migrate(data, where)
        try:
            return super().from_dict(data)
        except TopoTunerError as exc:
            raise ProfileError(f"{where}: {exc.problem}", exc.fix) from exc

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ProfileCard:
        """Read and check a card file (any schema version this package reads)."""
        path = Path(path)
        if not path.is_file():
            raise InputFileError(
                f"profile card {path} does not exist", "build one with `topotuner-lab profile DRIFT_TABLE ...`"
            )
        return cls.from_dict(_card_json(path), str(path))

    # --- views (see :mod:`topotuner_lab.profiles.views`) -----------------------------------
    def to_markdown(self) -> str:
        """A model-card-like summary for sharing."""
        from topotuner_lab.profiles.views import card_markdown

        return card_markdown(self)

    def to_spectrum_yaml(self, model: Any = None) -> str:
        """``unfrozen_parameters`` YAML (Spectrum / axolotl format) for the trainable projections."""
        from topotuner_lab.profiles.views import spectrum_yaml

        return spectrum_yaml(self, model)


def _card_json(path: Path) -> Any:
    """A card file's parsed JSON, unchecked; a file that is not UTF-8 JSON raises :class:`ProfileError`."""
    return read_json(path, "profile card", REBUILD, kind=object, error=ProfileError)


def _v1_to_v2(data: dict[str, Any]) -> dict[str, Any]:
    """v1 ranked ``raw`` unless the card said otherwise; v2's default is ``per-point``, so say it."""
    return {**data, "normalization": data.get("normalization", "raw"), "schema_version": 2}


def _v2_to_v3(data: dict[str, Any]) -> dict[str, Any]:
    """v2 cards were ranked from final-checkpoint drift; their recipe is that of the drift settings they record."""
    return {
        **data,
        "recipe": data.get("recipe", recipe_of(data.get("drift_settings"))),
        "aggregation": data.get("aggregation", "final"),
        "schema_version": 3,
    }


#: schema version -> the function that lifts a card of that version to the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _v1_to_v2, 2: _v2_to_v3}


def migrate(data: dict[str, Any], where: str = "card") -> dict[str, Any]:
    """``data`` lifted to :data:`SCHEMA_VERSION` through :data:`MIGRATIONS` (a card without a version is v1)."""
    version = data.get("schema_version", 1)
    if version == SCHEMA_VERSION:
        return data
    if not is_int(version) or version not in MIGRATIONS:
        raise ProfileError(
            f"{where} has schema_version {version!r}; this version of topotuner_lab reads {sorted(MIGRATIONS)} and "
            f"{SCHEMA_VERSION}",
            "rebuild the card from its drift table with `topotuner-lab profile`, or use the topotuner_lab version "
            "that wrote it",
        )
    return migrate(MIGRATIONS[version](data), where)
