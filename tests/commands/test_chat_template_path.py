"""`--chat_template_path` on every command that renders: stats, eval-world-model, train and sft, one template.

The model here ships a ChatML template that cannot render tool calls (SmolLM2-135M-Instruct's own, kept in
tests/fixtures/chat_templates); TRL's bundled qwen2_5.jinja renders the same ChatML tokens with tool calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.families import DATA

from echo_trl.commands.cli import main as cli_main
from echo_trl.data.build import build_awm_dataset
from echo_trl.demo.episodes import synthetic_episodes, write_episodes
from echo_trl.demo.tiny import trl_chat_template
from echo_trl.tokens.template.chat_template import template_digest

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny ChatML model whose own template renders no tool calls, a trajectory dataset and qwen2_5.jinja."""
    from transformers import AutoTokenizer

    from echo_trl.demo.tiny import ensure_tiny_model

    root = tmp_path_factory.mktemp("chat-template-path")
    ds = build_awm_dataset([write_episodes(synthetic_episodes(n_tasks=2, per_task=2), root / "eps.jsonl")])
    ds.save_to_disk(str(root / "ds"))
    corpus = [m["content"] for row in ds for m in row["completion"]]
    model = ensure_tiny_model(root / "model", family="qwen2_5", corpus=corpus, vocab_size=800, hidden_size=32)
    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = (DATA / "smollm2_instruct.jinja").read_text(encoding="utf-8")
    tok.save_pretrained(model)
    template = root / "qwen2_5.jinja"
    template.write_text(trl_chat_template("qwen2_5"), encoding="utf-8")
    return root, model, template


def _tokenizer_with(model: Path, template: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.chat_template = template.read_text(encoding="utf-8")
    return tok


def test_stats_counts_with_the_template_given(assets, capsys):
    from echo_trl.data.store import load_echo_dataset
    from echo_trl.tokens.tokenization import tokenize_with_roles

    root, model, template = assets
    argv = ["stats", str(root / "ds"), "--tokenizer", str(model), "--json"]
    assert cli_main(argv) == 2
    assert "tool_calls" in capsys.readouterr().err  # its own ChatML template renders no tool calls
    assert cli_main([*argv, "--chat_template_path", str(template)]) == 0
    got = json.loads(capsys.readouterr().out)
    tok = _tokenizer_with(model, template)
    rows = [tokenize_with_roles(tok, row) for row in load_echo_dataset(str(root / "ds"))]
    assert got["total_tokens"] == sum(len(t) for t in rows)
    assert got["tokens"]["env_output"] == sum(sum(t.env_output_mask) for t in rows)


def test_eval_world_model_renders_with_the_template_given(assets, capsys):
    from transformers import AutoModelForCausalLM

    from echo_trl.data.store import load_echo_dataset
    from echo_trl.train.world_eval import evaluate_world_model

    root, model, template = assets
    argv = ["eval-world-model", "--model", str(model), "--dataset", str(root / "ds"), "--device", "cpu"]
    assert cli_main([*argv, "--json", "--chat_template_path", str(template)]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = evaluate_world_model(
        AutoModelForCausalLM.from_pretrained(model),
        _tokenizer_with(model, template),
        load_echo_dataset(str(root / "ds")),
        show_progress=False,
    )
    assert got["chat_template_path"] == str(template)
    assert got["tokens_env"] == expected["tokens_env"] > 0
    assert got["ce_env"] == pytest.approx(expected["ce_env"], rel=1e-5)
    assert cli_main([*argv, "--chat_template_path", str(root / "missing.jinja")]) == 2
    assert "--chat_template_path" in capsys.readouterr().err


TRAINING = [
    "--max_steps",
    "1",
    "--per_device_train_batch_size",
    "2",
    "--use_cpu",
    "--report_to",
    "none",
    "--save_strategy",
    "no",
    "--max_completion_length",
    "512",
    "--gradient_checkpointing",
    "false",
    "--disable_tqdm",
    "true",
]


@pytest.mark.parametrize("command", ["train", "sft"])
def test_train_and_sft_render_save_and_record_the_template(assets, tmp_path, command):
    from transformers import AutoTokenizer

    root, model, template = assets
    out = tmp_path / command
    argv = [command, "--model_name_or_path", str(model), "--dataset_name", str(root / "ds"), "--output_dir", str(out)]
    argv += [*TRAINING, *(["--num_generations", "2"] if command == "train" else [])]
    assert cli_main(argv) == 2  # the model's own template renders no tool calls
    assert cli_main([*argv, "--chat_template_path", str(template.with_name("missing.jinja"))]) == 2
    assert cli_main([*argv, "--chat_template_path", str(template)]) == 0
    text = template.read_text(encoding="utf-8")
    assert AutoTokenizer.from_pretrained(out).chat_template == text  # the trained model carries it
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"| chat template | `qwen2_5.jinja` (`chat_template_path`), sha256 `{template_digest(text)}` |" in card


def test_capture_model_policy_plays_with_the_template_given(assets):
    """`capture --policy model:PATH`: a ChatML template without tool calls is refused; the one given is played."""
    from echo_trl.commands.capture.args import CaptureArguments
    from echo_trl.commands.capture.run import model_policy, settings
    from echo_trl.errors import EchoTrlError

    root, model, template = assets
    flags = dict(data=str(root), scenario=["library_1"], policy=f"model:{model}", output=str(root / "cap"))
    with pytest.raises(EchoTrlError, match="tool calls"):
        model_policy(CaptureArguments(**flags), str(model))  # its own template parses no tool calls
    missing = CaptureArguments(**flags, chat_template_path=str(template.with_name("missing.jinja")))
    with pytest.raises(EchoTrlError, match="--chat_template_path"):
        model_policy(missing, str(model))
    args = CaptureArguments(**flags, chat_template_path=str(template))
    policy = model_policy(args, str(model))
    assert policy.tokenizer.chat_template == template.read_text(encoding="utf-8")
    messages = [{"role": "user", "content": "find book 7"}]
    tools = [{"type": "function", "function": {"name": "get_book", "parameters": {"type": "object"}}}]
    prompt = policy.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert "get_book" in prompt and prompt.endswith("<|im_start|>assistant\n")  # the tools reach the prompt
    assert settings(args, policy.tokenizer)["chat_template_path"] == str(template)  # a rerun must keep it
