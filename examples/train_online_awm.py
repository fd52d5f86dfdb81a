"""Online ECHO against live Agent World Model (AWM) environments.

TRL generates the agent's turns (locally, or on a vLLM server with ``--use_vllm --vllm_mode server``);
each rollout gets its own AWM environment (SQLite database + the scenario's generated MCP server,
sandboxed), built by :func:`echo_trl.envs.awm.environment.awm_environment_factory` and passed to
``EchoGRPOTrainer(environment_factory=...)``. The reward is the scenario's verifier; ECHO adds
``world_model_coeff`` x cross-entropy on the tool outputs TRL appended to the conversation.

Every ``echo-trl train`` flag (``EchoGRPOConfig`` and TRL's ``ModelConfig``, ``--config YAML``,
``--use_peft``) works here; the AWM flags below replace ``--dataset_name`` (the prompts are the
scenario's tasks).

    python examples/train_online_awm.py --model_name_or_path Qwen/Qwen3-0.6B \\
        --awm_data data/awm_scenarios --awm_scenario library_1 --output_dir runs/online \\
        --num_generations 4 --per_device_train_batch_size 4 --max_completion_length 1024

    accelerate launch --config_file examples/accelerate_configs/deepspeed_zero3.yaml \\
        examples/train_online_awm.py --config examples/configs/qwen3_8b_zero3_vllm_online.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class AWMOnlineArguments:
    """Where the AWM scenario and its tasks come from (the prompts of online training)."""

    awm_scenario: str | None = field(default=None, metadata={"help": "AWM scenario name, e.g. library_1."})
    awm_data: str | None = field(
        default=None, metadata={"help": "Local AWM-format directory with gen_*.jsonl files (e.g. data/awm_scenarios)."})
    awm_hub_repo: str | None = field(
        default=None, metadata={"help": "Read the scenario from this Hub dataset instead of --awm_data "
                                "(e.g. Snowflake/AgentWorldModel-1K); --awm_data wins when both are set."})
    awm_tasks: list[int] | None = field(
        default=None, metadata={"help": "Task indices to train on. Default: the scenario's 'train' tasks from "
                                "splits.json next to --awm_data when present, else every task."})
    awm_repeats: int = field(default=1, metadata={"help": "Rows per task in the prompt dataset (an epoch's size)."})
    awm_tool_timeout: float = field(default=30.0, metadata={"help": "Seconds one MCP tool call may take."})
    awm_verifier_timeout: float = field(default=30.0, metadata={"help": "Seconds the task verifier may take."})


def make_parser():
    """``echo-trl train``'s parser (EchoGRPOConfig + ModelConfig) with the AWM arguments instead of datasets."""
    from trl import ModelConfig, TrlParser

    from echo_trl.config import EchoGRPOConfig

    return TrlParser((AWMOnlineArguments, EchoGRPOConfig, ModelConfig), prog="train_online_awm.py",
                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)


def train_tasks(awm_args: AWMOnlineArguments) -> list[int] | None:
    """The explicit task list, else the 'train' split of ``splits.json`` beside the local data, else all (None)."""
    if awm_args.awm_tasks:
        return list(awm_args.awm_tasks)
    if awm_args.awm_data:
        splits = Path(awm_args.awm_data) / "splits.json"
        if splits.is_file():
            spec = json.loads(splits.read_text(encoding="utf-8")).get(awm_args.awm_scenario, {})
            if spec.get("train"):
                return [int(k) for k in spec["train"]]
    return None


def main(argv: list[str] | None = None) -> int:
    from trl import get_peft_config, get_quantization_config

    from echo_trl.envs.awm.environment import awm_environment_factory, awm_task_dataset, close_environments
    from echo_trl.envs.awm.scenario import ScenarioSource
    from echo_trl.errors import EchoTrlError
    from echo_trl.trainer import EchoGRPOTrainer

    awm_args, training_args, model_args = make_parser().parse_args_and_config(argv)
    if not model_args.model_name_or_path or not awm_args.awm_scenario:
        raise EchoTrlError("--model_name_or_path and --awm_scenario are required")
    if not awm_args.awm_data and not awm_args.awm_hub_repo:
        raise EchoTrlError("give --awm_data DIR or --awm_hub_repo REPO (--awm_data wins when both are set)")
    source = (ScenarioSource.from_dir(awm_args.awm_data) if awm_args.awm_data
              else ScenarioSource.from_hub(awm_args.awm_hub_repo))
    scenario = source.load(awm_args.awm_scenario)
    prompts = awm_task_dataset(scenario, train_tasks(awm_args), repeats=awm_args.awm_repeats)
    factory = awm_environment_factory(scenario, tool_timeout=awm_args.awm_tool_timeout,
                                      verifier_timeout=awm_args.awm_verifier_timeout)
    training_args.model_init_kwargs = {"dtype": model_args.dtype, "attn_implementation": model_args.attn_implementation,
                                       "revision": model_args.model_revision, **(training_args.model_init_kwargs or {})}
    try:
        trainer = EchoGRPOTrainer(model=model_args.model_name_or_path, args=training_args, train_dataset=prompts,
                                  environment_factory=factory, peft_config=get_peft_config(model_args),
                                  quantization_config=get_quantization_config(model_args))
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        trainer.save_state()
        trainer.save_model(training_args.output_dir)
    finally:
        close_environments()
    return 0


if __name__ == "__main__":
    from echo_trl.errors import EchoTrlError

    try:
        sys.exit(main())
    except EchoTrlError as exc:
        print(f"train_online_awm.py: error: {exc}", file=sys.stderr)
        sys.exit(2)
