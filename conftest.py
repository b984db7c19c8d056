"""Settings for every test directory (the engine's and the plugins')."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from seqtrans.runtime.threads import set_wait_policy

# Idle OpenMP threads sleep rather than spin, as under the command line: the suite runs a
# process per core, and one process's spinning threads take the cores the others compute on.
# libgomp reads the policy once, when torch loads: here, before any test module imports it.
set_wait_policy()

# Property-based tests draw the same examples on every run and keep no example database,
# so a failure in CI is reproduced by running the test again; "explore" draws afresh
# (pytest --hypothesis-profile=explore).
settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("explore", database=None, deadline=None)
settings.load_profile("ci")


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
