"""`chat_template_path` (TRL's convention): a .jinja file or a tokenizer to take the template from."""

from __future__ import annotations

import copy

import pytest
from helpers.families import DATA
from helpers.tiny import tiny_tokenizer
from helpers.trainer import trajectory

from echo_trl.data.schema import trajectory_to_row
from echo_trl.demo.tiny import trl_chat_template
from echo_trl.errors import EchoTrlError
from echo_trl.tokens.template.chat_template import (
    apply_chat_template_path,
    read_chat_template,
    template_digest,
    template_label,
    with_chat_template_path,
)
from echo_trl.tokens.tokenization import tokenize_with_roles

SMOLLM2 = DATA / "smollm2_instruct.jinja"  # ChatML without tool calls (SmolLM2-135M-Instruct's own)


def chatml_without_tools():
    """A tokenizer with Qwen 2.5's ChatML tokens and SmolLM2's template, which cannot render tool calls."""
    tok = copy.deepcopy(tiny_tokenizer("qwen2_5"))
    tok.chat_template = SMOLLM2.read_text(encoding="utf-8")
    return tok


def qwen2_5_file(tmp_path):
    path = tmp_path / "qwen2_5.jinja"
    path.write_text(trl_chat_template("qwen2_5"), encoding="utf-8")
    return path


def test_a_jinja_file_makes_a_tokenizer_render_tool_calls_exactly(tmp_path):
    row = trajectory_to_row(trajectory(3, 1.0, "g"))
    tok = chatml_without_tools()
    with pytest.raises(EchoTrlError, match="tool_calls"):
        tokenize_with_roles(tok, row)
    assert apply_chat_template_path(tok, str(qwen2_5_file(tmp_path))) is tok
    assert tok.chat_template == trl_chat_template("qwen2_5")
    # the same tokens as the family's own tokenizer, whose template this is (same vocabulary and special tokens)
    reference = tokenize_with_roles(tiny_tokenizer("qwen2_5"), row)
    got = tokenize_with_roles(tok, row)
    assert got.input_ids == reference.input_ids and got.roles.tolist() == reference.roles.tolist()


def test_none_leaves_the_tokenizer_as_it_is():
    tok = chatml_without_tools()
    before = tok.chat_template
    assert apply_chat_template_path(tok, None) is tok and tok.chat_template == before


def test_a_tokenizer_directory_lends_its_template(tmp_path):
    tiny_tokenizer("qwen2_5").save_pretrained(tmp_path / "source")
    tok = apply_chat_template_path(chatml_without_tools(), str(tmp_path / "source"))
    assert tok.chat_template == trl_chat_template("qwen2_5")


def test_a_template_needing_special_tokens_the_vocabulary_lacks_is_refused(tmp_path):
    tiny_tokenizer("qwen2_5").save_pretrained(tmp_path / "source")
    llama = copy.deepcopy(tiny_tokenizer("llama3_1"))  # no <|im_start|> / <|im_end|> in its vocabulary
    with pytest.raises(EchoTrlError, match=r"special tokens this tokenizer lacks \(.*<\|im_end\|>.*\.jinja"):
        apply_chat_template_path(llama, str(tmp_path / "source"))
    # as a file the same template renders them as text, as TRL's SFT does with a .jinja file
    apply_chat_template_path(llama, str(qwen2_5_file(tmp_path)))
    assert llama.chat_template == trl_chat_template("qwen2_5")


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("missing.jinja", None, "no such file"),
        ("template.txt", "{{ messages }}", "must be a Jinja template"),
        ("empty.j2", "  \n", "is empty"),
        ("not_utf8.jinja", b"\xff\xfe{{ x }}", "cannot read"),
        ("no_such_dir", None, "no such file or directory"),
    ],
)
def test_bad_paths_are_one_line_naming_the_flag(tmp_path, name, content, needle):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(EchoTrlError, match=needle) as exc:
        read_chat_template(str(path))
    assert "--chat_template_path" in str(exc.value) and "\n" not in str(exc.value)


def test_a_tokenizer_without_a_template_has_none_to_lend(tmp_path):
    source = copy.deepcopy(tiny_tokenizer("qwen2_5"))
    source.chat_template = None
    source.save_pretrained(tmp_path / "bare")
    with pytest.raises(EchoTrlError, match="has no chat template to take"):
        read_chat_template(str(tmp_path / "bare"))


def test_the_trainer_loads_the_model_tokenizer_as_trl_does_and_sets_the_template(tmp_path):
    class Args:
        chat_template_path = str(qwen2_5_file(tmp_path))
        trust_remote_code = False
        model_init_kwargs = None

    chatml_without_tools().save_pretrained(tmp_path / "model")
    tok = with_chat_template_path(str(tmp_path / "model"), None, Args)
    assert tok.chat_template == trl_chat_template("qwen2_5")
    assert (tok.padding_side, tok.truncation_side) == ("left", "left")  # TRL 1.16 GRPOTrainer's loading
    Args.chat_template_path = None
    assert with_chat_template_path(str(tmp_path / "model"), None, Args) is None  # TRL loads it itself


def test_cards_name_the_template_by_file_name_and_digest(tmp_path):
    import hashlib

    text = trl_chat_template("qwen2_5")
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    assert template_digest(text) == digest
    path = qwen2_5_file(tmp_path)
    label = template_label(text, str(path))
    assert label == f"`qwen2_5.jinja` (`chat_template_path`), sha256 `{digest}`" and str(tmp_path) not in label
    assert template_label(text, None) == f"the tokenizer's own, sha256 `{digest}`"
    assert template_label(None, "Org/model") == "`Org/model` (`chat_template_path`)"
