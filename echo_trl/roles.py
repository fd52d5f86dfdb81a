"""Roles of the tokens in an agent trajectory, and the trajectory itself.

A trajectory is a chat (TRL's conversational prompt-completion format) plus the knowledge of
which message plays which role. Per-token roles are derived later, from the rendered chat
(see ``tokenization.py``); here every *message* already has exactly one role.

:class:`Role` is the one role vocabulary of the package: its string value names a role (metrics,
annotations, message roles) and :attr:`Role.code` is the ``int8`` stored per token in
``RoleTokens.roles``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Role(StrEnum):
    """What a token is, and therefore which loss (if any) trains on it."""

    CONTEXT = "context"  # system prompt, tool schemas, task, template scaffolding: no loss
    ACTION = "action"  # what the agent generated (tool calls, text, end-of-turn): GRPO
    ENV_OUTPUT = "env_output"  # tool results, errors, verifier output: ECHO world-model CE
    WARNING = "warning"  # harness boilerplate: excluded by default
    OBSERVATION = "observation"  # tokens only: the template's wrapper around tool messages

    @property
    def code(self) -> int:
        """This role's value in per-token role arrays (its position in the enum: 0 ... 4)."""
        return _CODES[self]

    @classmethod
    def of_code(cls, code: int) -> Role:
        return _BY_CODE[int(code)]


_BY_CODE = tuple(Role)
_CODES = {role: i for i, role in enumerate(_BY_CODE)}

#: Roles a whole message can have (``observation`` exists only per token).
MESSAGE_ROLES = (Role.CONTEXT, Role.ACTION, Role.ENV_OUTPUT, Role.WARNING)

#: The three ``world_loss_target`` settings, from narrowest to widest.
WORLD_LOSS_TARGETS = ("env_only", "observation", "all")

#: Roles a chat message can have (``Message["role"]``), in the OpenAI / TRL conversational format.
CHAT_ROLES = ("system", "user", "assistant", "tool")

Message = dict[str, Any]


def tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One entry of an assistant message's ``tool_calls`` in the OpenAI / TRL format."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


@dataclass
class Trajectory:
    """One episode as chat messages with message-level roles.

    ``prompt`` holds the context (system prompt and the user's task); ``completion`` alternates
    assistant tool-call messages (``action``) and ``tool`` messages (``env_output``).
    ``warnings[i]`` holds harness warnings that arrived with ``completion[i]``; they are kept
    out of the message text so that the env-output tokens are exactly what the environment said.
    """

    prompt: list[Message]
    completion: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[list[str]] = field(default_factory=list)
    reward: float = 0.0
    scenario: str = ""
    task_idx: int = -1
    group_id: str = ""
    behavior_logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if not self.warnings:
            self.warnings = [[] for _ in self.completion]
        if len(self.warnings) != len(self.completion):
            raise ValueError(
                f"warnings has {len(self.warnings)} entries for {len(self.completion)} completion messages"
            )
        if not self.group_id:
            self.group_id = default_group_id(self.scenario, self.task_idx)

    @property
    def messages(self) -> list[Message]:
        return [*self.prompt, *self.completion]

    def message_roles(self) -> list[Role]:
        """The role of each message in ``messages`` (prompt first, then completion)."""
        return [Role.CONTEXT] * len(self.prompt) + [message_role(m) for m in self.completion]


def default_group_id(scenario: str, task_idx: int) -> str:
    """``scenario/task_idx``: the GRPO group of a trajectory that names none (trajectories of one task)."""
    return f"{scenario}/{task_idx}"


def message_role(message: Message) -> Role:
    """Role of one completion message: the agent's turns act, everything else is observed."""
    role = message.get("role")
    if role == "assistant":
        return Role.ACTION
    if role == "tool":
        return Role.ENV_OUTPUT
    return Role.CONTEXT
