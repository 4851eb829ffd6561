"""The default random generator of random transforms called without ``rng``.

Created from fresh OS entropy at import and reseeded by :func:`seed_default`: spawned
workers therefore differ, but forked ones share the parent's state (pass explicit
generators for reproducibility).
"""
from __future__ import annotations

import numpy as np

__all__ = ["Rng", "seed_default", "get_default_rng"]

#: What random transforms take as ``rng``: a generator, or None for the default one.
Rng = np.random.Generator | None

_default_rng: np.random.Generator = np.random.default_rng()


def seed_default(seed: int | np.random.SeedSequence | None) -> None:
    """Reseed this process's default generator (``None``: fresh OS entropy)."""
    global _default_rng
    _default_rng = np.random.default_rng(seed)


def get_default_rng() -> np.random.Generator:
    """The generator random transforms use when called with ``rng=None``."""
    return _default_rng
