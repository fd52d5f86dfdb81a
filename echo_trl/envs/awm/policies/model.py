"""Play AWM episodes with a local causal LM (``echo-trl capture --policy model:PATH``).

Generates each assistant turn with the model's chat template (tools rendered by the template),
samples with ``transformers`` ``generate``, parses tool calls the way TRL's ``GRPOTrainer``
does (``trl.chat_template_utils.add_response_schema`` + ``parse_response``) and records the
per-token log-probabilities of the sampled tokens under the sampling temperature
(``log_softmax(logits / T)``, TRL's convention) as ``behavior_logprobs`` (episode level, in
generation order) and per step under ``policy`` (``text``, ``token_ids``, ``logprobs``). A turn
without tool calls is the agent's final answer: the verifier runs with it. Several tool calls
in one turn are executed (and recorded) one step each.

:class:`AWMAgentModelPolicy` (``capture --format awm-agent --policy model:PATH``) speaks the official
AWM agent's conversation instead: the official system prompt, no tool schemas in the chat template,
each turn parsed with :func:`echo_trl.data.readers.awm_agent.next_action` (its first ``<tool_call>`` block;
further blocks are ignored, one call per turn; no readable call = the final answer, which goes to the
verifier), replies from :func:`~echo_trl.envs.awm.runtime.agent_turns.agent_reply`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ....data.readers import awm_agent
from ....data.readers.prompt import prompt_messages
from ..runtime.agent_turns import agent_reply
from ..runtime.episode import Episode
from .policy import PolicyError, live_prompt


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
    def from_pretrained(
        cls,
        path: str,
        *,
        trust_remote_code: bool = False,
        prepare_tokenizer: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> ModelPolicy:
        """Load model and tokenizer; ``prepare_tokenizer`` may change the tokenizer first (``capture
        --chat_template_path`` gives it another chat template) before the template is checked."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            if prepare_tokenizer is not None:
                tokenizer = prepare_tokenizer(tokenizer)
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

    def finish_reason(self, ids: list[int]) -> str:
        """OpenAI's ``finish_reason`` of a sampled turn: ``"length"`` when it filled ``max_new_tokens`` without
        ending (capture's summary counts the turns cut at the token limit), else ``"stop"``."""
        config = getattr(self.model, "generation_config", None)  # a scripted subclass may hold no model
        eos = getattr(config, "eos_token_id", None)
        eos = set(eos if isinstance(eos, list) else [eos, self.tokenizer.eos_token_id])
        return "length" if len(ids) >= self.max_new_tokens and (not ids or ids[-1] not in eos) else "stop"

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
            policy["finish_reason"] = self.finish_reason(ids)
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


class AWMAgentModelPolicy(ModelPolicy):
    """A local model playing episodes in the official AWM agent's conversation (see the module docstring)."""

    def __post_init__(self) -> None:  # the official agent parses <tool_call> text itself: no TRL response schema
        if self.system_prompt is None:
            self.system_prompt = awm_agent.SYSTEM_PROMPT

    def play(self, episode: Episode, episode_index: int = 0) -> None:
        messages = prompt_messages(self.system_prompt, episode.scenario, episode.task)
        episode.behavior_logprobs = []
        for _ in range(self.max_steps):
            _, ids, logprobs = self._generate(messages, None)
            episode.behavior_logprobs.extend(logprobs)
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            policy = {"text": text, "token_ids": ids, "logprobs": logprobs, "finish_reason": self.finish_reason(ids)}
            action = awm_agent.next_action(text)
            if action.kind == "final":
                episode.verify(final_answer=text.strip())
                episode.steps[-1]["policy"] = policy
                return
            reply = agent_reply(episode, action, extra={"policy": policy})
            messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": reply}]
            if episode.done:
                return
        episode.notes.append(f"max_steps={self.max_steps} reached")
        episode.verify()
