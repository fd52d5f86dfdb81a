"""Shared fixtures and hooks only; the builders they use live in helpers/ (tests import them from there)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from helpers.shared_data import AWM1K_SAMPLES, CAPTURED_EPISODE, require_shared
from helpers.tiny import TEMPLATE_FAMILIES, tiny_tokenizer
from hypothesis import HealthCheck, settings

# CI runs the property tests on a fixed seed (reproducible); locally they explore new examples. Neither times
# them: how fast examples are drawn depends on the machine's load, not on the code (speed is the benchmarks').
settings.register_profile("local", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", parent=settings.get_profile("local"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "local")

os.environ.setdefault("ECHO_TRL_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# One intra-op thread (read by torch on import, inherited by every process a test starts): the tiny models here gain
# nothing from a second one but its synchronisation, about a quarter of a test's CPU time (tests/test_lora.py: 31.4
# -> 23.9 CPU s). Tests that are about threads set their own.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(params=TEMPLATE_FAMILIES)
def family_tokenizer(request):
    """A tiny tokenizer for each chat-template family TRL bundles that we support."""
    return tiny_tokenizer(request.param)


@pytest.fixture
def captured_episode() -> Path:
    return require_shared(CAPTURED_EPISODE)


@pytest.fixture
def awm1k_samples() -> Path:
    return require_shared(AWM1K_SAMPLES)


TESTS = Path(__file__).resolve().parent
CONTAINMENT_TEST_MODULES = ("sandbox/test_bwrap.py", "sandbox/test_containment.py")


def pytest_collection_modifyitems(items):
    """The containment tests are the bubblewrap tests: marked ``sandbox`` here, beside the list that names them
    (``-m "not sandbox"`` leaves them out of a fast local loop)."""
    for item in items:
        if item.path.relative_to(TESTS).as_posix() in CONTAINMENT_TEST_MODULES:
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(autouse=True)
def _explicitly_unsafe_where_no_sandbox(request, monkeypatch):
    """Tests of other things than containment run generated AWM code contained when bwrap works here;
    on a host where it cannot (no binary, user namespaces off) they opt out explicitly, as
    ``--unsafe-no-sandbox`` would. The containment tests never do: they skip with the reason."""
    if request.path.relative_to(TESTS).as_posix() in CONTAINMENT_TEST_MODULES:
        return
    from echo_trl.sandbox import bwrap as sandbox

    original = sandbox.require_containment

    @functools.wraps(original)  # the API reference test renders this function's signature and docstring
    def require(unsafe_no_sandbox: bool = False):
        return original(unsafe_no_sandbox or not sandbox.detect_containment().contained)

    monkeypatch.setattr(sandbox, "require_containment", require)


@pytest.fixture(autouse=True)
def _own_echo_cache(tmp_path_factory, monkeypatch):
    """Each test its own echo_trl cache (token columns, starting-model log-probs): no test passes on another's
    cached columns, and nothing is written under the home directory."""
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path_factory.mktemp("echo-cache")))


@pytest.fixture(autouse=True)
def _echo_trl_log_level():
    """In-process command runs quiet the ``echo_trl`` logger (``quiet_libraries``: ERROR) for the process; each
    test starts from the level it had before, so a warning another test's command silenced is still seen."""
    import logging

    logger = logging.getLogger("echo_trl")
    level = logger.level
    yield
    logger.setLevel(level)
