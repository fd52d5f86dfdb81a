"""Online masks: the tool-output content inside TRL's tool_mask == 0 spans, without a model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from helpers.tiny import tiny_tokenizer

from echo_trl.roles import Role, tool_call
from echo_trl.tokens.template.tool_content import tool_span_roles, zero_spans
from echo_trl.train.batch import GeneratedRollouts
from echo_trl.train.offline.collator import CollatorSettings
from echo_trl.train.online.masks import online_masks


@pytest.mark.parametrize("family", ["qwen2_5", "qwen3", "llama3_1"])
def test_online_mask_is_the_tool_content_only(family):
    from trl import GRPOTrainer
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    from echo_trl.train.trl_compat import render_tool_suffix

    tok = tiny_tokenizer(family)
    # what GRPOTrainer.__init__ sets up for tool training (a prefix-preserving training template if needed)
    template = None if is_chat_template_prefix_preserving(tok) else get_training_chat_template(tok)
    fake = SimpleNamespace(
        processing_class=tok, _tokenizer=tok, chat_template=template, chat_template_kwargs={}, _is_vlm=False
    )
    messages = [
        {"role": "assistant", "content": "", "tool_calls": [tool_call("search", {"q": "lamp"})]},
        {"role": "tool", "name": "search", "content": "user assistant tool_response 42 lamps"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call("add", {"id": 4}), tool_call("add", {"id": 5})]},
        {"role": "tool", "name": "add", "content": "added 4"},
        {"role": "tool", "name": "add", "content": "{'error': 'out of stock'}"},
        {"role": "assistant", "content": "done"},
    ]
    ids, tmask = [], []
    for chunk in ([11, 12, 13], None, [14, 15], None, [16]):  # model tokens, then TRL's tool suffix ids
        if chunk is None:
            group = [m for m in messages if m["role"] == "tool"]
            group = group[:1] if not ids or len(tmask) < 6 else group[1:]
            suffix = GRPOTrainer._get_tool_suffix_ids(fake, group)
            ids += suffix
            tmask += [0] * len(suffix)
        else:
            ids += chunk
            tmask += [1] * len(chunk)
    roles = tool_span_roles(tok, ids, tmask, messages, lambda msgs, **kw: render_tool_suffix(fake, msgs, **kw))
    assert roles is not None
    mask = [r == Role.ENV_OUTPUT.code for r in roles]
    env_text = tok.decode([i for i, m in zip(ids, mask, strict=True) if m])
    for content in ("user assistant tool_response 42 lamps", "added 4", "{'error': 'out of stock'}"):
        assert content in env_text.replace('\\"', '"')
    assert all(t == 0 for t, m in zip(tmask, mask, strict=True) if m)  # inside the spans only
    # role headers, <tool_response> tags and the next generation prompt are not env output
    outside = tok.decode([i for i, m, t in zip(ids, mask, tmask, strict=True) if not m and t == 0])
    assert "lamps" not in outside and "added" not in outside and "stock" not in outside
    assert len(outside) > 10
    # observation / all: the wrapper trains, TRL's next generation prompt does not (context, as offline)
    header = _generation_prompt(tok)
    for target in ("observation", "all"):
        masks = online_masks(
            GeneratedRollouts([ids], [tmask], [messages], {}),
            torch.ones(1, len(ids)),
            torch.tensor([tmask]),
            tokenizer=tok,
            tools=["search", "add"],
            settings=CollatorSettings(world_loss_target=target),
            render_suffix=lambda msgs, **kw: render_tool_suffix(fake, msgs, **kw),
        )
        world = masks.world_mask[0].tolist()
        for a, b in zero_spans(tmask):
            trained = tok.decode([i for i, w in zip(ids[a:b], world[a:b], strict=True) if w])
            untrained = tok.decode([i for i, w in zip(ids[a:b], world[a:b], strict=True) if not w])
            assert untrained.endswith(header) and not trained.endswith(header.strip())
            assert tok.decode(ids[a:b]).endswith(header) and len(trained) > len(header)


def _generation_prompt(tok) -> str:
    """The text add_generation_prompt appends (an independent render: a user turn with and without it)."""
    chat = [{"role": "user", "content": "x"}]
    with_prompt = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    without = tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
    assert with_prompt.startswith(without) and len(with_prompt) > len(without)
    return with_prompt[len(without) :]


def test_online_mask_refuses_misaligned_spans():
    tok = tiny_tokenizer("qwen3")
    messages = [{"role": "assistant", "content": ""}, {"role": "tool", "name": "t", "content": "abc"}]
    assert tool_span_roles(tok, [1, 2, 3], [1, 1, 1], messages, lambda m: "") is None  # 1 group, 0 spans
