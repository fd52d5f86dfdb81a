"""The settings every AWM environment shares, in one place: the pool, the runtime and the TRL factories.

Why one dataclass: the server pool, a runtime and each environment factory take the same knobs (timeouts,
the verifier, rewards, the sandbox, format errors); written once, they cannot drift apart and a caller
passes one object through. The keyword arguments the public functions take are the field names (e.g.
``awm_environment_factory(..., tool_timeout=60)``), mapped onto a copy with :meth:`AWMSettings.replace`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ..scenario.rewards import RewardConfig
from .verifier import Judge

__all__ = ["AWMSettings"]


@dataclass(frozen=True)
class AWMSettings:
    """How AWM environments run.

    Parameters:
        Servers:
            max_servers: at most this many scenario servers live at once (least recently used closed first).
            tool_timeout: seconds one tool call may take; longer is a ``timeout`` step that ends the episode.
            wait_timeout: seconds a call waits for a busy server (all ``max_servers`` in use) before a
                ``PoolError``.
            unsafe_no_sandbox: run the generated server and verifier code uncontained (otherwise refused
                where no sandbox can be had; only for code you trust).
        Verifier:
            verifier_timeout: seconds the task verifier may run; longer is a ``judge_error`` outcome.
            verifier_mode: ``code`` (a verdict) or ``sql`` (evidence for ``judge``).
            judge: the LLM judge SQL-mode verifiers need (see ``echo_trl.envs.awm.runtime.verifier.Judge``).
        Episodes:
            rewards: the reward of each outcome (AWM's: complete 1.0, incomplete 0.1, format error -1.0).
            format_error_penalty: a rollout that made a format error gets the format-error reward, however
                it ended (AWM's rule); off: the verifier's reward.
            stop_on_format_error: end the episode at its first format error (AWM lets it go on).
            verify_turn: ``env_output``: the verifier is a tool the agent calls and its result a turn of
                the conversation; ``omit``: it stays out of the conversation (the official AWM agent).
    """

    max_servers: int = 4
    tool_timeout: float = 30.0
    wait_timeout: float = 600.0
    unsafe_no_sandbox: bool = False
    verifier_timeout: float = 30.0
    verifier_mode: str = "code"
    judge: Judge | None = None
    rewards: RewardConfig = RewardConfig()
    format_error_penalty: bool = True
    stop_on_format_error: bool = False
    verify_turn: str = "env_output"

    def __post_init__(self) -> None:
        if self.rewards is None:  # ``rewards=None`` has always meant "the defaults"
            object.__setattr__(self, "rewards", RewardConfig())

    def replace(self, **changes: Any) -> AWMSettings:
        """A copy with ``changes`` (field names; an unknown one is a ``TypeError``, as for any keyword)."""
        return dataclasses.replace(self, **changes) if changes else self
