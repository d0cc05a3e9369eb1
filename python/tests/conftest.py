"""Shared helpers of the Python package's tests."""

import os
from pathlib import Path

import numpy as np
import pytest

#: The repository's root (python/tests -> python -> root).
ROOT = Path(__file__).resolve().parents[2]


def golden_dir() -> Path:
    """The vendored golden cases, or the folder $BRAINTRACE_GOLDEN_DIR names."""
    return Path(os.environ.get("BRAINTRACE_GOLDEN_DIR", ROOT / "tests" / "golden"))


def same_bits(a, b) -> bool:
    """Whether two arrays have the same dtype, shape and bits."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.fixture
def rng():
    return np.random.default_rng(0)
