"""Splits carved out of one data file: stable, disjoint by a key, stratified.

For a set that has one split here (MMLU's test set): within each stratum (a subject) the distinct keys (question
texts) are ordered by the SHA-256 of ``"{seed}:{key}"`` and cut in the given shares, the splits in the order given.
Rows sharing a key share a split (a key counts in the stratum of its first row), so no key is in two splits; the cut
depends on the keys and the seed only, never on the rows' order, so the same question stays in the same split when the
file is reordered or rows are added elsewhere.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Sequence

__all__ = ["carve"]


def _order(seed: int, key: str) -> bytes:
    return hashlib.sha256(f"{seed}:{key}".encode()).digest()


def carve(
    keys: Sequence[str], strata: Sequence[str] | None, shares: Sequence[tuple[str, float]], seed: int = 0
) -> list[str]:
    """The split of each row: per stratum its distinct keys in hash order, cut at the cumulative ``shares``.

    Parameters
    ----------
    keys : each row's key (rows of one key share a split).
    strata : each row's stratum (each carved alone in the shares), or None for one stratum.
    shares : ``(split, share)`` in cut order; shares are relative (``60, 10, 30`` or ``0.6, 0.1, 0.3``).
    seed : the hash's salt: another seed, another carve.

    Returns
    -------
    The split name of each row. A stratum of ``n`` keys gives the first split ``round(n * share / total)`` keys, each
    later one up to its rounded cumulative share, the last the rest: every stratum is carved in the shares to within a
    key.

    Examples
    --------
    >>> carve(["q1", "q2", "q1", "q3"], None, [("train", 2), ("test", 1)])
    ['train', 'train', 'train', 'test']
    """
    first: dict[str, str] = {}
    for key, stratum in zip(keys, strata if strata is not None else [""] * len(keys)):
        first.setdefault(key, stratum)
    members: defaultdict[str, list[str]] = defaultdict(list)
    for key, stratum in first.items():
        members[stratum].append(key)
    total = sum(share for _, share in shares)
    split_of: dict[str, str] = {}
    for stratum_keys in members.values():
        ordered = sorted(stratum_keys, key=lambda key: _order(seed, key))
        start, cumulative = 0, 0.0
        for i, (name, share) in enumerate(shares):
            cumulative += share
            end = len(ordered) if i == len(shares) - 1 else math.floor(len(ordered) * cumulative / total + 0.5)
            split_of.update(dict.fromkeys(ordered[start:end], name))
            start = end
    return [split_of[key] for key in keys]
