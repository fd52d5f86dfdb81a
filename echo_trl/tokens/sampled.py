"""The sampler's own log-probs as ``behavior_logprobs``, aligned to the trainer's tokenization or refused.

A collected episode keeps, per assistant turn, the token ids the inference server sampled and
their log-probs (``sampler.turns``; a ``model:`` capture keeps them per step under ``policy``). The
trainer does not see those ids: it renders the recorded conversation with the chat template and
tokenizes it whole (:func:`~echo_trl.tokens.tokenization.tokenize_with_roles`). The recorded
log-probs are the behaviour policy's only where the two agree, so :func:`align_record` builds the
episode's trajectory exactly as ``build-dataset`` does, takes the action tokens of each assistant
message, and compares them, in order, with the sampled turns:

* a turn whose token ids equal its message's action ids is aligned (its log-probs belong there);
* a turn whose ids differ (the server tokenized differently, the model wrote text the dataset
  does not keep, one turn became several messages, a verifier call the model never wrote) is
  flagged, with the reason; so is a turn whose server-side prompt (count and hash of
  ``prompt_token_ids``, when the server returns them) differs from the trainer's tokens before
  that message: its log-probs were taken in another context;
* a turn the collector already flagged (``problem``: a lone surrogate replaced, a token id or log-prob no
  sampler gives) and a turn whose ids lie outside the tokenizer's vocabulary are flagged with that reason;
* the episode gets ``behavior_logprobs`` (one per action token, the collator's contract) only when
  every turn is aligned and every assistant message has its turn; otherwise none, and the trainer
  uses its ``behavior_policy`` for it. Never a partly misaligned list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..data.readers.fields import logprob_problem
from ..data.readers.prompt import DEFAULT_SYSTEM_PROMPT
from ..data.readers.records import awm_episode_to_trajectory, sampled_turns, token_ids_hash
from ..errors import EchoTrlError
from ..roles import Role
from .tokenization import tokenize_with_roles


@dataclass(frozen=True)
class TurnCheck:
    """One sampled turn against the trainer's tokens: aligned, or flagged with the reason."""

    turn: int
    aligned: bool
    reason: str = ""


@dataclass
class Alignment:
    """What :func:`align_record` found for one episode."""

    status: str  # "aligned" | "flagged" | "no-logprobs" (the server gave none) | "no-turns"
    checks: list[TurnCheck] = field(default_factory=list)
    behavior_logprobs: list[float] | None = None

    @property
    def flagged(self) -> list[TurnCheck]:
        return [c for c in self.checks if not c.aligned]

    def to_json(self, tokenizer_name: str) -> dict[str, Any]:
        return {
            "tokenizer": tokenizer_name,
            "status": self.status,
            "aligned_turns": sum(c.aligned for c in self.checks),
            "flagged": [{"turn": c.turn, "reason": c.reason} for c in self.flagged],
        }


def _action_runs(tokens, completion: list[dict[str, Any]]) -> list[tuple[int, list[int], dict[str, Any]]]:
    """(first position, action token ids, message) of each assistant message, in order."""
    runs = []
    action = tokens.roles == Role.ACTION.code
    for message, (a, b) in zip(completion, tokens.message_token_spans, strict=False):
        if message["role"] != "assistant":
            continue
        positions = np.flatnonzero(action[a:b]) + a
        start = int(positions[0]) if len(positions) else b
        runs.append((start, [tokens.input_ids[int(p)] for p in positions], message))
    return runs


def _logprob_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"{type(value).__name__} is not a number"
    try:
        return logprob_problem(float(value))
    except OverflowError:
        return "a number too large for a float"


def _verify_hint(message: dict[str, Any]) -> str:
    if any(c["function"]["name"] == "verify" for c in message.get("tool_calls") or []):
        return (
            "; it is the verifier call --verify-turn env_output renders as an assistant turn: "
            "--verify-turn omit keeps the conversation as the model wrote it"
        )
    return ""


def _differ(tokenizer, got: list[int], want: list[int]) -> str:
    at = next((i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), min(len(got), len(want)))
    show = lambda ids: repr(tokenizer.decode(ids[max(0, at - 2) : at + 3]))[:60]  # noqa: E731
    return (
        f"token ids differ from the trainer's re-tokenization at token {at} "
        f"(server {len(got)} tokens, {show(got)}; trainer {len(want)} tokens, {show(want)})"
    )


