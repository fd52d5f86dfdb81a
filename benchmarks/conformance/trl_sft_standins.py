"""Local stand-ins for the ``trl-internal-testing`` models and datasets TRL's SFT test file loads (offline).

TRL's ``tests/test_sft_trainer.py`` loads tiny models (``trl-internal-testing/tiny-Qwen2ForCausalLM-2.5``, ...)
and small datasets (``trl-internal-testing/zen``, ``toolcall``, ``harmony``) from the Hub. This script builds a
folder ``ROOT/trl-internal-testing/<name>`` for each, so that a run whose working directory is ``ROOT`` resolves
those ids to the local folders (``from_pretrained`` and ``load_dataset`` take a local path first):

* datasets: TRL's own generator scripts (kept in ``tests/fixtures/trl_sft/``), their ``push_to_hub`` replaced by a
  local parquet write, with the ``configs`` metadata the Hub reads;
* models: random-init configs of the same architecture (2 layers, width 32) with a byte-level BPE tokenizer
  trained locally and TRL's bundled chat template of that model family (TRL recognises its templates by identity).
  Vision-language models, remote-code models and datasets with images are not built: the tests that load them fail
  for every trainer alike, and the conformance runner reports them.

    python benchmarks/conformance/trl_sft_standins.py ROOT
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "trl_sft"
ORG = "trl-internal-testing"
#: File in each model folder naming the sizes it was built with: a folder built with other sizes is rebuilt.
STAMP = "echo_trl_standin.json"

#: model id -> (transformers model_type, TRL bundled chat template or None, eos token)
MODELS: dict[str, tuple[str, str | None, str]] = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "qwen2_5", "<|im_end|>"),
    "tiny-Qwen3ForCausalLM": ("qwen3", "qwen3", "<|im_end|>"),
    "tiny-Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3", "<|im_end|>"),
    "tiny-LlamaForCausalLM-3": ("llama", "llama3", "<|eot_id|>"),
    "tiny-LlamaForCausalLM-3.1": ("llama", "llama3_1", "<|eot_id|>"),
    "tiny-LlamaForCausalLM-3.2": ("llama", "llama3_2", "<|eot_id|>"),
    "tiny-MistralForCausalLM-0.1": ("mistral", None, "</s>"),
    "tiny-MistralForCausalLM-0.2": ("mistral", None, "</s>"),
    "tiny-GPTNeoXForCausalLM": ("gpt_neox", None, "<|endoftext|>"),
    "tiny-GptOssForCausalLM": ("gpt_oss", "gptoss", "<|return|>"),
    "tiny-GemmaForCausalLM": ("gemma", "gemma", "<end_of_turn>"),
    "tiny-Gemma2ForCausalLM": ("gemma2", "gemma", "<end_of_turn>"),
    "tiny-CohereForCausalLM": ("cohere", "cohere", "<|END_OF_TURN_TOKEN|>"),
    "tiny-Cohere2ForCausalLM": ("cohere2", "cohere2", "<|END_OF_TURN_TOKEN|>"),
    "tiny-DeepseekV3ForCausalLM": ("deepseek_v3", "deepseekv3", "<｜end▁of▁sentence｜>"),
    "tiny-DeepseekV3ForCausalLM-0528": ("deepseek_v3", "deepseekv3", "<｜end▁of▁sentence｜>"),
    "tiny-Glm4MoeForCausalLM": ("glm4_moe", "glm4moe", "<|endoftext|>"),
    "tiny-Lfm2ForCausalLM": ("lfm2", "lfm2", "<|im_end|>"),
    "tiny-Lfm2ForCausalLM-2.5": ("lfm2", "lfm2_2_5", "<|im_end|>"),
    "tiny-Phi3ForCausalLM": ("phi3", "phi3", "<|end|>"),
    "tiny-Olmo3ForCausalLM": ("olmo3", None, "<|endoftext|>"),
    "tiny-NemotronHForCausalLM-nano": ("nemotron_h", "nemotron_3_nano", "<|im_end|>"),
}

#: Small sizes every architecture above takes (unknown keys are kept as plain attributes by the configs).
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 1024,
    # MoE
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    # MLA (DeepSeek-V3)
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 4,
    "qk_nope_head_dim": 4,
    "v_head_dim": 8,
}

#: Per-model sizes on top of ``TINY``: Nemotron-H's Mamba-2 mixer keeps its full-size defaults otherwise (128 heads of
#: 64, state 128, 8 groups: 8192 wide, a 5.8 MB model whose pure-torch scan took minutes per test on 2 CPU cores).
EXTRA: dict[str, dict[str, int]] = {
    "tiny-NemotronHForCausalLM-nano": {
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "ssm_state_size": 16,
        "n_groups": 1,
        "chunk_size": 32,
        "moe_shared_expert_intermediate_size": 16,
    },
}

_SPECIAL = re.compile(r"<\|[^|\s{}]+\|>|<｜[^｜]+｜>|</?(?:start_of_turn|end_of_turn|think|tool_call|tool_response)>")


def _tokenizer(template: str | None, eos: str):
    from echo_trl.demo.tiny import bpe_tokenizer, trl_chat_template

    text = trl_chat_template(template) if template else None
    special = sorted(set(_SPECIAL.findall(text or "")) | {eos})
    pad = "<|endoftext|>" if "<|endoftext|>" in special else "<pad>"
    special = [pad, *[s for s in special if s != pad]]
    corpus = [(FIXTURES / n).read_text() for n in ("generate_zen_dataset.py", "generate_toolcall_dataset.py")]
    tok = bpe_tokenizer(special=special, chat_template=text, corpus=corpus, eos=eos, vocab_size=1024)
    if text is None:
        tok.chat_template = None
    return tok


def build_model(root: Path, name: str) -> str | None:
    """Build one model folder; the error text when its architecture cannot be built this way."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    model_type, template, eos = MODELS[name]
    out = root / ORG / name
    stamp = json.dumps({"model_type": model_type, **TINY, **EXTRA.get(name, {})}, sort_keys=True)
    if (out / "config.json").exists() and (out / STAMP).exists() and (out / STAMP).read_text() == stamp:
        return None
    try:
        tok = _tokenizer(template, eos)
        config = AutoConfig.for_model(
            model_type,
            vocab_size=len(tok),
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
            **{**TINY, **EXTRA.get(name, {})},
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(out)
        tok.save_pretrained(out)
        (out / STAMP).write_text(stamp)
    except Exception as exc:  # noqa: BLE001 - reported per model: the tests that need it fail for every trainer
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


def build_datasets(root: Path) -> None:
    """TRL's generator scripts, writing parquet files and the Hub's ``configs`` metadata under ``root``."""
    from datasets import Dataset, DatasetDict

    written: dict[str, dict[str, list[str]]] = {}

    def save(self, repo_id, config_name="default", **_):
        splits = self if isinstance(self, DatasetDict) else {"train": self}
        for split, ds in splits.items():
            path = root / repo_id / config_name / f"{split}-00000.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            ds.to_parquet(str(path))
            written.setdefault(repo_id, {}).setdefault(config_name, []).append(split)

    saved = (Dataset.push_to_hub, DatasetDict.push_to_hub)
    Dataset.push_to_hub = DatasetDict.push_to_hub = save
    try:
        for script, repo in (
            ("generate_zen_dataset.py", "zen"),
            ("generate_toolcall_dataset.py", "toolcall"),
            ("generate_harmony_dataset.py", "harmony"),
        ):
            spec = importlib.util.spec_from_file_location(f"_trl_{repo}", FIXTURES / script)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            module.main(test_size=0.1, push_to_hub=True, repo_id=f"{ORG}/{repo}")
    finally:
        Dataset.push_to_hub, DatasetDict.push_to_hub = saved
    for repo_id, configs in written.items():
        lines = ["---", "configs:"]
        for config, splits in configs.items():
            lines += [f"- config_name: {config}", "  data_files:"]
            lines += [f"  - split: {s}\n    path: {config}/{s}-*" for s in splits]
        (root / repo_id / "README.md").write_text("\n".join([*lines, "---", ""]))


def build(root: Path) -> dict[str, str]:
    """Build every stand-in under ``root`` (skipping those already there); the models that could not be built."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / ORG / "zen" / "README.md").exists():
        build_datasets(root)
    failed = {}
    for name in MODELS:
        error = build_model(root, name)
        if error:
            failed[name] = error
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="folder to build ROOT/trl-internal-testing/... in")
    args = parser.parse_args(argv)
    failed = build(args.root)
    for name, error in failed.items():
        print(f"not built: {ORG}/{name}: {error}")
    print(f"stand-ins in {args.root / ORG}: {len(MODELS) - len(failed)}/{len(MODELS)} models, zen/toolcall/harmony")
    return 0


if __name__ == "__main__":
    sys.exit(main())
