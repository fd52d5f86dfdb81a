"""The checkout, and the AWM-1K sample data next to it (CC-BY-4.0, not in the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
CAPTURED_EPISODE = SHARED_DATA / "awm_episodes" / "e_commerce_33_task0_captured.json"
AWM1K_SAMPLES = SHARED_DATA / "awm1k_samples"


def require_shared(path: Path) -> Path:
    """Skip (with the reason) when the shared AWM sample data is not next to the checkout."""
    if not path.exists():
        pytest.skip(
            f"needs the AWM-1K sample data (CC-BY-4.0, not in the repository) at {path}: put it in "
            "../shared/data next to the checkout (README, 'Tests with AWM-1K data')"
        )
    return path
