"""Run Agent World Model (AWM) scenarios locally: data, contained server, MCP, verifier, episodes.

One module per job::

    scenario.py     gen_*.jsonl (directory or Hub cache) -> Scenario; ScenarioError names the field
    database.py     schema + samples -> SQLite image; copies with the backup API
    sandbox.py      bubblewrap containment for generated code (detect, apply, refuse) + process cleanup
    bwrap_args.py   the bubblewrap command line of one sandbox, its limits and layers
    seccomp.py      the sandbox's seccomp filter (a classic-BPF program, assembled here)
    keyring.py      a fresh session keyring for every sandbox
    hostio.py       host-side I/O at the boundary: sealed inputs, bounded reads, no-follow removal
    cgroups.py      per-sandbox memory + process caps through a cgroup, where the host allows one
    server.py       the generated FastAPI app + fastapi-mcp on a Unix socket, in the sandbox
    mcp_client.py   synchronous MCP client session (streamable HTTP over the socket)
    verifier.py     code verifiers in a short-lived sandboxed process -> reward
    episode.py      AWMRuntime (one live scenario) and Episode (steps in the OpenEnv capture shape)
    rewards.py      reward type and reward per step, episode outcome, verify observation: the upstream server's
    policy.py       replay scripts / recorded episodes and model policies for ``echo-trl capture``
    openai_policy.py a model behind an OpenAI-compatible server (vLLM, transformers serve ...), sampled turns kept
    collect.py      many scenarios / tasks / episodes in flight over the pool, resumable output, the summary
    pool.py         scenario servers started lazily, pooled under a bound; sessions own their databases
    environment.py  TRL ``environment_factory`` (online GRPO / ECHO), one or many scenarios
    agent_format.py the official AWM agent's format, live (capture model policy, two-tool TRL environment)
    openenv.py      client for an upstream OpenEnv ``agent_world_model_env`` server

Heavy imports happen on first use of a name.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ScenarioSource": "scenario",
    "Scenario": "scenario",
    "ScenarioError": "scenario",
    "HUB_REPO_ID": "scenario",
    "build_database": "database",
    "copy_database": "database",
    "detect_containment": "sandbox",
    "Containment": "sandbox",
    "ScenarioServer": "server",
    "MCPSession": "mcp_client",
    "run_verifier": "verifier",
    "RewardConfig": "verifier",
    "VerifierConfigError": "verifier",
    "AWMRuntime": "episode",
    "Episode": "episode",
    "ReplayPolicy": "policy",
    "ModelPolicy": "policy",
    "PolicyError": "policy",
    "OpenAIClient": "openai_policy",
    "OpenAIPolicy": "openai_policy",
    "InferenceServerError": "openai_policy",
    "awm_environment_factory": "environment",
    "awm_task_dataset": "environment",
    "awm_environment_factories": "environment",
    "ServerPool": "pool",
    "PoolError": "pool",
    "awm_agent_environment_factory": "agent_format",
    "AWMAgentModelPolicy": "agent_format",
    "close_environments": "environment",
    "AWMEnvironment": "environment",
    "OpenEnvAWMClient": "openenv",
    "capture_openenv_episode": "openenv",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
