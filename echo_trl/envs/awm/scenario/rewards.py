"""Reward types, rewards and the verify observation as the upstream OpenEnv AWM server gives them.

The reference is OpenEnv's ``agent_world_model_env`` (``envs/agent_world_model_env/server/
awm_environment.py`` and ``config.py`` in meta-pytorch/OpenEnv): every step answers a
``reward_type`` and a reward. The local runtime (:mod:`~echo_trl.envs.awm.runtime.episode`) and the OpenEnv client
(:mod:`~echo_trl.envs.awm.capture.openenv`) both take theirs from here, so an episode captured either way carries the
reward types and rewards an OpenEnv server gives for the same calls.

Per step:

* a tool call answered without error: ``tool_call_ok``;
* a tool call answered with an error, classified by its text (lower-cased, first match wins):
  "not found" / "unknown tool" / "no tool" -> ``tool_not_found``; "invalid", "argument",
  "parameter", "required property", "validation error", "missing", "schema" -> ``invalid_args``;
  "timeout" / "timed out" -> ``timeout``; anything else -> ``server_error``. An HTTP 404 of an
  existing tool ("Member 9999 not found") is therefore ``tool_not_found``, as upstream has it;
* rewards: the format errors (``tool_not_found``, ``invalid_args``, ``invalid_action``) get the
  format-error reward (-1.0), ``complete`` 1.0, ``incomplete`` 0.1, every other type 0.0.

Per episode (an echo_trl record field; upstream rewards steps only): the reward of the step it
ended with (the verifier's, or a format error's where the episode stops at its first one), or
``format_error`` (-1.0) when any step was a format error, however the episode ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMAT_ERRORS = frozenset({"tool_not_found", "invalid_args", "invalid_action"})
_NOT_FOUND = ("not found", "unknown tool", "no tool")
_INVALID_ARGS = ("invalid", "argument", "parameter", "required property", "validation error", "missing", "schema")
_TIMEOUT = ("timeout", "timed out")
#: verify_result keys an OpenEnv server returns (code mode): a verdict, or an error message.
_VERIFY_OK_KEYS = ("result", "execution_status", "raw_result")
_VERIFY_ERROR_KEYS = ("result", "execution_status", "error_message")


@dataclass(frozen=True)
class RewardConfig:
    """Episode reward per outcome (AWM defaults)."""

    complete: float = 1.0
    incomplete: float = 0.1
    format_error: float = -1.0
    other: float = 0.0

    def reward(self, reward_type: str) -> float:
        if reward_type in ("tool_not_found", "invalid_args", "format_error"):
            return self.format_error
        return {"complete": self.complete, "incomplete": self.incomplete}.get(reward_type, self.other)


def classify_tool_error(text: str) -> str:
    """``reward_type`` of a tool call answered with the error ``text`` (the upstream keyword rule)."""
    lower = text.lower()
    for reward_type, words in (
        ("tool_not_found", _NOT_FOUND),
        ("invalid_args", _INVALID_ARGS),
        ("timeout", _TIMEOUT),
    ):
        if any(w in lower for w in words):
            return reward_type
    return "server_error"


def step_reward(reward_type: str, rewards: RewardConfig) -> float:
    """The reward of one step of ``reward_type`` (format errors -1.0, complete 1.0, incomplete 0.1, else 0.0)."""
    if reward_type in FORMAT_ERRORS or reward_type == "format_error":
        return rewards.format_error
    return {"complete": rewards.complete, "incomplete": rewards.incomplete}.get(reward_type, rewards.other)


def episode_outcome(reward_type: str, reward: float, format_errors: int, rewards: RewardConfig) -> tuple[str, float]:
    """(reward_type, reward) of an episode that ended with a step of ``reward_type`` worth ``reward``.

    Any format error on the way keeps the episode at the format-error reward, whatever the
    verifier said and whether the episode was verified at all (AWM's rule).
    """
    if format_errors and reward_type not in FORMAT_ERRORS:
        return "format_error", rewards.format_error
    return reward_type, reward


def verify_observation(
    reward_type: str,
    verify_result: dict[str, Any],
    *,
    scenario: str,
    task: str,
    task_idx: int | None,
    steps_taken: int,
    verifier_mode: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The verify step's observation as an OpenEnv server shapes it, and the details it leaves out.

    Upstream answers ``{reward_type, scenario, task, task_idx, verify_result, steps_taken}``
    with a three-key ``verify_result``, ``{reward_type, scenario, task, task_idx, error}`` when
    the task has no verifier of the mode, and ``{reward_type, error}`` for an episode started
    without a task index. What echo_trl's verifier adds (mode, verifier source, error type) is
    returned apart, for the step's ``metadata``.
    """
    if task_idx is None:
        return {"reward_type": "no_verifier", "error": "Cannot verify: no task specified at reset"}, {}
    head = {"reward_type": reward_type, "scenario": scenario, "task": task, "task_idx": task_idx}
    if reward_type == "no_verifier":
        return {**head, "error": f"No {verifier_mode} verifier available for this task"}, {}
    ok = verify_result.get("execution_status") == "success"
    shaped = {
        "result": verify_result.get("result", "others"),
        "execution_status": "success" if ok else "error",
        **(
            {"raw_result": verify_result.get("raw_result")}
            if ok
            else {"error_message": str(verify_result.get("error_message") or "")}
        ),
    }
    kept = _VERIFY_OK_KEYS if ok else _VERIFY_ERROR_KEYS
    details = {k: v for k, v in verify_result.items() if k not in kept}
    if verify_result.get("execution_status") not in ("success", "error"):
        details["execution_status"] = verify_result.get("execution_status")
    return {**head, "verify_result": shaped, "steps_taken": steps_taken}, details