def align_record(
    tokenizer,
    record: dict[str, Any],
    *,
    format: str = "chat-template",
    verify_turn: str | None = None,
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
    compact_tools: bool = False,
) -> Alignment:
    """Compare the sampled turns of ``record`` with the trainer's tokens of the same episode (module docstring).

    ``format``, ``verify_turn``, ``system_prompt`` and ``compact_tools`` must be those the dataset will be
    built with: they decide the conversation the trainer renders.
    """
    turns = sampled_turns(record)
    if not turns:
        return Alignment("no-turns")
    missing = [not t.get("token_ids") or t.get("logprobs") is None for t in turns]
    if any(missing) and not any(t.get("problem") for t in turns):
        return Alignment("no-logprobs")
    body = {k: v for k, v in record.items() if k != "behavior_logprobs"}
    trajectory = awm_episode_to_trajectory(
        body, format=format, verify_turn=verify_turn, system_prompt=system_prompt, compact_tools=compact_tools
    )
    tokens = tokenize_with_roles(tokenizer, trajectory)
    runs = _action_runs(tokens, trajectory.completion)
    checks = []
    vocab = len(tokenizer)
    for i, turn in enumerate(turns):
        if turn.get("problem") or missing[i]:
            why = turn.get("problem") or "the server returned no token ids / log-probs"
            checks.append(TurnCheck(i, False, str(why)))
            continue
        ids, logprobs = list(turn["token_ids"]), list(turn["logprobs"])
        if i >= len(runs):
            checks.append(TurnCheck(i, False, "no assistant message of the built conversation is left for this turn"))
            continue
        start, want, message = runs[i]
        prompt = turn.get("prompt_tokens")
        outside = next((k for k, v in enumerate(ids) if not isinstance(v, int) or not 0 <= v < vocab), None)
        if outside is not None:
            reason = f"token_ids[{outside}]: {ids[outside]!r} is outside the tokenizer's vocabulary (0..{vocab - 1})"
        elif len(logprobs) != len(ids):
            reason = f"{len(logprobs)} log-probs for {len(ids)} token ids"
        elif bad := next((f"logprobs[{k}]: {p}" for k, p in enumerate(map(_logprob_problem, logprobs)) if p), ""):
            reason = bad
        elif ids != want:
            reason = _differ(tokenizer, ids, want) + _verify_hint(message)
        elif isinstance(prompt, dict) and (
            prompt.get("count") != start or prompt.get("sha256") != token_ids_hash(tokens.input_ids[:start])
        ):
            reason = (
                f"the server's prompt ({prompt.get('count')} tokens) is not the trainer's tokens before this turn "
                f"({start} tokens): another chat template or conversation; its log-probs were taken in another context"
            )
        else:
            checks.append(TurnCheck(i, True))
            continue
        checks.append(TurnCheck(i, False, reason))
    for j in range(len(turns), len(runs)):
        reason = f"assistant message {j} of the built conversation has no sampled turn" + _verify_hint(runs[j][2])
        checks.append(TurnCheck(j, False, reason))
    if any(not c.aligned for c in checks):
        return Alignment("flagged", checks)
    return Alignment("aligned", checks, [float(x) for t in turns for x in t["logprobs"]])


def apply_alignment(record: dict[str, Any], alignment: Alignment, tokenizer_name: str) -> dict[str, Any]:
    """``record`` with ``behavior_logprobs`` set from an aligned episode and removed from any other, and the
    check kept under ``sampler.alignment`` (the summary counts it)."""
    record.pop("behavior_logprobs", None)
    if alignment.behavior_logprobs is not None:
        record["behavior_logprobs"] = alignment.behavior_logprobs
    if alignment.status != "no-turns":
        sampler = record.setdefault("sampler", {})
        sampler["alignment"] = alignment.to_json(tokenizer_name)
    return record


def load_tokenizer(name: str, *, trust_remote_code: bool = False, local_files_only: bool = False):
    """The trainer's tokenizer by path or Hub id (a one-line error when it cannot be had); ``local_files_only``:
    a directory or the local Hugging Face cache, never the network."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            name, trust_remote_code=trust_remote_code, local_files_only=local_files_only
        )
    except (OSError, ValueError) as exc:
        raise EchoTrlError(f"--tokenizer {name}: cannot load it ({' '.join(str(exc).split())[:200]})") from None
    if tokenizer.chat_template is None:
        raise EchoTrlError(f"--tokenizer {name}: has no chat template")
    return tokenizer
