"""A built dataset's card (its ``README.md``, pushed with it to the Hub).

It cites ECHO and AWM with the entries every card uses (:mod:`echo_trl.data.citations`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from ..roles import MESSAGE_ROLES
from .citations import AWM_CITATION, ECHO_CITATION

__all__ = ["CardCounts", "dataset_card"]

#: Rows per Arrow batch when a whole dataset is counted.
COUNT_BATCH = 1024


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 scenario``, ``2 scenarios`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else many or word + 's'}"


def _lengths(strings) -> int:
    """Characters (code points, as ``len``) of an Arrow string array, nulls as empty."""
    return int(pc.sum(pc.fill_null(pc.utf8_length(strings), 0)).as_py() or 0)


@dataclass
class CardCounts:
    """What the card says about a dataset, counted one Arrow batch at a time (never a row as Python objects):
    rows, formats, messages and characters per role (tokenizer-free; ``echo-trl stats`` counts tokens) and,
    per scenario, episodes, tasks and the reward sum. The streaming build counts each batch it writes; a
    finished dataset is counted by :meth:`of_dataset`. Parts counted apart add up (:meth:`merge`)."""

    rows: int = 0
    formats: set[str] = field(default_factory=set)
    roles: dict[str, dict[str, int]] = field(
        default_factory=lambda: {r.value: {"messages": 0, "chars": 0} for r in MESSAGE_ROLES}
    )
    scenarios: dict[str, list] = field(default_factory=dict)  # scenario -> [episodes, {group ids}, reward sum]

    @classmethod
    def of_dataset(cls, ds) -> CardCounts:
        counts = cls()
        for table in ds.with_format("arrow").iter(batch_size=COUNT_BATCH):
            for batch in table.to_batches():
                counts.add(batch)
        return counts

    def add(self, batch: pa.RecordBatch) -> None:
        """Count the rows of one Arrow batch of the ECHO schema."""
        self.rows += batch.num_rows
        names = batch.schema.names
        if "format" in names:
            self.formats.update(f for f in pc.unique(batch.column("format")).to_pylist() if f is not None)
        prompt = pc.list_flatten(batch.column("prompt"))
        self._add("context", len(prompt), _lengths(prompt.field("content")))
        completion = pc.list_flatten(batch.column("completion"))
        roles = pc.fill_null(completion.field("role"), "")
        calls_per_message = completion.field("tool_calls")
        calls = pc.list_flatten(calls_per_message)
        call_role = pc.take(roles, pc.list_parent_indices(calls_per_message))
        function = calls.field("function")
        call_chars = pc.add(
            pc.fill_null(pc.utf8_length(function.field("arguments")), 0),
            pc.fill_null(pc.utf8_length(function.field("name")), 0),
        )
        content_chars = pc.fill_null(pc.utf8_length(completion.field("content")), 0)
        for role, key in (("assistant", "action"), ("tool", "env_output"), (None, "context")):
            is_role = (
                pc.invert(pc.is_in(roles, pa.array(["assistant", "tool"]))) if role is None else pc.equal(roles, role)
            )
            of_calls = (
                pc.invert(pc.is_in(call_role, pa.array(["assistant", "tool"])))
                if role is None
                else pc.equal(call_role, role)
            )
            chars = pc.sum(pc.filter(content_chars, is_role)).as_py() or 0
            chars += pc.sum(pc.filter(call_chars, of_calls)).as_py() or 0
            self._add(key, int(pc.sum(pc.cast(is_role, pa.int64())).as_py() or 0), int(chars))
        warnings = pc.list_flatten(pc.list_flatten(batch.column("warnings")))
        self._add("warning", len(warnings), _lengths(warnings))
        columns = [batch.column(c).to_pylist() for c in ("scenario", "group_id", "reward")]
        for scenario, group, reward in zip(*columns, strict=True):
            entry = self.scenarios.setdefault(scenario, [0, set(), 0.0])
            entry[0] += 1
            entry[1].add(group)
            entry[2] += reward

    def _add(self, role: str, messages: int, chars: int) -> None:
        self.roles[role]["messages"] += messages
        self.roles[role]["chars"] += chars

    def merge(self, other: CardCounts) -> None:
        """Add the counts of a later part of the same dataset."""
        self.rows += other.rows
        self.formats |= other.formats
        for role, v in other.roles.items():
            self._add(role, v["messages"], v["chars"])
        for scenario, (episodes, groups, reward) in other.scenarios.items():
            entry = self.scenarios.setdefault(scenario, [0, set(), 0.0])
            entry[0] += episodes
            entry[1] |= groups
            entry[2] += reward


def dataset_card(counts, *, title: str = "ECHO trajectories from Agent World Model episodes", skipped: int = 0) -> str:
    """The ``README.md`` written next to a built dataset (and pushed with it to the Hub), from its
    :class:`CardCounts` (a ``datasets.Dataset`` is counted first)."""
    if not isinstance(counts, CardCounts):
        counts = CardCounts.of_dataset(counts)
    formats = ", ".join(f"`{f}`" for f in sorted(counts.formats))
    scen_rows = "\n".join(
        f"| {s} | {episodes} | {len(groups)} | {reward / episodes:.3f} |"
        for s, (episodes, groups, reward) in sorted(counts.scenarios.items())
    )
    role_rows = "\n".join(f"| `{r}` | {v['messages']} | {v['chars']} |" for r, v in counts.roles.items())
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
prompt-completion format. Built with `echo-trl build-dataset`: {plural(counts.rows, "episode")},
{plural(len(counts.scenarios), "scenario")}{skipped_note}.
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
