"""Policies that play AWM episodes for ``echo-trl capture``: scripted replay, or a local model.

Replay file format (``--policy replay:FILE``)
---------------------------------------------
``.jsonl`` (one scripted episode per line) or ``.json`` (a list of them, or ``{"episodes": [...]}``)::

    {"task_idx": 0,                                   # required: which task this script plays
     "scenario": "content_platform_1",                # optional: must match the captured scenario
     "label": "reference",                            # optional: kept in the episode metadata
     "calls": [{"tool_name": "search_channels", "arguments": {"query": "Kurzgesagt"}},
               {"tool_name": "subscribe_to_channel", "arguments": {"channel_id": 1}}],
     "final_answer": "Subscribed.",                   # optional: passed to the verifier
     "verify": true}                                  # optional (default true): end with the verifier

``steps`` is accepted for ``calls`` (``data/awm_scenarios/solutions.jsonl`` uses it), ``tool`` /
``name`` for ``tool_name`` and ``args`` for ``arguments``. A task may
have several scripts (e.g. a reference solution and realistic failures); episode *i* of a task
plays its script ``i mod n``, so ``--episodes N`` gives groups whose rewards differ. A script
stops early when the environment ends the episode (server failure; a format error too with
``format_error_ends_episode``).

Recorded episodes are replay input too: the OpenEnv capture shape (what ``echo-trl capture``
writes) and AWM's ``trajectory.json``, as ``.json`` / ``.jsonl`` files or directories of them,
read with :func:`echo_trl.data.episode_files.iter_episode_records` and validated by
:func:`echo_trl.data.records.awm_episode_to_trajectory` (errors name file, record and field). Their tool
calls are replayed (a final ``verify`` step, or a ``verification`` entry, becomes the verifier
run with the recorded final answer), and every step is compared with the recording: its
observation text after :func:`normalize_timestamps` (databases built from AWM samples carry
their creation time), and its ``reward_type`` and reward where the recording has them. The step
gets ``"replay_match": true|false`` (and ``replay_diff``, naming each field that differs, with
the recorded and the live value), the episode a note with the count.

Model policy (``--policy model:PATH``)
--------------------------------------
Generates each assistant turn with the model's chat template (tools rendered by the template),
samples with ``transformers`` ``generate``, parses tool calls the way TRL's ``GRPOTrainer``
does (``trl.chat_template_utils.add_response_schema`` + ``parse_response``) and records the
per-token log-probabilities of the sampled tokens under the sampling temperature
(``log_softmax(logits / T)``, TRL's convention) as ``behavior_logprobs`` (episode level, in
generation order) and per step under ``policy`` (``text``, ``token_ids``, ``logprobs``). A turn
without tool calls is the agent's final answer: the verifier runs with it. Several tool calls
in one turn are executed (and recorded) one step each.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...data.episode_files import iter_episode_records
from ...data.prompt import prompt_messages
from ...data.records import awm_episode_to_trajectory
from ...data.tools import serialize_output, tool_schemas
from ...errors import EchoTrlError, EpisodeError
from ...roles import Message
from .episode import Episode


class PolicyError(EchoTrlError):
    """A policy that cannot be loaded (bad replay file, model path ...)."""


class Policy(Protocol):
    """What plays an episode: a replay or a model policy."""

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


# --------------------------------------------------------------------------------------------
# Replay


_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_DATE = re.compile(r"(?<![\d-])\d{4}-\d{2}-\d{2}(?![\d-])")


def normalize_timestamps(text: str) -> str:
    """``text`` with ISO dates and date-times replaced by ``<date>`` / ``<datetime>``.

    Why: AWM sample rows are inserted with ``datetime('now', ...)``, so the same episode replayed
    on another day differs in exactly these places and nowhere else.
    """
    return _DATE.sub("<date>", _DATETIME.sub("<datetime>", text))


def observation_text(obs: dict[str, Any]) -> str:
    """What the agent saw of an observation (the text ``echo_trl.data.awm`` renders as ``env_output``)."""
    return "\n".join(
        serialize_output(obs[k]) for k in ("tool_result", "error", "verify_result") if obs.get(k) is not None
    )


@dataclass
class Script:
    task_idx: int
    calls: list[tuple[str, Any]]
    final_answer: str | None = None
    verify: bool = True
    label: str = ""
    scenario: str | None = None
    source: str = ""
    expected: list[str] | None = None  # recorded observation text per call (+ the verifier's): replay check
    outcomes: list[tuple[Any, Any]] | None = None  # recorded (reward_type, reward) per step, None where absent


class ReplayPolicy:
    """Plays scripted or recorded tool-call sequences (see the module docstring for the formats)."""

    def __init__(self, scripts: list[Script]):
        self.scripts = scripts

    @classmethod
    def from_file(cls, path: str | Path) -> ReplayPolicy:
        """Scripts and recorded episodes from a file or a directory (``.json`` / ``.jsonl``)."""
        path = Path(path)
        if not path.exists():
            raise PolicyError(f"replay file not found: {path}")
        scripts: list[Script] = []
        for rec in iter_episode_records([path]):
            source = f"{rec.source}:{rec.record}" if rec.record else rec.source
            if rec.error is not None:
                raise PolicyError(str(rec.error))
            items = rec.data.get("episodes") if isinstance(rec.data, dict) and "episodes" in rec.data else [rec.data]
            if not isinstance(items, list):
                raise PolicyError(f"{source}: episodes: expected a list of scripts")
            for i, item in enumerate(items):
                where = source if len(items) == 1 and items[0] is rec.data else f"{source}:episodes[{i}]"
                scripts.append(
                    _recorded(where, rec.source, rec.record, item)
                    if is_recorded_episode(item)
                    else _script(where, item)
                )
        if not scripts:
            raise PolicyError(f"no replay scripts or recorded episodes in {path}")
        return cls(scripts)

    @property
    def recorded(self) -> bool:
        """Whether every script is a recorded episode (then each is replayed once by default)."""
        return all(s.expected is not None for s in self.scripts)

    def count(self, scenario: str, task_idx: int) -> int:
        return sum(1 for s in self.scripts if s.task_idx == task_idx and s.scenario in (None, scenario))

    def tasks(self, scenario: str) -> list[int]:
        return sorted({s.task_idx for s in self.scripts if s.scenario in (None, scenario)})

    def script_for(self, scenario: str, task_idx: int, episode_index: int) -> Script:
        mine = [s for s in self.scripts if s.task_idx == task_idx and s.scenario in (None, scenario)]
        if not mine:
            raise PolicyError(f"the replay file has no script for scenario {scenario!r} task {task_idx}")
        return mine[episode_index % len(mine)]

    def play(self, episode: Episode, episode_index: int = 0) -> None:
        script = self.script_for(
            episode.scenario, episode.task_idx if episode.task_idx is not None else -1, episode_index
        )
        episode.notes.append(f"replay {script.source}" + (f" ({script.label})" if script.label else ""))
        observed: list[dict[str, Any]] = []
        for name, args in script.calls:
            observed.append(episode.call_tool(name, args))
            if observed[-1].get("done"):
                break
        if not episode.done:
            if script.verify:
                observed.append(episode.verify(script.final_answer))
            else:
                episode.end_without_verifying("stopped")
        if script.expected is not None:
            _check_replay(episode, script.expected, script.outcomes or [], observed)


def replay_diff(step: dict[str, Any], text: str, outcome: tuple[Any, Any] | None) -> list[str]:
    """The fields in which a replayed ``step`` differs from the recorded text and (reward_type, reward)."""
    diff = []
    if normalize_timestamps(observation_text(step["observation"])) != normalize_timestamps(text):
        diff.append("observation text")
    reward_type, reward = outcome or (None, None)
    live_type, live = step["observation"].get("reward_type"), step.get("reward")
    if reward_type is not None and live_type != reward_type:
        diff.append(f"reward_type {reward_type} -> {live_type}")
    if reward is not None and (live is None or abs(float(live) - float(reward)) > 1e-9):
        diff.append(f"reward {reward} -> {live}")
    return diff


def _check_replay(
    episode: Episode, expected: list[str], outcomes: list[tuple[Any, Any]], observed: list[dict[str, Any]]
) -> None:
    """Mark each replayed step with whether it equals the recorded one (timestamps aside) and how it differs."""
    steps = episode.steps[-len(observed) :] if observed else []
    matches = []
    for i, (step, want) in enumerate(zip(steps, expected, strict=False)):
        diff = replay_diff(step, want, outcomes[i] if i < len(outcomes) else None)
        step["replay_match"] = not diff
        if diff:
            step["replay_diff"] = diff
        matches.append(not diff)
    episode.notes.append(
        f"replay check: {sum(matches)}/{len(expected)} observations match the recording"
        + (
            f" ({len(expected) - len(observed)} not replayed: the episode ended)"
            if len(observed) < len(expected)
            else ""
        )
    )


def is_recorded_episode(data: Any) -> bool:
    """A recorded episode (OpenEnv capture shape or AWM ``trajectory.json``), not a replay script."""
    if not isinstance(data, dict):
        return False
    steps = data.get("steps")
    return "trajectory" in data or (
        isinstance(steps, list) and any(isinstance(s, dict) and isinstance(s.get("action"), dict) for s in steps)
    )


def _is_verifier_call(name: str, arguments: Any) -> bool:
    return name == "verify" and isinstance(arguments, dict) and set(arguments) <= {"verifier_mode", "final_answer"}


def _recorded(where: str, source: str, record: str, data: dict[str, Any]) -> Script:
    """A recorded episode as a script whose ``expected`` holds the recorded observations."""
    verification = data.get("verification")
    body = (
        {**data, "steps": [*data["steps"], verification]}
        if isinstance(verification, dict) and isinstance(data.get("steps"), list)
        else data
    )
    if body.get("reward") is None:  # replay needs no reward; a recording without one is still replayable
        body = {**body, "reward": 0.0}
    try:
        traj = awm_episode_to_trajectory(body, source=source, record=record or None, system_prompt=None)
    except EpisodeError as exc:
        raise PolicyError(f"recorded episode: {exc}") from None
    outcomes = [_recorded_outcome(s) for s in _recorded_steps(body)]
    calls: list[tuple[str, Any]] = []
    expected: list[str] = []
    for message in traj.completion:
        if message["role"] == "tool":
            expected.append(message["content"])
            continue
        fn = message["tool_calls"][0]["function"]
        args = fn["arguments"]
        calls.append((fn["name"], args["_raw"] if set(args) == {"_raw"} else args))
    verify, final_answer = False, None
    if calls and _is_verifier_call(*calls[-1]):
        verify, final_answer = True, calls.pop()[1].get("final_answer")
    return Script(traj.task_idx, calls, final_answer, verify, "recorded", traj.scenario, where, expected, outcomes)


def _recorded_steps(body: dict[str, Any]) -> list[Any]:
    """The recorded steps in replay order (OpenEnv capture shape, or trajectory.json less list_tools)."""
    if "trajectory" in body and isinstance(body["trajectory"], list):
        return [e for e in body["trajectory"] if not (isinstance(e, dict) and e.get("action") == "list_tools")]
    return list(body.get("steps") or [])


def _recorded_outcome(step: Any) -> tuple[Any, Any]:
    """(reward_type, reward) a recorded step carries, None for what it lacks."""
    if not isinstance(step, dict):
        return None, None
    obs = step.get("observation") if isinstance(step.get("observation"), dict) else step
    reward = step.get("reward")
    return obs.get("reward_type"), reward if isinstance(reward, (int, float)) and not isinstance(
        reward, bool
    ) else None


def _script(source: str, d: Any) -> Script:
    if not isinstance(d, dict):
        raise PolicyError(f"{source}: expected an object, got {type(d).__name__}")
    idx = d.get("task_idx")
    if not isinstance(idx, int) or isinstance(idx, bool):
        raise PolicyError(f"{source}: task_idx: expected an integer, got {idx!r}")
    key = "calls" if "calls" in d else "steps" if "steps" in d else None
    if key is None:
        raise PolicyError(f"{source}: calls: missing (a list of tool calls; 'steps' is accepted too)")
    calls = d[key]
    if not isinstance(calls, list):
        raise PolicyError(f"{source}: {key}: expected a list")
    out = []
    for i, c in enumerate(calls):
        if not isinstance(c, dict):
            raise PolicyError(f"{source}: {key}[{i}]: expected an object")
        name = c.get("tool_name", c.get("tool", c.get("name")))
        if not isinstance(name, str) or not name:
            raise PolicyError(f"{source}: {key}[{i}].tool_name: expected a non-empty string")
        out.append((name, c.get("arguments", c.get("args", {}))))
    fa = d.get("final_answer")
    if fa is not None and not isinstance(fa, str):
        raise PolicyError(f"{source}: final_answer: expected a string")
    scenario = d.get("scenario")
    if scenario is not None and not isinstance(scenario, str):
        raise PolicyError(f"{source}: scenario: expected a string")
    return Script(idx, out, fa, bool(d.get("verify", True)), str(d.get("label", "")), scenario, source)


# --------------------------------------------------------------------------------------------
# Model


def live_prompt(system_prompt: str | None, episode: Episode) -> tuple[list[Message], list[dict[str, Any]]]:
    """The prompt messages and tool schemas a model policy starts ``episode`` with.

    Built by the functions the dataset builder renders the episode's recording with
    (:func:`~echo_trl.data.prompt.prompt_messages`, :func:`~echo_trl.data.tools.tool_schemas`), so
    the model saw at capture time the prompt it is trained on.
    """
    return prompt_messages(system_prompt, episode.scenario, episode.task), tool_schemas(episode.runtime.tools)


@dataclass
class ModelPolicy:
    """Samples actions from a local causal LM (see the module docstring)."""

    model: Any
    tokenizer: Any
    max_steps: int = 8
    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    system_prompt: str | None = None
    seed: int | None = 0
    _calls: int = field(default=0, repr=False)

    @classmethod
    def from_pretrained(cls, path: str, *, trust_remote_code: bool = False, **kwargs: Any) -> ModelPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=trust_remote_code)
        except (OSError, ValueError) as exc:
            raise PolicyError(f"cannot load model {path!r}: {exc}") from None
        if tokenizer.chat_template is None:
            raise PolicyError(f"the tokenizer at {path!r} has no chat template (a tool-calling template is needed)")
        model.eval()
        return cls(model, tokenizer, **kwargs)

    def __post_init__(self) -> None:
        from trl.chat_template_utils import add_response_schema

        if (
            getattr(self.tokenizer, "response_template", None) is None
            and getattr(self.tokenizer, "response_schema", None) is None
        ):
            try:
                self.tokenizer = add_response_schema(self.tokenizer)
            except ValueError as exc:
                raise PolicyError(f"TRL cannot parse tool calls for this chat template: {exc}") from None

    def _generate(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[list[int], list[int], list[float]]:
        import torch

        prompt_ids = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        if isinstance(prompt_ids, dict) or hasattr(prompt_ids, "keys"):
            prompt_ids = prompt_ids["input_ids"]
        prompt_ids = list(prompt_ids)
        if self.seed is not None:
            torch.manual_seed(self.seed + self._calls)
        self._calls += 1
        inputs = torch.tensor([prompt_ids], device=self.model.device)
        with torch.no_grad():
            out = self.model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                do_sample=True,
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=0,
                max_new_tokens=self.max_new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
                pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
            )
        completion = out.sequences[0, len(prompt_ids) :].tolist()
        logprobs = []
        for tok, logits in zip(completion, out.logits, strict=False):
            lp = torch.log_softmax(logits[0].float() / self.temperature, dim=-1)[tok]
            logprobs.append(float(lp))
        return prompt_ids, completion, logprobs

    def play(self, episode: Episode, episode_index: int = 0) -> None:
        from trl.chat_template_utils import parse_response

        messages, tools = live_prompt(self.system_prompt, episode)
        episode.behavior_logprobs = []
        for _ in range(self.max_steps):
            prompt_ids, ids, logprobs = self._generate(messages, tools)
            episode.behavior_logprobs.extend(logprobs)
            parsed = parse_response(self.tokenizer, ids, prefix=prompt_ids, tools=tools)
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
            usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
            policy = {"text": text, "token_ids": ids, "logprobs": logprobs, "usage": usage}
            calls = parsed.get("tool_calls") or []
            if not calls:
                episode.verify(final_answer=parsed.get("content") or "")
                episode.steps[-1]["policy"] = policy
                return
            messages.append({"role": "assistant", "content": parsed.get("content") or "", "tool_calls": calls})
            for i, call in enumerate(calls):
                fn = call.get("function", {})
                name = fn.get("name") or "<missing tool name>"
                args = fn.get("arguments", {})
                if isinstance(args, str):
                    with contextlib.suppress(ValueError):
                        args = json.loads(args)
                obs = episode.call_tool(name, args, extra={"policy": policy} if i == 0 else None)
                content = obs.get("tool_result", obs.get("error", ""))
                messages.append({"role": "tool", "name": name, "content": content})
                if obs.get("done"):
                    return
        episode.notes.append(f"max_steps={self.max_steps} reached")
        episode.verify()
