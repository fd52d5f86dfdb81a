"""Online roles per chat template family: TRL 1.16's own tool loop, then ECHO's online masks.

For each family TRL's GRPO tool loop supports (``add_response_schema`` knows its template and
``supports_tool_calling`` accepts it, the two checks ``GRPOTrainer`` makes), TRL's ``_tool_call_loop`` runs
for real on a tiny tokenizer with the family's real template: it parses each scripted completion into tool
calls (``parse_response``), runs the tools, builds the next turn's ids (``_get_tool_suffix_ids``) and its
``tool_mask``. Only the model is scripted: each completion is the model's turn as the family's template
renders it (what a model trained on that template writes), so no sampling is needed. ECHO's
:func:`tool_span_roles` and :func:`online_masks` must then give exact roles: action = the model's tokens,
env output = each tool's output (as the template writes it), context = the next turn's generation prompt,
observation = the template's wrapper around the output.
"""

from __future__ import annotations

import copy
import json
from types import MethodType, SimpleNamespace

import pytest
import torch
from helpers.families import OFFICIAL, SAME_AS_TRL, family_tokenizer, trl_template_names
from trl import GRPOTrainer
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    supports_tool_calling,
)

from echo_trl.roles import Role, tool_call
from echo_trl.tokens.template.tool_content import tool_span_roles, zero_spans
from echo_trl.train.batch import GeneratedRollouts
from echo_trl.train.offline.collator import CollatorSettings
from echo_trl.train.online.masks import online_masks
from echo_trl.train.trl_compat import render_tool_suffix

ACTION, ENV, CONTEXT, OBS = Role.ACTION.code, Role.ENV_OUTPUT.code, Role.CONTEXT.code, Role.OBSERVATION.code

#: The families whose template TRL's tool loop takes (written from TRL's ``add_response_schema``).
ONLINE = [
    *("qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_vl"),
    *("qwen3_5_nothink", "qwen3_5_think", "qwen3_6", "qwen3_8"),
    *("nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra", "nemotron_3_5_lightning"),
    *("llama3_1", "llama3_2", "llama3_3"),
    *("glm4moe", "gptoss"),
    *("lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2", "lfm2_2_5_vl"),
    *("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5"),
]
#: TRL has a response template for it, but one that parses no tool calls, and ``supports_tool_calling`` rejects it.
PARSES_NO_CALLS = ["deepseek_r1_distill"]

OUTPUTS = {"search": '{"user": "assistant", "n": 42}\nsay "hi" \\stop', "update": "Ünï ✓ 日本"}


def search(q: str) -> str:
    """Search the records.

    Args:
        q: what to look for
    """
    return OUTPUTS["search"]


def update(q: str) -> str:
    """Update a record.

    Args:
        q: the record
    """
    return OUTPUTS["update"]


def trl_tokenizer(family: str):
    """The family's tokenizer as a GRPO user sets it up for tools (``add_response_schema``), or None where TRL
    has no response schema for the template."""
    tok = copy.deepcopy(family_tokenizer(family))
    try:
        add_response_schema(tok)
    except ValueError:
        return None
    return tok


def test_trl_tool_support_is_the_online_column():
    """The families TRL's GRPO tool loop accepts are exactly those the docs mark online."""
    accepted, parses_no_calls = [], []
    for family in sorted({*trl_template_names(), *OFFICIAL, *SAME_AS_TRL}):
        tok = trl_tokenizer(family)
        if tok is None:
            continue
        (accepted if supports_tool_calling(tok) else parses_no_calls).append(family)
    assert sorted(accepted) == sorted(ONLINE)
    assert parses_no_calls == PARSES_NO_CALLS


def _turn(tok, template, history, message) -> str:
    """What the model writes for ``message`` after ``history``: the template's render of the message, after
    what the prompt render (with the generation prompt) agrees with, up to its end-of-turn token."""
    kw = {"tools": [search, update], "tokenize": False, "chat_template": template}
    prompt = tok.apply_chat_template(history, add_generation_prompt=True, **kw)
    full = tok.apply_chat_template([*history, message], **kw)
    n = 0
    while n < min(len(prompt), len(full)) and prompt[n] == full[n]:
        n += 1
    assert n >= len(tok.apply_chat_template(history, **kw).rstrip()) - 1  # the turn follows the history
    return full[n:].rstrip("\n")


def _generation_prompt_after_tool(tok, template, history) -> str:
    """What ``add_generation_prompt`` appends after a tool message (independent of ECHO)."""
    kw = {"tools": [search, update], "tokenize": False, "chat_template": template}
    with_prompt = tok.apply_chat_template(history, add_generation_prompt=True, **kw)
    without = tok.apply_chat_template(history, **kw)
    return with_prompt[len(without) :] if with_prompt.startswith(without) else ""


