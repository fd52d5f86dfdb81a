"""The role audit refuses roles that do not match the messages, whatever derived them.

Each case starts from a real tokenization (tiny tokenizer, real chat template), breaks the roles or the
template in one way, and expects a one-line refusal naming the message and the offending text.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from helpers.families import family_tokenizer
from helpers.rendering import make_trajectory

from echo_trl.roles import Role, Trajectory, tool_call
from echo_trl.tokens.audit import RoleAuditError, audit_roles
from echo_trl.tokens.template.layout import layout
from echo_trl.tokens.tokenization import tokenize_rows, tokenize_with_roles

ACTION, ENV = Role.ACTION.code, Role.ENV_OUTPUT.code


def _audit_chars(tok, lay, char_roles) -> None:
    """Run the audit on ``char_roles`` (a token takes the role of its first character, as in tokenization)."""
    enc = tok(lay.text, add_special_tokens=False, return_offsets_mapping=True)
    starts = np.array([a for a, _ in enc["offset_mapping"]])
    info = lay.info
    audit_roles(
        lay.text,
        starts,
        char_roles[starts],
        lay.completion,
        lay.warnings,
        info.generation_prompts,
        info.special_tokens,
        info.added_tokens,
    )


def _refused(tok, lay, char_roles) -> str:
    with pytest.raises(RoleAuditError) as err:
        _audit_chars(tok, lay, char_roles)
    message = str(err.value)
    assert "\n" not in message and message.startswith("role audit:")
    return message


#: A ChatML template that renders a call to ``zap`` differently from every other call: the assistant turn keeps
#: no end token, and the tool turn's header carries one. Probes (with the row's first tool names) never see it.
BROKEN_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- for c in m.tool_calls -%}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}</tool_call>"
    "{%- endfor -%}"
    "{%- if m.tool_calls[0].function.name != 'zap' -%}{{ '<|im_end|>' }}{%- endif -%}{{ '\\n' }}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if messages[loop.index0 - 1].tool_calls[0].function.name == 'zap' -%}{{ '<|im_start|>tool<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>tool\\n' }}{%- endif -%}"
    "{{ m.content + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def test_a_broken_template_is_refused_by_the_audit():
    tok = _fresh_qwen()  # not the cached family tokenizer: its template is changed here
    tok.chat_template = BROKEN_TEMPLATE
    fine = make_trajectory(['{"ok": 1}', "done"], tools=("lookup", "update"))
    assert tokenize_with_roles(tok, fine).counts()["action"] > 0  # the same template, calls it renders alike
    zapped = make_trajectory(['{"ok": 1}', "done"], tools=("lookup", "zap"))
    zapped.tools = fine.tools  # the schemas name lookup and update: the probes never call zap
    with pytest.raises(RoleAuditError, match=r"completion message 2 \(assistant\).*goes on past its turn") as err:
        tokenize_rows(tok, [_row(zapped)], [7])
    assert str(err.value).startswith("row 7: role audit:") and "\n" not in str(err.value)
    assert tokenize_with_roles(tok, zapped, audit=False).counts()["action"] > 0  # silently wrong without it


def _fresh_qwen():
    from echo_trl.demo.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer("qwen2_5")


def _row(t: Trajectory) -> dict:
    from echo_trl.data.schema import trajectory_to_row

    return trajectory_to_row(t)


def test_the_masks_gpt_oss_used_to_get_are_refused():
    """Actions that ran on through the tool reply's header (``<|start|>functions.x to=assistant...``) to the
    ``<|end|>`` after the tool output: what the earlier derivation trained on, silently."""
    tok = family_tokenizer("gptoss")
    lay = layout(tok, make_trajectory(['{"ok": 1}', "done"]))
    roles = lay.char_roles.copy()
    for start, _end, _ in lay.actions.values():
        stop = lay.text.index("<|end|>", start) + len("<|end|>")
        span = roles[start:stop]
        span[span != ENV] = ACTION
    message = _refused(tok, lay, roles)
    assert "completion message 0 (assistant)" in message and "to=assistant" in message


def test_correct_roles_pass(family="qwen2_5"):
    tok = family_tokenizer(family)
    lay = layout(tok, make_trajectory(['{"ok": 1}', " spaced ", ""], warnings={1: ["careful"]}))
    _audit_chars(tok, lay, lay.char_roles)


def _qwen_layout():
    tok = family_tokenizer("qwen2_5")
    return tok, layout(tok, make_trajectory(['{"ok": true, "n": 12345}', "done"], args={0: {"q": "blue"}}))


def test_an_action_that_swallows_the_next_header_is_refused():
    tok, lay = _qwen_layout()
    roles = lay.char_roles.copy()
    start, end, _ = lay.actions[0]
    header_end = lay.text.index("<tool_response>", end)
    roles[end:header_end] = ACTION
    assert "goes on past its turn" in _refused(tok, lay, roles)


def test_an_action_that_starts_inside_the_generation_prompt_is_refused():
    tok, lay = _qwen_layout()
    roles = lay.char_roles.copy()
    start, _, _ = lay.actions[2]
    roles[start - len("assistant\n") : start] = ACTION
    assert "generation prompt" in _refused(tok, lay, roles)


def test_an_action_without_its_call_or_end_token_is_refused():
    tok, lay = _qwen_layout()
    start, end, _ = lay.actions[0]
    roles = lay.char_roles.copy()
    name_at = lay.text.index("lookup", start)
    roles[start : name_at + len("lookup")] = Role.CONTEXT.code
    assert re.search(r"message 0 \(assistant\): its action run lacks 'lookup'", _refused(tok, lay, roles))
    roles = lay.char_roles.copy()
    roles[end - len("<|im_end|>") : end] = Role.CONTEXT.code
    assert "does not end on an end-of-turn token" in _refused(tok, lay, roles)


def test_env_output_must_be_exactly_the_tool_output():
    tok, lay = _qwen_layout()
    content = '{"ok": true, "n": 12345}'
    at = lay.text.index(content)
    roles = lay.char_roles.copy()
    roles[at + 4 : at + 8] = Role.CONTEXT.code  # a hole: the run splits
    assert "completion message" in _refused(tok, lay, roles)
    roles = lay.char_roles.copy()
    roles[at - len("<tool_response>\n") : at] = ENV  # the wrapper counted as output
    assert "is not its text" in _refused(tok, lay, roles)


def test_tool_output_inside_an_action_is_refused():
    tok, lay = _qwen_layout()
    roles = lay.char_roles.copy()
    content = '{"ok": true, "n": 12345}'
    at = lay.text.index(content)
    start, _, _ = lay.actions[0]
    roles[start : at + len(content)] = ACTION  # one run from the call through the output
    message = _refused(tok, lay, roles)
    assert "completion message" in message


def test_a_whitespace_output_merged_into_the_template_passes():
    tok = family_tokenizer("qwen2_5")
    t = Trajectory(
        prompt=[{"role": "user", "content": "Do it."}],
        completion=[
            {"role": "assistant", "content": "", "tool_calls": [tool_call("lookup", {})]},
            {"role": "tool", "name": "lookup", "content": "   "},
        ],
        tools=make_trajectory(["x"]).tools,
    )
    rt = tokenize_with_roles(tok, t)
    assert rt.counts()["action"] > 0


def test_an_output_held_whole_by_a_template_token_passes_and_no_other():
    """Llama 3.1 renders a string output as JSON (``","``); BPE may merge the opening quote with a one-character
    output, so no token starts inside it and it has no token to learn. The audit accepts exactly that: where the
    output has a token of its own and the roles drop it, the row is still refused."""
    tok = family_tokenizer("llama3_1")
    lay = layout(tok, make_trajectory([","], warnings={0: ["warn"]}))
    enc = tok(lay.text, add_special_tokens=False, return_offsets_mapping=True)
    at = lay.text.rindex('ipython<|end_header_id|>\n\n"') + len('ipython<|end_header_id|>\n\n"')  # the ','
    assert lay.text[at] == ","
    holder = [(a, b) for a, b in enc["offset_mapping"] if a <= at < b]
    if holder[0][0] == at:
        pytest.skip("this tokenizer gives ',' a token of its own here")
    assert holder[0][0] < at  # the case: the token holding the output starts at the template's quote
    rt = tokenize_with_roles(tok, make_trajectory([","], warnings={0: ["warn"]}))
    assert rt.counts()["env_output"] == 0 and rt.counts()["warning"] > 0

    lay = layout(tok, make_trajectory(["x,"]))  # 'x' starts a token: the output has one of its own
    roles = lay.char_roles.copy()
    roles[roles == ENV] = Role.CONTEXT.code
    assert "expected its env_output run" in _refused(tok, lay, roles)
