"""The drift noise floor: drift of the pretrained matrices against tiny random perturbations of themselves.

A ranking is only worth building on when the fine-tune's drift stands clearly above this floor (on the
embedded Q4_1 model any change takes weights off their 4-bit grid, which alone moves the diagrams).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from topotuner_lab.drift.columns import DEFAULT_METRIC

#: below this median fine-tune / noise drift ratio a ranking is called within the noise floor
NOISE_RATIO_MIN = 2.0


@dataclass(frozen=True)
class NoiseCheck:
    """How far a drift column stands above its noise floor."""

    metric: str
    ratio: float  # median fine-tune drift / median noise drift
    share_above: float  # share of matrices whose drift exceeds every noise draw of that matrix

    @property
    def within_noise(self) -> bool:
        """Whether the fine-tune's drift fails to clear the noise floor (ratio below ``NOISE_RATIO_MIN``, or NaN)."""
        return not self.ratio >= NOISE_RATIO_MIN

    @property
    def message(self) -> str:
        """The check in words: the ratio and share above noise; within noise, a warning with the fix."""
        head = (
            f"noise check on {self.metric}: fine-tune drift is {self.ratio:.2f}x the noise floor (median); "
            f"{100 * self.share_above:.0f}% of matrices drift more than every noise draw"
        )
        if self.within_noise:
            return (
                f"WARNING: {head}. The ranking is within the noise floor (ratio < {NOISE_RATIO_MIN:g}): a card "
                "built from it ranks noise. "
                "Fine-tune the prior task longer or with a higher learning rate, then recompute the drift."
            )
        return head + "."

    @property
    def markdown(self) -> str:
        """The check as a Markdown section for a card's view; within the noise floor it opens with a bold warning."""
        if self.within_noise:
            return f"## Noise check\n\n> **WARNING: this card ranks noise.** {self.message.removeprefix('WARNING: ')}\n"
        return f"## Noise check\n\n{self.message}\n"


def noise_check(
    table: pd.DataFrame, noise: Sequence[pd.DataFrame], metric: str = DEFAULT_METRIC, *, warn: bool = False
) -> NoiseCheck:
    """Compare ``table[metric]`` with the same column of the ``noise`` tables (one per perturbation seed).

    The noise floor is the drift of the pretrained snapshot against tiny random perturbations of itself
    (:func:`perturb_snapshot`); a ranking whose drift does not stand clearly above it ranks noise. This check is the
    lab's own guard, not a step of the paper's method.

    Parameters
    ----------
    table : pandas.DataFrame
        The fine-tune's drift table (:func:`drift_table`), with a ``pid`` column.
    noise : sequence of pandas.DataFrame
        Drift tables of the pretrained snapshot against perturbed copies of itself, one per seed, of the same ids.
    metric : str, default ``"h0_w1"``
        The drift column compared.
    warn : bool, default False
        Also warn (``UserWarning``) when the drift is within the noise floor.

    Returns
    -------
    NoiseCheck
        ``ratio``: median drift over the median noise drift; ``share_above``: the share of matrices whose drift exceeds
        every noise draw of that matrix; ``within_noise``: ratio below ``NOISE_RATIO_MIN`` (2) or NaN; ``message`` and
        ``markdown``: the check in words.

    Raises
    ------
    KeyError
        A table without a ``pid`` or a ``metric`` column.

    Warns
    -----
    UserWarning
        With ``warn=True``, when the drift is within the noise floor.

    See Also
    --------
    perturb_snapshot : the perturbed copies.

    References
    ----------
    .. [1] Erol et al., TopoTuner (2026): Wasserstein drift between the Vietoris–Rips diagrams of each attention
       projection before and after fine-tuning ranks the projections; code https://github.com/FDataLab/TopoTuner.

    Examples
    --------
    >>> import numpy as np
    >>> from topotuner_lab import DriftCache, DriftSettings, Snapshot, drift_table, perturb_snapshot
    >>> rng = np.random.default_rng(0)
    >>> matrices = {f"L{i}.{k}": rng.standard_normal((8, 4), dtype=np.float32) for i in (0, 1) for k in "qkvo"}
    >>> before = Snapshot(matrices, model="toy", base_model="toy", revision="r0", architecture="llama")
    >>> after = perturb_snapshot(before, scale=0.1, seed=1)  # stands in for a fine-tuned copy
    >>> h0 = DriftSettings(maxdim=0, orders=(1.0,))
    >>> table = drift_table(before, after, h0, n_jobs=1, cache=DriftCache(None))
    >>> from topotuner_lab import noise_check
    >>> noise = [drift_table(before, perturb_snapshot(before, seed=s), h0, n_jobs=1, cache=DriftCache(None))
    ...          for s in (0, 1)]
    >>> check = noise_check(table, noise)
    >>> check.within_noise, check.share_above
    (False, 1.0)
    >>> print(check.message)
    noise check on h0_w1: fine-tune drift is ...x the noise floor (median); 100% of matrices drift more than every ...
    """
    drift = table.set_index("pid")[metric].astype(float)
    floor = pd.concat([n.set_index("pid")[metric].astype(float).reindex(drift.index) for n in noise], axis=1)
    ratio = float(drift.median() / max(float(np.nanmedian(floor.to_numpy())), np.finfo(float).tiny))
    check = NoiseCheck(metric, ratio, float((drift > floor.max(axis=1)).mean()))
    if warn and check.within_noise:
        warnings.warn(check.message, stacklevel=2)
    return check
