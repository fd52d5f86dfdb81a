"""What plays an AWM episode for ``echo-trl capture``, and the pieces every policy shares.

A policy (:class:`Policy`) plays an episode (a local :class:`~echo_trl.envs.awm.runtime.episode.Episode`
or a remote OpenEnv one) to its end; :func:`play_episode` runs it and returns the record. The prompt a
model policy starts from (:func:`live_prompt`) and the text an observation shows the model
(:func:`observation_text`) are built by the functions the dataset builder renders the recording with,
so the model saw at capture time what it is trained on.
"""

from __future__ import annotations

from typing import Any, Protocol

from ....data.readers.prompt import prompt_messages
from ....data.readers.tools import serialize_output, tool_schemas
from ....errors import EchoTrlError
from ....roles import Message
from ..runtime.episode import Episode


class PolicyError(EchoTrlError):
    """A policy that cannot be loaded (bad replay file, model path ...)."""


class Policy(Protocol):
    """What plays an episode: a replay or a model policy.

    A policy that waits on something outside (an inference server) also has ``stop()``: called from another
    thread when the run is stopped, it ends that wait, so the episodes in flight end without it.
    """

    def play(self, episode: Any, episode_index: int = 0) -> None: ...


def play_episode(
    policy: Policy, episode: Any, episode_index: int = 0, verify_turn: str = "env_output"
) -> dict[str, Any]:
    """Play ``episode`` to its end and return its record (the OpenEnv capture shape).

    The policy plays; the verifier runs when the policy did not end the episode; the episode is
    closed whatever happens. ``episode`` is a local :class:`Episode` or a remote one (OpenEnv);
    ``verify_turn``: where the record keeps the verifier step (see :meth:`Episode.record`).
    """
    try:
        policy.play(episode, episode_index)
        if not episode.done:
            episode.verify()
    finally:
        episode.close()
    return episode.record(verify_turn)


def observation_text(obs: dict[str, Any]) -> str:
    """What the agent saw of an observation (the text ``echo_trl.data.readers.awm`` renders as ``env_output``)."""
    return "\n".join(
        serialize_output(obs[k]) for k in ("tool_result", "error", "verify_result") if obs.get(k) is not None
    )


def live_prompt(system_prompt: str | None, episode: Episode) -> tuple[list[Message], list[dict[str, Any]]]:
    """The prompt messages and tool schemas a model policy starts ``episode`` with.

    Built by the functions the dataset builder renders the episode's recording with
    (:func:`~echo_trl.data.readers.prompt.prompt_messages`, :func:`~echo_trl.data.readers.tools.tool_schemas`), so
    the model saw at capture time the prompt it is trained on.
    """
    return prompt_messages(system_prompt, episode.scenario, episode.task), tool_schemas(episode.runtime.tools)
