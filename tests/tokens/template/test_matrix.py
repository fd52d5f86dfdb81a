"""Exact roles on every chat template people train, or a one-line refusal saying what the template lacks.

The matrix: every template TRL 1.16 bundles (originals and ``_training`` variants, read from the installed
package) and the official templates of other families (``tests/fixtures/chat_templates``, sources there), each
with a tiny tokenizer carrying the family's real special tokens (``tests/helpers/families.py``).

Expectations are written here per family, from the templates' own text, independently of the code under
test: where the model's turn begins (the text before an action: the assistant header the template renders),
the token that ends each kind of turn, and, for a template that cannot show a tool conversation, what it
lacks. Each exact family is checked on a hard trajectory (quotes, backslashes, non-ASCII, whitespace
around outputs, empty output, warnings, a final answer) and on bundled AWM episodes in both dataset
formats; a few train two offline steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.families import OFFICIAL, SAME_AS_TRL, family_tokenizer, trl_template_names
from transformers.utils.chat_template_utils import render_jinja_template

from echo_trl.errors import TemplateError
from echo_trl.roles import Role, Trajectory, tool_call
from echo_trl.tokens.tokenization import WARNING_SEPARATOR, tokenize_rows, tokenize_with_roles

REPO = Path(__file__).resolve().parents[3]
ACTION, ENV, WARNING = Role.ACTION.code, Role.ENV_OUTPUT.code, Role.WARNING.code

QWEN = ("<|im_start|>assistant\n", "<|im_end|>", "<|im_end|>")
THINK = ("<|im_start|>assistant\n<think>\n", "<|im_end|>", "<|im_end|>")
LLAMA = ("<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "<|eot_id|>")
GEMMA4 = ("<|turn>model\n", "<|tool_response>", "<turn|>")

#: Per exact family: (text before an action after the task, end of a tool-call turn, end of the final answer),
#: and where a turn after a tool result begins differently, that text (else the first).
EXACT: dict[str, tuple[str, str, str]] = {
    **dict.fromkeys(
        [
            "qwen2_5",
            "qwen2_5_training",
            "qwen3",
            "qwen3_training",
            "qwen3_instruct_2507",
            "qwen3_instruct_2507_training",
            "qwen3_vl",
            "qwen3_vl_training",
            "qwen3_coder",
            "hermes3_tool_use",
            "lfm2_v2",
            "lfm2_v2_training",
            "lfm2_2_5",
            "lfm2_2_5_v2",
            "lfm2_2_5_vl",
        ],
        QWEN,
    ),
    **dict.fromkeys(
        ["qwen3_5_think", "qwen3_5_think_training", "qwen3_6", "qwen3_6_training", "qwen3_8", "qwen3_8_training"],
        THINK,
    ),
    **dict.fromkeys(
        ["qwen3_5_nothink", "qwen3_5_nothink_training"],
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>", "<|im_end|>"),
    ),
    **dict.fromkeys(
        [f"nemotron_3_{v}{t}" for v in ("nano", "super", "ultra", "5_lightning") for t in ("", "_training")],
        ("<|im_start|>assistant\n<think>", "<|im_end|>", "<|im_end|>"),  # history keeps an empty <think></think>
    ),
    **dict.fromkeys(["llama3_1", "llama3_2", "llama3_3"], LLAMA),
    "glm4moe": ("<|assistant|>", "<|observation|>", ""),  # the final turn has no end token: the text ends
    "glm4moe_training": ("<|assistant|>", "<|observation|>", "<|user|>"),
    "glm4_6": ("<|assistant|>", "<|observation|>", ""),
    **dict.fromkeys(["gptoss", "gptoss_training"], ("<|start|>assistant", "<|call|>", "<|return|>")),
    **dict.fromkeys(["muse_glimmer", "muse_glimmer_training"], ("<|start|>assistant", "<|eot|>", "<|eot|>")),
    **dict.fromkeys(
        ["deepseekv3", "deepseekv3_training", "deepseek_r1_distill", "deepseek_r1_distill_training"],
        ("<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ),
    "deepseek_v3_1": ("<｜Assistant｜></think>", "<｜end▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    **dict.fromkeys(["gemma4", "gemma4_v3", "gemma4_v4", "gemma4_v5"], GEMMA4),
    "gemma4_v2": ("<|turn>model\n", "<turn|>", "<turn|>"),
    **dict.fromkeys(["diffusion_gemma", "diffusion_gemma_training"], GEMMA4),
    **dict.fromkeys(["mistral_nemo", "mistral_small_3_2"], ("[/INST]", "</s>", "</s>")),
    "command_r7b_tool_use": (
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        "<|END_OF_TURN_TOKEN|>",
        "<|END_OF_TURN_TOKEN|>",
    ),
    "kimi_k2": ("<|im_assistant|>assistant<|im_middle|>", "<|im_end|>", "<|im_end|>"),
    "granite4_0": ("<|start_of_role|>assistant<|end_of_role|>", "<|end_of_text|>", "<|end_of_text|>"),
}

#: Where a turn that follows a tool result begins, for templates that render it differently.
AFTER_TOOL = {
    **dict.fromkeys(
        ["deepseekv3", "deepseekv3_training", "deepseek_r1_distill", "deepseek_r1_distill_training"],
        "<｜tool▁output▁end｜>",
    ),  # no header after tools
    "deepseek_v3_1": "<｜tool▁output▁end｜>",
    **dict.fromkeys(["gemma4", "gemma4_v3", "gemma4_v4", "gemma4_v5"], "<tool_response|>"),  # one turn stays open
    **dict.fromkeys(["diffusion_gemma", "diffusion_gemma_training"], "<tool_response|>"),
    **dict.fromkeys(["mistral_nemo", "mistral_small_3_2"], "[/TOOL_RESULTS]"),  # ignores add_generation_prompt
}
#: DeepSeek-V3 renders the end of the tool outputs as part of a final answer that follows them.
FINAL_AFTER_TOOL = dict.fromkeys(
    ["deepseekv3", "deepseekv3_training", "deepseek_r1_distill", "deepseek_r1_distill_training"],
    "<｜tool▁outputs▁end｜>",
)
#: DeepSeek-R1-Distill closes only calls after the conversation's first one (its ``is_first`` flag is never
#: reset): the first call's turn ends with the call itself, the tool outputs follow it directly.
FIRST_CALL_END = dict.fromkeys(["deepseek_r1_distill", "deepseek_r1_distill_training"], "<｜tool▁call▁end｜>")

NO_CALLS = "renders no assistant tool_calls"
NO_TOOL_ROLE = "has no tool role"
#: Families refused, and what their template lacks (the one-line error must say it).
REFUSED: dict[str, str] = {
    **dict.fromkeys(
        [
            "lfm2",
            "lfm2_training",
            "llama3",
            "llama3_training",
            "phi3",
            "phi3_training",
            "phi3_5",
            "phi3_5_training",
            "qwen2_5_vl",
            "qwen2_5_vl_training",
            "phi4_mini",
            "granite3_3",
            "smollm3_unsloth",
        ],
        NO_CALLS + r".*never reads tool_calls",
    ),
    **dict.fromkeys(
        ["gemma3", "gemma3_training", "cohere", "cohere_training", "cohere2", "cohere2_training"], NO_TOOL_ROLE
    ),
    **dict.fromkeys(["idefics3", "idefics3_training", "smolvlm", "smolvlm_training"], NO_TOOL_ROLE),
    **dict.fromkeys(["gemma", "gemma_training"], "cannot render a user/assistant exchange.*System role"),
    **dict.fromkeys(["llava_next", "llava_next_training"], "cannot render a user/assistant exchange"),
}

ALL = sorted({*trl_template_names(), *OFFICIAL, *SAME_AS_TRL})
#: A few families train two offline steps (the trainer is slow on a small CPU; tokenization covers all).
TRAINED = ("gptoss", "glm4_6", "mistral_nemo", "gemma4_v5", "kimi_k2", "deepseek_r1_distill")


def test_every_template_is_in_the_matrix():
    assert set(EXACT) | set(REFUSED) == set(ALL) and not set(EXACT) & set(REFUSED)
    assert len(EXACT) >= 55 and len(REFUSED) >= 25


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": n,
            "description": f"{n} records",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}},
        },
    }
    for n in ("search", "update")
]
OUTPUTS = ['{\n  "user": "assistant",\n  "ok": true\n}', "  two spaces around  ", 'say "hi"\n\\stop', "", "Ünï ✓ 日本"]


def hard_trajectory() -> Trajectory:
    completion, warnings = [], []
    for i, out in enumerate(OUTPUTS):
        name = ("search", "update")[i % 2]
        args = {"q": f'blue "pens" {i}', "n": i}
        completion += [
            {"role": "assistant", "content": "", "tool_calls": [tool_call(name, args)]},
            {"role": "tool", "name": name, "content": out},
        ]
        warnings += [[], ["only 2 steps left"] if i == 1 else []]
    completion.append({"role": "assistant", "content": "All done: 3 pens."})
    warnings.append([])
    return Trajectory(
        prompt=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Order pens."}],
        completion=completion,
        warnings=warnings,
        tools=TOOLS,
    )


def runs(starts: list[int], roles: np.ndarray, code: int, text: str) -> list[tuple[int, int]]:
    """Character spans of the maximal runs of tokens with role ``code``."""
    on = np.concatenate([[False], roles == code, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(on))
    ends = [*starts, len(text)]
    return [(starts[a], ends[b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def tokens(tok, t: Trajectory):
    """(role tokens, each token's first character): ids checked to be the whole rendered text tokenized once."""
    rt = tokenize_with_roles(tok, t)
    enc = tok(rt.text, add_special_tokens=False, return_offsets_mapping=True)
    assert rt.input_ids == enc["input_ids"]
    return rt, [a for a, _ in enc["offset_mapping"]]


def rendered(tok, t: Trajectory) -> str:
    """The template's own render of the conversation, warnings appended to their tool message, in the shape
    the template needs (tried in order: as recorded; arguments as JSON text; ids on calls)."""
    base = [
        *t.prompt,
        *[
            {**m, "content": m["content"] + "".join(WARNING_SEPARATOR + w for w in ws)}
            for m, ws in zip(t.completion, t.warnings, strict=True)
        ],
    ]
    attempts = [base, _json_args(base), _with_ids(base), _with_ids(_json_args(base))]
    for messages in [*attempts, _none_content(_json_args(base))]:
        try:
            text = _render_keeping_none(tok, messages, t.tools)
        except Exception:  # noqa: BLE001 - the template rejects this shape; try the next
            continue
        if '"pens" 0' in text or '\\"pens\\" 0' in text:
            return text
    raise AssertionError("no shape renders the calls")


def _render_keeping_none(tok, messages, tools) -> str:
    """``apply_chat_template``, or, for messages with content None (which it drops), transformers' renderer
    given the same template and special tokens."""
    if all(m.get("content") is not None for m in messages):
        return tok.apply_chat_template(messages, tools=tools, tokenize=False)
    return render_jinja_template(
        conversations=[messages], tools=tools, chat_template=tok.chat_template, **tok.special_tokens_map
    )[0][0]


def _none_content(messages):
    return [{**m, "content": None} if m.get("tool_calls") and not m["content"] else m for m in messages]


def _json_args(messages):
    return [
        {
            **m,
            "tool_calls": [
                {**c, "function": {**c["function"], "arguments": json.dumps(c["function"]["arguments"])}}
                for c in m["tool_calls"]
            ],
        }
        if m.get("tool_calls")
        else m
        for m in messages
    ]


def _with_ids(messages):
    out, n, last = [], 0, None
    for m in messages:
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                n += 1
                calls.append({**c, "id": f"{n:09d}"})
            m, last = {**m, "tool_calls": calls}, calls[0]["id"]
        elif m["role"] == "tool":
            m = {**m, "tool_call_id": last}
        out.append(m)
    return out


@pytest.mark.parametrize("family", sorted(EXACT))
def test_exact_roles(family):
    tok = family_tokenizer(family)
    t = hard_trajectory()
    rt, starts = tokens(tok, t)
    text = rt.text
    assert text == rendered(tok, t)
    start_user, end_call, end_final = EXACT[family]
    after_tool = AFTER_TOOL.get(family, start_user)
    actions = runs(starts, rt.roles, ACTION, text)
    assistants = [m for m in t.completion if m["role"] == "assistant"]
    assert len(actions) == len(assistants)
    for k, ((a, b), m) in enumerate(zip(actions, assistants, strict=True)):
        before = (
            start_user
            if k == 0
            else FINAL_AFTER_TOOL.get(family, after_tool)
            if not m.get("tool_calls")
            else after_tool
        )
        assert text[:a].endswith(before), (family, k, text[max(0, a - 40) : a + 40])
        action = text[a:b]
        if m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            assert fn["name"] in action and "pens" in action
            assert action.endswith(FIRST_CALL_END.get(family, end_call) if k == 0 else end_call), (family, k)
        else:
            assert "All done: 3 pens." in action
            assert action.endswith(end_final) and (end_final or b == len(text)), (family, action[-60:])
    # Env output: each tool output where the template put it (verbatim, JSON-escaped or stripped), in order,
    # plus at most the whitespace the template joins to it; warnings likewise.
    envs = [text[a:b] for a, b in runs(starts, rt.roles, ENV, text)]
    outputs = [m["content"] for m in t.completion if m["role"] == "tool" and m["content"].strip()]
    assert len(envs) == len(outputs)
    for got, out in zip(envs, outputs, strict=True):
        forms = {out, json.dumps(out, ensure_ascii=False)[1:-1], out.strip()}
        assert any(got.strip() == f.strip() for f in forms), (family, got, out)
        assert any(f.strip() in text for f in forms)
    warns = [text[a:b] for a, b in runs(starts, rt.roles, WARNING, text)]
    assert [w.strip() for w in warns] == ["only 2 steps left"]
    # Nothing learnable in the prompt; the three masks are disjoint by construction (one role per token).
    assert set(rt.roles[: rt.prompt_length].tolist()) <= {Role.CONTEXT.code}
    assert rt.roles[rt.prompt_length] == ACTION


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_refused_in_one_line_saying_what_it_lacks(family):
    tok = family_tokenizer(family)
    with pytest.raises(TemplateError, match=REFUSED[family]) as err:
        tokenize_with_roles(tok, hard_trajectory())
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def bundled_rows(tmp_path_factory):
    """Four bundled AWM episodes (two tasks) in each dataset format."""
    from echo_trl.data.build import build_awm_dataset

    rows = {}
    for fmt in ("chat-template", "awm-agent"):
        ds = build_awm_dataset([REPO / "data" / "episodes"], format=fmt, show_progress=False)
        picked = [i for i, r in enumerate(ds) if r["task_idx"] in (0, 1)][:4]
        rows[fmt] = [ds[i] for i in picked]
    return rows


#: The awm-agent format renders without tool schemas (its system prompt describes list_tools / call_tool, as
#: the official AWM agent asks its model); a template that cannot render a conversation without them is refused.
NEEDS_TOOLS = {"hermes3_tool_use"}


@pytest.mark.parametrize("fmt", ["chat-template", "awm-agent"])
@pytest.mark.parametrize("family", sorted(EXACT))
def test_bundled_episodes_are_exact(family, fmt, bundled_rows):
    """Real AWM episodes (long tool schemas, JSON outputs, the verifier's turn or a final answer): every row
    passes the role audit, ids are the whole text tokenized once, every tool output is env output."""
    tok = family_tokenizer(family)
    rows = bundled_rows[fmt]
    if fmt == "awm-agent" and family in NEEDS_TOOLS:
        with pytest.raises(TemplateError, match=r"^row 0: chat template needs tool schemas"):
            tokenize_rows(tok, rows, list(range(len(rows))))
        return
    for rt, row in zip(tokenize_rows(tok, rows, list(range(len(rows)))), rows, strict=True):
        assert rt.input_ids == tok(rt.text, add_special_tokens=False)["input_ids"]
        outputs = [m["content"] for m in row["completion"] if m["role"] == "tool" and (m["content"] or "").strip()]
        env = tok.decode([i for i, r in zip(rt.input_ids, rt.roles, strict=True) if r == ENV])
        compact = env.replace("\\n", "\n").replace('\\"', '"').replace(" ", "").replace("\n", "")
        for out in outputs:
            assert out.replace(" ", "").replace("\n", "") in compact
        assert rt.counts()["action"] > 0


@pytest.mark.parametrize("family", TRAINED)
def test_two_offline_steps_train(family, tmp_path):
    from helpers.trainer import tiny_config
    from transformers import AutoConfig, AutoModelForCausalLM

    from echo_trl.data.build import trajectories_to_dataset
    from echo_trl.trainer import EchoGRPOTrainer

    tok = family_tokenizer(family)
    trajectories = []
    for i in range(4):
        t = hard_trajectory()
        t.group_id, t.reward = f"g{i // 2}", float(i % 2)
        trajectories.append(t)
    config = AutoConfig.for_model(
        "qwen2",
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    before = [p.detach().clone() for p in model.parameters()]
    args = tiny_config(tmp_path, max_steps=2, max_completion_length=None, learning_rate=1e-2)
    trainer = EchoGRPOTrainer(
        model, args=args, train_dataset=trajectories_to_dataset(trajectories), processing_class=tok
    )
    trainer.train()
    assert trainer.state.global_step == 2
    assert any(not np.allclose(a.numpy(), p.detach().numpy()) for a, p in zip(before, model.parameters(), strict=True))
    logged = [h for h in trainer.state.log_history if "loss" in h]
    assert logged and all(np.isfinite(h["loss"]) for h in logged)


@pytest.mark.parametrize("family", ["deepseek_r1_distill", "deepseek_r1_distill_training"])
def test_r1_distill_refuses_text_beside_calls(family):
    """R1-Distill shows a turn's calls only when its content is None: a turn with text and calls would lose them."""
    t = hard_trajectory()
    t.completion[0] = {**t.completion[0], "content": "Searching first."}
    with pytest.raises(TemplateError, match=r"only for an assistant message whose content is None.*message 0") as e:
        tokenize_with_roles(family_tokenizer(family), t)
    assert "\n" not in str(e.value)


def test_r1_distill_none_content_survives_the_dataset():
    """A tool-call turn recorded with content None keeps it through the Arrow row (a nullable string), and the
    row tokenizes exactly as the trajectory: the calls R1-Distill renders only for None are in the action."""
    from echo_trl.data.build import trajectories_to_dataset

    t = hard_trajectory()
    t.completion = [{**m, "content": None} if m.get("tool_calls") else m for m in t.completion]
    row = trajectories_to_dataset([t])[0]
    assert [m["content"] for m in row["completion"] if m["tool_calls"]] == [None] * 5
    tok = family_tokenizer("deepseek_r1_distill")
    from_row, from_trajectory = tokenize_with_roles(tok, row), tokenize_with_roles(tok, t)
    assert from_row.input_ids == from_trajectory.input_ids
    assert from_row.roles.tolist() == from_trajectory.roles.tolist()
    action = tok.decode([i for i, r in zip(from_row.input_ids, from_row.roles, strict=True) if r == ACTION])
    assert action.count("<｜tool▁call▁begin｜>") == 5 and 'blue \\"pens\\" 4' in action
