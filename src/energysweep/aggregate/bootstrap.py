"""Bootstrap confidence intervals of the median over a point's repetitions.

Percentile bootstrap, numpy, fixed seed, :data:`BOOTSTRAP_RESAMPLES` resamples:
:func:`bootstrap_ci` for one sample, :func:`bootstrap_ci_groups` for every point at once with
the same numbers.
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
CI_LEVEL = 0.95


def bootstrap_ci(
    values,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median of ``values`` (NaNs dropped); NaNs if < 2 values."""
    x = np.asarray(values, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < 2:
        return np.nan, np.nan
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(x, size=(resamples, len(x)), replace=True), axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def bootstrap_ci_groups(
    g: np.ndarray,
    values: np.ndarray,
    n: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = CI_LEVEL,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`bootstrap_ci` of each of ``n`` groups' values at once, with the same numbers.

    ``g`` (group ids) and ``values`` are aligned; each group's values are taken in their order.
    ``bootstrap_ci`` draws its resample indices from a fresh generator with a fixed seed, so they
    depend only on the number of values L and every group with L values shares them: ``drawn``
    counts how often each position is drawn in each resample. A resample's median is then an
    order statistic of the group's sorted values, found by counting the draws at or below each
    sorted value, and the percentiles come from one call along the resample axis.
    """
    lo, hi = np.full(n, np.nan), np.full(n, np.nan)
    keep = np.flatnonzero(~np.isnan(values))
    keep = keep[np.argsort(g[keep], kind="stable")]
    g, values = g[keep], values[keep]
    count = np.bincount(g, minlength=n)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    tail = (1 - level) / 2 * 100
    for length in np.unique(count[count >= 2]):
        groups = np.flatnonzero(count == length)
        draws = np.random.default_rng(seed).choice(length, size=(resamples, length), replace=True)
        # drawn[j, r]: how often resample r draws position j.
        flat = (draws + length * np.arange(resamples)[:, None]).ravel()
        drawn = np.bincount(flat, minlength=resamples * length).reshape(resamples, length).T
        drawn = drawn.astype(np.int16 if length < 2**15 else np.int64)
        middle = [length // 2] if length % 2 else [length // 2 - 1, length // 2]
        per_chunk = max(1, 4_000_000 // resamples)  # bounds the (groups, resamples) arrays
        for chunk in np.array_split(groups, -(-len(groups) // per_chunk)):
            x = values[start[chunk, None] + np.arange(length)]
            order = np.argsort(x, axis=1, kind="stable")
            ordered = np.take_along_axis(x, order, axis=1)
            # below: draws of each resample among the group's j+1 smallest values; the k-th
            # smallest value drawn (0-based) is the sorted value at the count of j with below <= k.
            below = np.zeros((len(chunk), resamples), dtype=drawn.dtype)
            at = [np.zeros((len(chunk), resamples), dtype=drawn.dtype) for _ in middle]
            for j in range(length):
                below += drawn[order[:, j]]
                for pos, k in zip(at, middle, strict=True):
                    pos += below <= k
            picked = [np.take_along_axis(ordered, pos.astype(np.intp), axis=1) for pos in at]
            # np.median averages the two middle values, (a + b) / 2, of an even-sized sample.
            medians = picked[0] if length % 2 else (picked[0] + picked[1]) / 2
            lo[chunk], hi[chunk] = np.percentile(medians, [tail, 100 - tail], axis=1)
    return lo, hi
