"""Tiny tokenizers carrying each model family's real special tokens and its real chat template.

Templates are read, byte for byte, from the installed TRL (``trl/chat_templates``, pinned with TRL) or
from ``tests/fixtures/chat_templates`` (official templates of other families, with their sources in
``SOURCES.md`` there). The tokenizers are byte-level BPE models trained locally in well under a second;
their special and added tokens are the families' own, so a render uses the same control tokens a real
checkpoint of the family would split on.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "fixtures" / "chat_templates"


@dataclass(frozen=True)
class Tokens:
    special: tuple[str, ...]  # special tokens; the first is the padding token
    added: tuple[str, ...]  # added tokens that are not special (markup the model writes as text)
    eos: str
    bos: str | None


_QWEN_MARKUP = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")
_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
_LLAMA3 = (
    "<|end_of_text|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)
_DEEPSEEK = (
    "<｜end▁of▁sentence｜>",
    "<｜begin▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
)
_GEMMA4 = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|think|>",
    "<|image|>",
    "<|audio|>",
    "<|video|>",
)
_COHERE = (
    "<PAD>",
    "<BOS_TOKEN>",
    "<EOS_TOKEN>",
    "<|START_OF_TURN_TOKEN|>",
    "<|END_OF_TURN_TOKEN|>",
    "<|USER_TOKEN|>",
    "<|CHATBOT_TOKEN|>",
    "<|SYSTEM_TOKEN|>",
    "<|START_RESPONSE|>",
    "<|END_RESPONSE|>",
    "<|START_THINKING|>",
    "<|END_THINKING|>",
    "<|START_ACTION|>",
    "<|END_ACTION|>",
    "<|START_TOOL_RESULT|>",
    "<|END_TOOL_RESULT|>",
)
_MISTRAL = (
    "<pad>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
    "[ARGS]",
    "[CALL_ID]",
)
_GRANITE = (
    "<|pad|>",
    "<|end_of_text|>",
    "<|start_of_role|>",
    "<|end_of_role|>",
    "<|tool_call|>",
    "<|start_of_cite|>",
    "<|end_of_cite|>",
    "<|start_of_plugin|>",
    "<|end_of_plugin|>",
)
_LFM2 = (
    "<|pad|>",
    "<|startoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
)

#: Special and added tokens per family (as the family's tokenizers define them).
TOKENS: dict[str, Tokens] = {
    "qwen": Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>"), _QWEN_MARKUP, "<|im_end|>", None),
    "qwen_vl": Tokens(("<|endoftext|>", "<|im_start|>", "<|im_end|>", *_VISION), _QWEN_MARKUP, "<|im_end|>", None),
    "nemotron": Tokens(("<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"), _QWEN_MARKUP, "<|im_end|>", "<s>"),
    "llama3": Tokens(_LLAMA3, (), "<|eot_id|>", "<|begin_of_text|>"),
    "hermes3": Tokens((*_LLAMA3, "<|im_start|>", "<|im_end|>"), _QWEN_MARKUP[:4], "<|im_end|>", "<|begin_of_text|>"),
    "smollm3": Tokens(
        ("<|end_of_text|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"), _QWEN_MARKUP, "<|im_end|>", None
    ),
    "glm": Tokens(
        (
            "<|endoftext|>",
            "[MASK]",
            "[gMASK]",
            "[sMASK]",
            "<sop>",
            "<eop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
        ),
        (*_QWEN_MARKUP, "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        "<|endoftext|>",
        None,
    ),
    "gptoss": Tokens(
        (
            "<|endoftext|>",
            "<|startoftext|>",
            "<|return|>",
            "<|constrain|>",
            "<|channel|>",
            "<|start|>",
            "<|end|>",
            "<|message|>",
            "<|call|>",
        ),
        (),
        "<|return|>",
        "<|startoftext|>",
    ),
    "deepseek": Tokens(_DEEPSEEK, ("<think>", "</think>"), "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>"),
    "gemma": Tokens(
        ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"),
        (),
        "<eos>",
        "<bos>",
    ),
    "gemma4": Tokens(_GEMMA4, (), "<eos>", "<bos>"),
    "lfm2": Tokens(_LFM2, ("<think>", "</think>", "<image>"), "<|im_end|>", "<|startoftext|>"),
    "muse": Tokens(
        ("<|pad|>", "<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|message|>", "<|eot|>", "<|eom|>"),
        ("<|patch|>", "<|video|>"),
        "<|eot|>",
        "<|begin_of_text|>",
    ),
    "cohere": Tokens(_COHERE, ("<co>", "</co>"), "<|END_OF_TURN_TOKEN|>", "<BOS_TOKEN>"),
    "phi3": Tokens(
        ("<|endoftext|>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"),
        (),
        "<|endoftext|>",
        "<s>",
    ),
    "phi4": Tokens(
        (
            "<|endoftext|>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|end|>",
            "<|tool|>",
            "<|/tool|>",
            "<|tool_call|>",
            "<|/tool_call|>",
            "<|tool_response|>",
        ),
        (),
        "<|endoftext|>",
        "<|endoftext|>",
    ),
    "mistral": Tokens(_MISTRAL, (), "</s>", "<s>"),
    "kimi": Tokens(
        (
            "[PAD]",
            "[BOS]",
            "[EOS]",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>",
            "<|media_start|>",
            "<|media_content|>",
            "<|media_end|>",
            "<|media_pad|>",
        ),
        (),
        "[EOS]",
        "[BOS]",
    ),
    "granite": Tokens(_GRANITE, (*_QWEN_MARKUP, "<response>", "</response>"), "<|end_of_text|>", "<|end_of_text|>"),
    "vlm": Tokens(
        (
            "<|endoftext|>",
            "<|begin_of_text|>",
            "<|im_start|>",
            "<|im_end|>",
            "<end_of_utterance>",
            "[INST]",
            "[/INST]",
            "</s>",
        ),
        ("<image>",) + _VISION,
        "<|im_end|>",
        "<|begin_of_text|>",
    ),
}


def _tokens_of_trl(name: str) -> str:
    """The token set of a TRL bundled template, by its file name."""
    base = name.removesuffix("_training")
    for prefix, key in (
        ("qwen2_5_vl", "vlm"),
        ("qwen3_vl", "qwen_vl"),
        ("qwen3_5", "qwen_vl"),
        ("qwen3_6", "qwen_vl"),
        ("qwen3_8", "qwen_vl"),
        ("qwen", "qwen"),
        ("nemotron", "nemotron"),
        ("llama3", "llama3"),
        ("glm", "glm"),
        ("gptoss", "gptoss"),
        ("deepseek", "deepseek"),
        ("gemma4", "gemma4"),
        ("diffusion_gemma", "gemma4"),
        ("gemma", "gemma"),
        ("lfm2", "lfm2"),
        ("muse", "muse"),
        ("cohere", "cohere"),
        ("phi3", "phi3"),
        ("idefics3", "vlm"),
        ("llava_next", "vlm"),
        ("smolvlm", "vlm"),
    ):
        if base.startswith(prefix):
            return key
    raise KeyError(f"no token set for TRL template {name!r}")


#: The official templates kept in tests/fixtures/chat_templates (see SOURCES.md there) and their token sets.
OFFICIAL: dict[str, str] = {
    "mistral_nemo": "mistral",
    "mistral_small_3_2": "mistral",
    "hermes3_tool_use": "hermes3",
    "phi4_mini": "phi4",
    "command_r7b_tool_use": "cohere",
    "deepseek_v3_1": "deepseek",
    "glm4_6": "glm",
    "kimi_k2": "kimi",
    "granite3_3": "granite",
    "granite4_0": "granite",
    "smollm3_unsloth": "smollm3",
    "qwen3_coder": "qwen",
}

#: Families whose official template is byte-identical to a TRL bundled one (same git blob; SOURCES.md).
SAME_AS_TRL = {"llama3_3": "llama3_1"}


def trl_template_names() -> list[str]:
    """Every chat template TRL bundles, by file name."""
    return sorted(
        p.name[: -len(".jinja")]
        for p in (resources.files("trl") / "chat_templates").iterdir()
        if p.name.endswith(".jinja")
    )


def template_text(family: str) -> str:
    """The exact jinja text of a family's template (TRL's installed file or the sourced official one)."""
    if family in OFFICIAL:
        return (DATA / f"{family}.jinja").read_text(encoding="utf-8")
    name = SAME_AS_TRL.get(family, family)
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tokens_of(family: str) -> Tokens:
    return TOKENS[OFFICIAL.get(family) or _tokens_of_trl(SAME_AS_TRL.get(family, family))]


CORPUS = [
    "You are an agent operating in the environment. Use the available tools to complete the user's task.",
    '{"name": "search_products", "arguments": {"query": "wireless headphones", "limit": 5}}',
    '{"type": "function", "function": {"name": "list_items", "description": "List items.", '
    '"parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}',
    "Error: unknown tool. Tool call failed with status 422: invalid argument 'product_id'.",
    '{\n  "result": "complete",\n  "items": [\n    {"id": 1, "title": "Notebook", "price": 12.5}\n  ]\n}',
    "<parameter=query>\nvalue\n</parameter>\n</function>\nfunctions.lookup:0 to=assistant commentary json",
]


@functools.cache
def family_tokenizer(family: str, vocab_size: int = 1024):
    """A tiny byte-level BPE tokenizer with ``family``'s special tokens and real chat template (cached: treat it
    as read-only)."""
    from echo_trl.demo.tiny import bpe_tokenizer

    spec = tokens_of(family)
    return bpe_tokenizer(
        special=spec.special,
        chat_template=template_text(family),
        corpus=CORPUS,
        eos=spec.eos,
        bos=spec.bos,
        added=spec.added,
        vocab_size=vocab_size,
    )
