"""The prompt of an AWM episode: system prompt and task, as every path renders it.

The live model policies, the online task dataset and the dataset builder all build the prompt
with :func:`prompt_messages`, so an episode captured live and the same episode built from its
recording start with the same text.
"""

from __future__ import annotations

from ...roles import Message

DEFAULT_SYSTEM_PROMPT = (
    "You are an agent operating in the '{scenario}' environment. Use the available tools to "
    "complete the user's task. Call one tool at a time and read its result before the next call."
)


def fill_system_prompt(template: str, scenario: str) -> str:
    """``template`` with ``{scenario}`` filled in; every other brace is text (JSON examples, code)."""
    return template.replace("{scenario}", scenario)


def prompt_messages(system_prompt: str | None, scenario: str, task: str) -> list[Message]:
    """The prompt messages: the system prompt (``{scenario}`` filled in; none when empty) and the task."""
    prompt: list[Message] = []
    if system_prompt:
        prompt.append({"role": "system", "content": fill_system_prompt(system_prompt, scenario)})
    prompt.append({"role": "user", "content": task})
    return prompt
