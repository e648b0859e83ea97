from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from tests.helpers import build_tiny_model

    root = Path(os.environ.get("RLFT_TEST_CACHE", tmp_path_factory.mktemp("models")))
    return build_tiny_model(root / "tiny-llama")