@pytest.mark.parametrize("family", ONLINE)
def test_trl_tool_loop_gives_exact_roles(family):
    tok = trl_tokenizer(family)
    # what GRPOTrainer.__init__ sets up for tools: a prefix-preserving training template where needed
    template = None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)
    prompt = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Order pens."}]
    call1 = {"role": "assistant", "content": "", "tool_calls": [tool_call("search", {"q": "blue pens"})]}
    tool1 = {"role": "tool", "name": "search", "content": OUTPUTS["search"]}
    call2 = {"role": "assistant", "content": "", "tool_calls": [tool_call("update", {"q": "pen 7"})]}
    tool2 = {"role": "tool", "name": "update", "content": OUTPUTS["update"]}
    final = {"role": "assistant", "content": "All done: 3 pens."}
    turns = [
        _turn(tok, template, prompt, call1),
        _turn(tok, template, [*prompt, call1, tool1], call2),
        _turn(tok, template, [*prompt, call1, tool1, call2, tool2], final),
    ]
    generated = [tok(t, add_special_tokens=False)["input_ids"] for t in turns]
    prompt_ids = tok.apply_chat_template(
        prompt, tools=[search, update], chat_template=template, add_generation_prompt=True, tokenize=True
    )["input_ids"]
    script = iter(generated[1:])
    trainer = SimpleNamespace(
        processing_class=tok,
        _tokenizer=tok,
        chat_template=template,
        chat_template_kwargs={},
        _is_vlm=False,
        use_vllm=False,
        tools=[search, update],
        environment_factories=None,
        max_tool_calling_iterations=5,
        max_completion_length=100_000,
        model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=100_000)),
        _sync_tool_dicts=[{"search": search, "update": update}],
        _async_tool_dicts=[{}],
        _generate_single_turn=lambda ids, *a, **k: ([next(script) for _ in ids], None),
    )
    trainer._get_tool_suffix_ids = MethodType(GRPOTrainer._get_tool_suffix_ids, trainer)
    # TRL's _generate: parse the first completion; then its tool loop
    completions = [[parse_response(tok, generated[0], prefix=prompt_ids, tools=[search, update])]]
    tool_mask, completions, completion_ids, *_ = GRPOTrainer._tool_call_loop(
        trainer, [copy.deepcopy(prompt)], [prompt_ids], [list(generated[0])], completions, None, None, {}
    )
    messages, ids, tmask = completions[0], completion_ids[0], tool_mask[0]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["tool_calls"][0]["function"]["name"] for m in messages[:3:2]] == ["search", "update"]
    assert "All done: 3 pens." in messages[4]["content"]

    suffix = lambda msgs, **kw: render_tool_suffix(trainer, msgs, **kw)  # noqa: E731
    roles = tool_span_roles(tok, ids, tmask, messages, suffix)
    assert roles is not None
    # Action: exactly the model's tokens.
    assert [int(r == ACTION) for r in roles] == tmask
    assert [i for i, r in zip(ids, roles, strict=True) if r == ACTION] == [t for g in generated for t in g]
    # In each span TRL appended: the wrapper (observation), the output (env output), the next generation prompt
    # (context), in that order.
    spans = zero_spans(tmask)
    histories = [[*prompt, call1, tool1], [*prompt, call1, tool1, call2, tool2]]
    for (a, b), out, history in zip(spans, OUTPUTS.values(), histories, strict=True):
        span = roles[a:b]
        env = tok.decode([i for i, r in zip(ids[a:b], span, strict=True) if r == ENV])
        assert env.strip() in {out, json.dumps(out, ensure_ascii=False)[1:-1]}, (family, env)
        context = [k for k, r in enumerate(span) if r == CONTEXT]
        gen_prompt = _generation_prompt_after_tool(tok, template, history)
        assert tok.decode([ids[a + k] for k in context]) == gen_prompt
        assert context == list(range(len(span) - len(context), len(span)))  # the span's tail
        first_env = span.index(ENV)
        assert set(span[:first_env]) <= {OBS} and all(
            r in (ENV, OBS) for r in span[first_env : len(span) - len(context)]
        )
        wrapper = tok.decode([i for i, r in zip(ids[a:b], span, strict=True) if r == OBS])
        assert out.split("\n")[0][2:8] not in wrapper
    # The batch masks ECHO adds to TRL's batch carry the same roles.
    masks = online_masks(
        GeneratedRollouts([ids], [tmask], [messages], {}),
        torch.ones(1, len(ids)),
        torch.tensor([tmask]),
        tokenizer=tok,
        tools=[search, update],
        settings=CollatorSettings(world_loss_target="env_only"),
        render_suffix=suffix,
    )
    assert masks.align_failures == 0
    assert masks.env_output_mask[0].tolist() == [int(r == ENV) for r in roles]
