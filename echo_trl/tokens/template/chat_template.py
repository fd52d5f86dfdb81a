"""``chat_template_path``: render with another chat template than the one a tokenizer ships, TRL's way.

TRL's ``SFTConfig.chat_template_path`` names either a Jinja file (``.jinja`` / ``.j2``) or a tokenizer (a local
directory or a Hub id) whose chat template is taken. echo_trl takes the same value everywhere it renders or
generates (``train``, ``sft``, ``stats``, ``eval-world-model``, ``capture``, and ``EchoGRPOConfig``), so a model
whose own template cannot render tool calls (SmolLM2's ChatML) is trained, counted, evaluated and played with
one template. The tokens come from the template set on the tokenizer, so the token cache, whose key hashes the
tokenizer's chat template (:func:`echo_trl.tokens.cache.tokenizer_fingerprint`), is per template by construction.

What differs from TRL: its SFT trainer, given a tokenizer (not a file), also adds that tokenizer's special tokens
and resizes the model's embeddings (``clone_chat_template``). Outside ``sft`` there is no model to resize (``stats``)
or resizing would change the model being measured (``eval-world-model``), so a template that needs special tokens
the vocabulary lacks is refused in one line instead (a ``.jinja`` file renders them as plain text, as TRL does).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from ...errors import EchoTrlError

__all__ = [
    "JINJA_SUFFIXES",
    "apply_chat_template_path",
    "read_chat_template",
    "template_digest",
    "template_label",
    "with_chat_template_path",
]

#: What TRL reads as a Jinja template file (``SFTTrainer``: ``endswith((".jinja", ".j2"))``).
JINJA_SUFFIXES = (".jinja", ".j2")


def read_chat_template(path: str, *, trust_remote_code: bool = False) -> tuple[str, set[str]]:
    """The template named by ``path`` and the special tokens its source tokenizer defines (none for a file).

    Errors are one line naming ``--chat_template_path`` and the path.
    """
    flag = f"--chat_template_path {path}"
    p = Path(path).expanduser()
    if p.is_file():
        if not p.name.endswith(JINJA_SUFFIXES):
            raise EchoTrlError(f"{flag}: a file must be a Jinja template ({' or '.join(JINJA_SUFFIXES)})")
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise EchoTrlError(f"{flag}: cannot read the template ({exc})") from None
        if not text.strip():
            raise EchoTrlError(f"{flag}: the template file is empty")
        return text, set()
    if p.name.endswith(JINJA_SUFFIXES):  # a template file that is not there: never a Hub id
        raise EchoTrlError(f"{flag}: no such file")
    from transformers import AutoTokenizer

    from ...data.hub import load_failure, locate

    locate(path, "--chat_template_path")  # a missing local path is one line; a Hub id only when reachable
    try:
        source = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise load_failure("--chat_template_path tokenizer", path, exc) from None
    if not getattr(source, "chat_template", None):
        raise EchoTrlError(f"{flag}: that tokenizer has no chat template to take")
    template = source.get_chat_template()
    return template, {t.content for t in source.added_tokens_decoder.values()}


def apply_chat_template_path(tokenizer, path: str | None, *, trust_remote_code: bool = False):
    """``tokenizer`` (changed in place, and returned) rendering with the template at ``path``; ``None``: as is.

    A template taken from another tokenizer that writes one of that tokenizer's special tokens the vocabulary
    of ``tokenizer`` lacks is refused (the token would be split into pieces here, but added as one token by TRL's
    SFT): pass the ``.jinja`` file instead, to render it as text everywhere.
    """
    if path is None:
        return tokenizer
    template, source_tokens = read_chat_template(path, trust_remote_code=trust_remote_code)
    vocab = tokenizer.get_vocab()
    missing = sorted(t for t in source_tokens if t in template and t not in vocab)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise EchoTrlError(
            f"--chat_template_path {path}: the template writes special tokens this tokenizer lacks ({shown}); "
            "pass the template as a .jinja file to render them as plain text"
        )
    tokenizer.chat_template = template
    return tokenizer


def template_digest(template: str | dict | None) -> str | None:
    """The first 12 hex digits of the template's SHA-256 (a dict of named templates: of its sorted items)."""
    if not template:
        return None
    text = template if isinstance(template, str) else repr(sorted(template.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def template_label(template: str | dict | None, path: str | None) -> str:
    """How a card names the template: where it came from and its digest, e.g.
    ``qwen2_5.jinja (sha256 1a2b3c4d5e6f)`` or ``the tokenizer's own (sha256 ...)``."""
    digest = template_digest(template)
    name = Path(path).name if path and Path(path).expanduser().exists() else path  # a local path: its name only
    source = f"`{name}` (`chat_template_path`)" if path else "the tokenizer's own"
    return f"{source}, sha256 `{digest}`" if digest else source


def with_chat_template_path(model, processing_class, args):
    """The trainer's processing class rendering with ``args.chat_template_path``: the one passed, or the model's
    tokenizer loaded as TRL 1.16's ``GRPOTrainer`` loads it (left padding and truncation), with the template set.

    For ``EchoGRPOTrainer``, whose TRL base takes no ``chat_template_path``; TRL's ``SFTTrainer`` applies its own.
    Without a ``chat_template_path`` the processing class is returned as it is (``None``: TRL loads it).
    """
    if getattr(args, "chat_template_path", None) is None:
        return processing_class
    if processing_class is None:
        from transformers import AutoTokenizer

        name = model if isinstance(model, str) else model.name_or_path
        revision = (getattr(args, "model_init_kwargs", None) or {}).get("revision")
        processing_class = AutoTokenizer.from_pretrained(
            name,
            revision=revision,
            padding_side="left",
            truncation_side="left",
            trust_remote_code=args.trust_remote_code,
        )
    tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a processor renders with its tokenizer's
    apply_chat_template_path(tokenizer, args.chat_template_path, trust_remote_code=args.trust_remote_code)
    if tokenizer is not processing_class:
        processing_class.chat_template = tokenizer.chat_template
    return processing_class
