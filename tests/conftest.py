"""Shared fixtures: tiny local tokenizers/models (no downloads) and the shared AWM sample data."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs the property tests on a fixed seed (reproducible); locally they explore new examples.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

os.environ.setdefault("ECHO_TRL_PROGRESS", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CAPTURED_EPISODE = SHARED_DATA / "awm_episodes" / "e_commerce_33_task0_captured.json"
AWM1K_SAMPLES = SHARED_DATA / "awm1k_samples"
TEMPLATE_FAMILIES = ("qwen2_5", "qwen3", "llama3_1")


def require_shared(path: Path) -> Path:
    """Skip (with the reason) when the shared AWM sample data is not next to the checkout."""
    if not path.exists():
        pytest.skip(
            f"needs the AWM-1K sample data (CC-BY-4.0, not in the repository) at {path}: put it in "
            "../shared/data next to the checkout (README, 'Tests with AWM-1K data')"
        )
    return path


@functools.cache
def tiny_tokenizer(family: str = "qwen3"):
    from echo_trl.demo.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(family)


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


def descendant_pids(pid: int | None = None) -> set[int]:
    """PIDs of all live descendants of ``pid`` (default: this process), read from /proc."""
    pid = os.getpid() if pid is None else pid
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                if fields[0] != "Z":
                    parent[int(d.name)] = int(fields[1])
            except (OSError, ValueError):
                pass
    out, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


CONTAINMENT_TEST_MODULES = ("test_envs_awm_sandbox", "test_envs_awm_containment")


@pytest.fixture(autouse=True)
def _explicitly_unsafe_where_no_sandbox(request, monkeypatch):
    """Tests of other things than containment run generated AWM code contained when bwrap works here;
    on a host where it cannot (no binary, user namespaces off) they opt out explicitly, as
    ``--unsafe-no-sandbox`` would. The containment tests never do: they skip with the reason."""
    if request.module.__name__ in CONTAINMENT_TEST_MODULES:
        return
    from echo_trl.envs.awm import sandbox

    original = sandbox.require_containment

    def require(unsafe_no_sandbox: bool = False):
        return original(unsafe_no_sandbox or not sandbox.detect_containment().contained)

    monkeypatch.setattr(sandbox, "require_containment", require)


@pytest.fixture(autouse=True)
def _own_echo_cache(tmp_path_factory, monkeypatch):
    """Each test its own echo_trl cache (token columns, starting-model log-probs): no test passes on another's
    cached columns, and nothing is written under the home directory."""
    monkeypatch.setenv("ECHO_TRL_CACHE", str(tmp_path_factory.mktemp("echo-cache")))


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (for torch.distributed / accelerate rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
