"""A built dataset's card (its ``README.md``, pushed with it to the Hub).

It cites ECHO and AWM with the entries every card uses (:mod:`echo_trl.data.citations`).
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..roles import MESSAGE_ROLES
from .citations import AWM_CITATION, ECHO_CITATION

__all__ = ["dataset_card"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 scenario``, ``2 scenarios`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def role_counts(ds) -> dict[str, dict[str, int]]:
    """Messages and characters per role (tokenizer-free; ``echo-trl stats`` counts tokens)."""
    counts: dict[str, dict[str, int]] = {r.value: {"messages": 0, "chars": 0} for r in MESSAGE_ROLES}
    for row in ds:
        for m in row["prompt"]:
            counts["context"]["messages"] += 1
            counts["context"]["chars"] += len(m["content"] or "")
        for m, warns in zip(row["completion"], row["warnings"], strict=True):
            role = "action" if m["role"] == "assistant" else "env_output" if m["role"] == "tool" else "context"
            counts[role]["messages"] += 1
            counts[role]["chars"] += len(m["content"] or "") + sum(
                len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in m["tool_calls"] or []
            )
            counts["warning"]["messages"] += len(warns)
            counts["warning"]["chars"] += sum(len(w) for w in warns)
    return counts


def dataset_card(ds, *, title: str = "ECHO trajectories from Agent World Model episodes", skipped: int = 0) -> str:
    """The ``README.md`` written next to a built dataset (and pushed with it to the Hub)."""
    by_scenario: dict[str, Counter] = defaultdict(Counter)
    for scenario, group, reward in zip(ds["scenario"], ds["group_id"], ds["reward"], strict=True):
        c = by_scenario[scenario]
        c["episodes"] += 1
        c[f"group:{group}"] = 1
        c["reward_sum"] += reward
    roles = role_counts(ds)
    formats = ", ".join(f"`{f}`" for f in sorted(set(ds["format"] if "format" in ds.column_names else [])))
    scen_rows = "\n".join(
        f"| {s} | {c['episodes']} | {sum(1 for k in c if k.startswith('group:'))} "
        f"| {c['reward_sum'] / c['episodes']:.3f} |"
        for s, c in sorted(by_scenario.items())
    )
    role_rows = "\n".join(f"| `{r}` | {v['messages']} | {v['chars']} |" for r, v in roles.items())
    skipped_note = f", {plural(skipped, 'invalid record')} skipped (see skipped.jsonl)" if skipped else ""
    return f"""---
license: cc-by-4.0
tags:
- echo-trl
- agent
- tool-use
- reinforcement-learning
- agent-world-model
pretty_name: "{title}"
---

# {title}

Agent trajectories for echo_trl ([ECHO](https://arxiv.org/abs/2605.24517): GRPO on the agent's action tokens
plus lambda * cross-entropy on the environment's observation tokens), in TRL's conversational
prompt-completion format. Built with `echo-trl build-dataset`: {plural(len(ds), "episode")},
{plural(len(by_scenario), "scenario")}{skipped_note}.
Conversation format: {formats or "`chat-template`"} (see the `format` column).

## Schema

| column | type | meaning |
|---|---|---|
| `prompt` | list of messages | system prompt and the user's task (context) |
| `completion` | list of messages | assistant tool calls and `tool` messages, in order |
| `tools` | list of JSON strings | the tool schemas the agent could call |
| `warnings` | list (per completion message) of lists of strings | harness warnings, kept out of the env output |
| `reward` | float | episode reward (AWM: complete 1.0, incomplete 0.1, format error -1.0, else 0.0) |
| `group_id` | string | `scenario/task_idx`: trajectories of the same task share it (GRPO groups) |
| `scenario`, `task_idx` | string, int | AWM provenance |
| `behavior_logprobs` | list of floats or null | per action token, when recorded at rollout time |
| `format` | string | conversation format: `chat-template` or `awm-agent` (the official AWM agent's) |

A tool call's `arguments` is stored as JSON text (Arrow needs one type per column).

## Roles

| role | source | loss |
|---|---|---|
| `context` | system prompt, tool schemas, task, chat-template scaffolding | none |
| `action` | assistant tool calls, with their end-of-turn token | GRPO |
| `env_output` | tool results, errors, verifier output | ECHO world-model cross-entropy |
| `warning` | harness warnings | excluded by default |

Counts (messages and characters; `echo-trl stats DATASET --tokenizer MODEL` gives exact tokens):

| role | messages | characters |
|---|---|---|
{role_rows}

## Scenarios

| scenario | episodes | tasks | mean reward |
|---|---|---|---|
{scen_rows}

## License and attribution

Derived from Agent World Model environments (AgentWorldModel-1K, Snowflake AI Research and
UNC-Chapel Hill, CC-BY-4.0, arXiv 2602.10090) where the scenarios come from there.

## Citation

```bibtex
{ECHO_CITATION}
{AWM_CITATION}
```
"""
