"""Settings for every test directory (the engine's and the plugins')."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True, scope="session")
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Tests keep what they cache (prepared data, subword models) out of the user's cache."""
    before = os.environ.get("SEQTRANS_CACHE_DIR")
    os.environ["SEQTRANS_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        del os.environ["SEQTRANS_CACHE_DIR"]
    else:
        os.environ["SEQTRANS_CACHE_DIR"] = before
