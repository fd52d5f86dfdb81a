"""Run Agent World Model (AWM) scenarios locally: data, contained server, MCP, verifier, episodes.

Cut by job, each sub-package with its own docstring:

* ``scenario``: what a scenario is (files, initial database, rewards); nothing runs;
* ``runtime``: a live scenario (contained server, verifier, episodes, the bounded server pool);
* ``online``: TRL ``environment_factory`` environments for online GRPO / ECHO;
* ``policies``: what plays an episode for ``echo-trl capture`` (replay, local model, OpenAI-compatible server);
* ``capture``: many episodes collected at once into a resumable output, and capture from OpenEnv;
* ``check``: a health check of many scenarios (``echo-trl check-scenarios``) and what its report lets the others use.

The general pieces they use live on echo_trl's ground floor: ``echo_trl.sandbox`` (bubblewrap
containment), ``echo_trl.clients`` (MCP, OpenAI-compatible) and ``echo_trl.io`` (durable files).
Heavy imports happen on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module defining it (relative to this package unless it starts with ``echo_trl.``).
_EXPORTS = {
    "ScenarioSource": "scenario.source",
    "Scenario": "scenario.source",
    "ScenarioError": "scenario.source",
    "HUB_REPO_ID": "scenario.source",
    "build_database": "scenario.database",
    "copy_database": "scenario.database",
    "detect_containment": "echo_trl.sandbox.bwrap",
    "Containment": "echo_trl.sandbox.bwrap",
    "ScenarioServer": "runtime.server",
    "MCPSession": "echo_trl.clients.mcp",
    "run_verifier": "runtime.verifier",
    "RewardConfig": "scenario.rewards",
    "VerifierConfigError": "runtime.verifier",
    "AWMRuntime": "runtime.episode",
    "AWMSettings": "runtime.settings",
    "Episode": "runtime.episode",
    "ReplayPolicy": "policies.replay",
    "ModelPolicy": "policies.model",
    "PolicyError": "policies.policy",
    "OpenAIClient": "echo_trl.clients.openai",
    "OpenAIPolicy": "policies.openai",
    "InferenceServerError": "echo_trl.clients.openai",
    "awm_environment_factory": "online.environment",
    "awm_task_dataset": "online.dataset",
    "awm_environment_factories": "online.environment",
    "ServerPool": "runtime.pool",
    "PoolError": "runtime.pool",
    "awm_agent_environment_factory": "online.agent",
    "AWMAgentModelPolicy": "policies.model",
    "close_environments": "online.environment",
    "AWMEnvironment": "online.environment",
    "OpenEnvAWMClient": "capture.openenv",
    "capture_openenv_episode": "capture.openenv",
    "check_scenarios": "check.run",
    "CheckSettings": "check.run",
    "ScenarioReport": "check.usable",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        module = _EXPORTS[name]
        path = module if module.startswith("echo_trl.") else f"{__name__}.{module}"
        return getattr(importlib.import_module(path), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
