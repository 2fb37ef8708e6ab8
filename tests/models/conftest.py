"""Session fixture: one tiny random HF checkpoint per family, saved with ``save_pretrained``."""

from __future__ import annotations

import pytest
from model_refs import FAMILIES, build_hf_model


@pytest.fixture(scope="session")
def hf_checkpoints(tmp_path_factory) -> dict:
    """family -> (torch model, folder written by save_pretrained)."""
    out = {}
    for family in FAMILIES:
        model = build_hf_model(family)
        folder = tmp_path_factory.mktemp(f"hf_{family}")
        model.save_pretrained(folder)
        out[family] = (model, folder)
    return out
