"""Tiny local tokenizers and models: the no-download default for the demo, tests and benchmarks.

The tokenizers are BPE models trained in well under a second with ``tokenizers`` and carry a
chat template copied byte for byte from TRL's bundled templates: TRL recognises tool-calling
templates only by exact identity, so anything else would not exercise TRL's real code paths.
The models are random-init configs of real architectures (Qwen2, Qwen3, Llama). ``tokenizers``,
``transformers`` and torch load on the first build, not on import.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from .publish import finished_record, publish_dir


#: Special tokens and model architecture per chat-template family TRL bundles.
@dataclass(frozen=True)
class TemplateFamily:
    template: str  # file name (without .jinja) in trl/chat_templates
    special: tuple[str, ...]  # special tokens; the first is the padding token
    added: tuple[str, ...]  # non-special added tokens (tool-call markup)
    eos: str
    bos: str | None
    architecture: str


FAMILIES: dict[str, TemplateFamily] = {
    "qwen2_5": TemplateFamily(
        "qwen2_5",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"),
        "<|im_end|>",
        None,
        "qwen2",
    ),
    "qwen3": TemplateFamily(
        "qwen3",
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"),
        "<|im_end|>",
        None,
        "qwen3",
    ),
    "llama3_1": TemplateFamily(
        "llama3_1",
        (
            "<|end_of_text|>",
            "<|begin_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        (),
        "<|eot_id|>",
        "<|begin_of_text|>",
        "llama",
    ),
}

_BASE_CORPUS = [
    "You are an agent operating in the environment. Use the available tools to complete the user's task.",
    '{"name": "search_products", "arguments": {"query": "wireless headphones", "limit": 5}}',
    '{"type": "function", "function": {"name": "list_items", "description": "List items.", '
    '"parameters": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}}}',
    "Error: unknown tool. Tool call failed with status 422: invalid argument 'product_id'.",
    '{\n  "result": "complete",\n  "items": [\n    {"id": 1, "title": "Notebook", "price": 12.5}\n  ]\n}',
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\nEnvironment: ipython\n",
    "Given the following functions, please respond with a JSON for a function call with its proper arguments.",
]


#: The pre-tokenization regex of the Qwen2/Qwen3 and Llama-3 tokenizers (Llama-3 groups digits by
#: three; the difference does not matter here). Using it makes BPE merges cross the same
#: boundaries as in the real tokenizers, e.g. a JSON ``}`` merging with the newline after it.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def trl_chat_template(name: str) -> str:
    """The exact text of one of TRL's bundled chat templates (e.g. ``"qwen3"``)."""
    return (resources.files("trl") / "chat_templates" / f"{name}.jinja").read_text(encoding="utf-8")


def bpe_tokenizer(
    *,
    special: Sequence[str],
    chat_template: str,
    corpus: Iterable[str],
    eos: str | None,
    bos: str | None = None,
    added: Sequence[str] = (),
    vocab_size: int = 1024,
):
    """A byte-level BPE tokenizer trained locally on ``corpus``, carrying a family's special tokens (the first
    is its pad token), its added tokens and its chat template: the one builder of every tiny tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(corpus), trainer=trainer)
    if added:
        tok.add_tokens(list(added))
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=eos,
        pad_token=special[0],
        bos_token=bos,
        unk_token=None,
        model_max_length=1 << 20,
    )
    hf.chat_template = chat_template
    return hf


def build_tiny_tokenizer(family: str = "qwen3", corpus: Iterable[str] = (), vocab_size: int = 1024):
    """A byte-level BPE tokenizer with a real TRL chat template, trained locally on ``corpus``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown template family {family!r}; choose one of {', '.join(FAMILIES)}")
    fam = FAMILIES[family]
    return bpe_tokenizer(
        special=fam.special,
        chat_template=trl_chat_template(fam.template),
        corpus=[*_BASE_CORPUS, *corpus],
        eos=fam.eos,
        bos=fam.bos,
        added=fam.added,
        vocab_size=vocab_size,
    )


def build_tiny_model(
    tokenizer, family: str = "qwen3", *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0
):
    """A random-init causal LM of the family's architecture, sized to ``tokenizer``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fam = FAMILIES[family]
    config = AutoConfig.for_model(
        fam.architecture,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        head_dim=hidden_size // num_heads,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


#: Written last into a saved tiny model's directory.
TINY_MARKER = "echo_trl_tiny.json"


def ensure_tiny_model(
    path: str | Path,
    *,
    family: str = "qwen3",
    corpus: Iterable[str] = (),
    vocab_size: int = 2048,
    hidden_size: int = 128,
    num_layers: int = 2,
) -> Path:
    """Build and save a tiny model + tokenizer at ``path`` once; later calls reuse it (written whole or not at
    all: :func:`~echo_trl.demo.publish.publish_dir`)."""
    path = Path(path)
    if finished_record(path, TINY_MARKER) is not None:
        return path
    tokenizer = build_tiny_tokenizer(family, corpus, vocab_size=vocab_size)
    model = build_tiny_model(tokenizer, family, hidden_size=hidden_size, num_layers=num_layers)
    record = {"family": family, "vocab_size": vocab_size, "hidden_size": hidden_size, "num_layers": num_layers}

    def write(directory: Path) -> None:
        tokenizer.save_pretrained(directory)
        model.save_pretrained(directory)
        (directory / TINY_MARKER).write_text(json.dumps(record), encoding="utf-8")  # last: marks it finished

    publish_dir(path, TINY_MARKER, write, needs=sum(p.numel() * p.element_size() for p in model.parameters()))
    return path


def corpus_of(rows) -> Iterator[str]:
    """The texts of trajectory dataset rows a tiny tokenizer is trained on: every message's content, and each
    tool call's arguments followed by its name."""
    for row in rows:
        yield from (m["content"] or "" for m in row["prompt"] + row["completion"])
        yield from (
            str(c["function"]["arguments"]) + c["function"]["name"]
            for m in row["completion"]
            for c in (m.get("tool_calls") or [])
        )


def tiny_model_for(rows, cache_dir: Path) -> Path:
    """The tiny Qwen3 model whose tokenizer was trained on ``rows``' text, built once per corpus under
    ``cache_dir`` (keyed by the corpus' hash, so a changed dataset gets its own model)."""
    corpus = list(corpus_of(rows))
    digest = hashlib.sha256("\x00".join(corpus).encode()).hexdigest()[:12]
    return ensure_tiny_model(cache_dir / f"tiny-qwen3-{digest}", family="qwen3", corpus=corpus)
