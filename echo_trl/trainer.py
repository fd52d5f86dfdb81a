"""``EchoGRPOTrainer``: TRL's ``GRPOTrainer`` plus ECHO's world-model term, from the same forward.

    loss = GRPO loss (TRL's ``_compute_loss``, untouched) + lambda * world_loss(same per-token log-probs)

Kept thin. It overrides these ``GRPOTrainer`` hooks (TRL 1.16; see ``trl_compat.py``):

* ``_generate_and_score_completions``: a batch of recorded trajectories (rows with a
  ``completion``) is collated instead of generated (offline mode); otherwise TRL generates and
  the env-output masks are attached afterwards (online mode);
* ``_generate``: remembers the completion messages TRL's tool loop produced (online env mask);
* ``_get_per_token_logps_and_entropies``: keeps the log-probs of the loss forward (no second forward);
* ``_compute_loss``: adds the world term; ``evaluate``: exact held-out env CE;
* ``_get_train_sampler`` / ``_get_eval_sampler`` / ``_set_signature_columns_if_needed``: each
  recorded trajectory once per epoch (TRL's sampler repeats every prompt ``num_generations`` times), and
  each epoch's order a function of (seed, epoch), offline and online, so a resumed run continues it;
* ``_save_rng_state`` / ``_load_rng_state``: checkpoints keep TRL's generation buffer (exact resume);
* ``create_model_card`` / ``save_model``: TRL's model card plus the ECHO section (``cards.py``).
"""

from __future__ import annotations

import logging
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from . import trl_compat
from .cards import ECHO_PAPER, add_echo_section
from .collator import (
    CollatorSettings,
    collate_features,
    group_advantages,
    passes_filters,
    rollout_quality,
    tool_content_mask,
    trajectory_features,
)
from .config import EchoGRPOConfig
from .errors import DatasetSchemaError, EchoTrlError
from .loss import divisor_for, global_count, masked_nll, nll_sum_and_count, world_coeff_at, world_loss

logger = logging.getLogger(__name__)

#: Column holding each recorded trajectory's precomputed GRPO advantage.
ADVANTAGE_COLUMN = "echo_advantage"
#: Columns of the ECHO trajectory schema that offline mode reads (kept by the dataloader).
TRAJECTORY_COLUMNS = ["prompt", "completion", "tools", "warnings", "reward", "group_id", "scenario", "task_idx",
                      "behavior_logprobs", ADVANTAGE_COLUMN, "valid_tool_call_pct", "parse_clean_pct",
                      "correct_pct"]
#: Row number ``_prepare_eval`` gives each held-out trajectory: the key that counts each one once.
EVAL_INDEX_COLUMN = "echo_eval_index"


#: Multimodal inputs TRL 1.16's ``_compute_loss`` forwards to ``_get_per_token_logps_and_entropies``.
_FORWARD_KWARGS = ("pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask", "spatial_shapes",
                   "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids", "image_position_ids")


def recorded_reward(completions, reward=None, **kwargs) -> list[float | None]:
    """Reward function that returns the dataset's ``reward`` column (the recorded episode reward)."""
    if reward is None:
        return [None] * len(completions)
    return [None if r is None else float(r) for r in reward]


def no_reward(completions, **kwargs) -> list[float]:
    """Reward function of verifier-free ECHO (``use_policy_loss=False``): every completion scores 0."""
    return [0.0] * len(completions)


def is_trajectory_dataset(ds) -> bool:
    """A dataset of recorded trajectories (ECHO schema: ``prompt`` + ``completion`` messages)."""
    names = getattr(ds, "column_names", None) or []
    return "prompt" in names and "completion" in names


class EchoGRPOTrainer(GRPOTrainer):
    """GRPO on action tokens + ``world_model_coeff`` x cross-entropy on environment-output tokens.

    Offline: pass ``train_dataset`` of recorded trajectories (``echo_trl.build_awm_dataset``);
    ``reward_funcs`` may be omitted (the recorded ``reward`` is used). Online: pass
    ``environment_factory``, ``tools`` or ``rollout_func`` and a prompt dataset, as for
    ``GRPOTrainer``. ``eval_dataset`` of trajectories reports ``eval_world/ce_env``.
    """

    _tag_names = ["trl", "grpo", "echo"]
    _name = "ECHO-GRPO"
    _paper = ECHO_PAPER

    def __init__(self, model, reward_funcs=None, args: EchoGRPOConfig | None = None, train_dataset=None,
                 eval_dataset=None, processing_class=None, reward_processing_classes=None, callbacks=None,
                 optimizers=(None, None), quantization_config=None, peft_config=None, tools=None,
                 rollout_func=None, environment_factory=None):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = EchoGRPOConfig(f"{str(name).split('/')[-1]}-ECHO")
        if not isinstance(args, EchoGRPOConfig):
            raise EchoTrlError(f"EchoGRPOTrainer needs an EchoGRPOConfig, got {type(args).__name__}")
        online = bool(tools or rollout_func or environment_factory)
        self._echo_offline = train_dataset is not None and is_trajectory_dataset(train_dataset)
        if self._echo_offline and online:
            raise EchoTrlError(
                "train_dataset holds recorded trajectories (a 'completion' column) but tools / rollout_func / "
                "environment_factory were also given: train offline on the recordings, or online with a prompt dataset")
        if self._echo_offline:
            if isinstance(train_dataset, IterableDataset):
                raise EchoTrlError("offline ECHO needs a map-style Dataset (advantages are grouped over the whole "
                                   "dataset by group_id); load it without streaming")
            if args.use_vllm:
                raise EchoTrlError("use_vllm generates completions; offline mode trains on recorded trajectories and "
                                   "never generates: set use_vllm=False")
            if args.multi_objective_aggregation != "sum_then_normalize":
                raise EchoTrlError("offline mode has one recorded reward per trajectory; "
                                   "multi_objective_aggregation must be 'sum_then_normalize'")
            if len(train_dataset) < args.generation_batch_size:
                raise EchoTrlError(
                    f"train_dataset has {len(train_dataset)} trajectories, fewer than one generation batch "
                    f"({args.generation_batch_size} = per_device_train_batch_size x processes x steps_per_generation)")
            train_dataset = self._with_advantages(train_dataset, args, "train_dataset")
            if reward_funcs is None:
                reward_funcs = [recorded_reward]
        if reward_funcs is None and not args.use_policy_loss and environment_factory is None:
            reward_funcs = [no_reward]  # verifier-free ECHO: TRL wants a reward source, the world term needs none
        eval_dataset = self._prepare_eval(eval_dataset, args)
        liger = args.liger_kernel_config or {}
        if args.use_liger_kernel and liger.get("fused_linear_cross_entropy"):
            raise EchoTrlError("Liger's fused linear cross-entropy replaces the forward and bypasses the per-token "
                               "log-probs the world term reuses; it is not supported")

        super().__init__(model, reward_funcs=reward_funcs, args=args, train_dataset=train_dataset,
                         eval_dataset=eval_dataset, processing_class=processing_class,
                         reward_processing_classes=reward_processing_classes, callbacks=callbacks,
                         optimizers=optimizers, quantization_config=quantization_config, peft_config=peft_config,
                         tools=tools, rollout_func=rollout_func, environment_factory=environment_factory)
        self._echo_settings = CollatorSettings.from_args(args)
        self._echo_reproject = not math.isclose(args.world_loss_temperature, self.temperature)
        if self._echo_reproject:
            trl_compat.check_reprojection_supported(self.model)
        if self._echo_offline and args.use_policy_loss and not _has_behavior_logprobs(train_dataset):
            logger.warning("offline ECHO: the trajectories carry no behavior_logprobs, so they are treated as "
                           "on-policy (importance ratio 1 at their first update, as in GRPO without vLLM)")
        self._echo_capture = False
        self._echo_stash: dict[str, Any] = {}
        self._echo_inputs: dict[str, Any] | None = None
        self._echo_online: dict[str, Any] | None = None
        self._echo_eval_totals = torch.zeros(4, dtype=torch.float64)  # env sum, env count, warn sum, warn count
        self._echo_eval_seen: set[int] = set()  # EVAL_INDEX_COLUMN values already in the totals
        self._echo_warned: set[str] = set()

    # ----------------------------------------------------------------------------------------
    # Datasets and samplers

    @staticmethod
    def _with_advantages(ds: Dataset, args, name: str) -> Dataset:
        if ADVANTAGE_COLUMN in ds.column_names:
            ds = ds.remove_columns(ADVANTAGE_COLUMN)
        if "reward" not in ds.column_names:
            warnings.warn(f"{name} has no 'reward' column: every advantage is 0, only the world term trains",
                          UserWarning, stacklevel=3)
            adv = np.zeros(len(ds))
        else:
            rewards = list(ds["reward"])
            if any(r is None or not math.isfinite(r) for r in rewards):
                raise DatasetSchemaError(f"{name}: every trajectory needs a finite 'reward'")
            if "group_id" in ds.column_names:
                groups = list(ds["group_id"])
            else:
                groups = [f"{s}/{t}" for s, t in zip(ds["scenario"], ds["task_idx"], strict=True)] \
                    if {"scenario", "task_idx"} <= set(ds.column_names) else [str(i) for i in range(len(ds))]
            adv = group_advantages(rewards, groups, args.scale_rewards)
        return ds.add_column(ADVANTAGE_COLUMN, adv.tolist())

    def _prepare_eval(self, eval_dataset, args):
        if eval_dataset is None:
            return None
        if isinstance(eval_dataset, dict):
            return {k: self._prepare_eval(v, args) for k, v in eval_dataset.items()}
        if is_trajectory_dataset(eval_dataset):
            ds = self._with_advantages(eval_dataset, args, "eval_dataset")
            if EVAL_INDEX_COLUMN in ds.column_names:
                ds = ds.remove_columns(EVAL_INDEX_COLUMN)
            return ds.add_column(EVAL_INDEX_COLUMN, list(range(len(ds))))
        return eval_dataset

    def evaluate(self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"):
        """``Trainer.evaluate`` with the held-out env CE totals restarted (also after an interrupted evaluation
        or a ``predict``); trajectories passed here are prepared as ``eval_dataset`` at init is."""
        self._echo_eval_totals.zero_()
        self._echo_eval_seen.clear()
        return super().evaluate(self._prepare_eval(eval_dataset, self.args), ignore_keys, metric_key_prefix)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        self._signature_columns = list(dict.fromkeys([*self._signature_columns, *TRAJECTORY_COLUMNS,
                                                          EVAL_INDEX_COLUMN]))

    def _get_train_sampler(self, dataset=None):
        dataset = self.train_dataset if dataset is None else dataset
        if not is_trajectory_dataset(dataset):
            return _ResumableRepeatSampler.like(super()._get_train_sampler(dataset))  # online: TRL's settings
        # Each trajectory once per epoch (no num_generations repeats: groups come from group_id); the repeat
        # over steps_per_generation x num_iterations is TRL's buffering of one generation batch.
        # Resumable: a run resumed in a later epoch gets that epoch's order (tests/test_resume.py).
        return _ResumableRepeatSampler(data_source=dataset, mini_repeat_count=1,
                                       batch_size=self.args.generation_batch_size,
                                       repeat_count=self.num_iterations * self.args.steps_per_generation,
                                       shuffle=self.shuffle_dataset, seed=self.args.seed)

    def _get_eval_sampler(self, eval_dataset):
        if not is_trajectory_dataset(eval_dataset):
            return super()._get_eval_sampler(eval_dataset)
        return RepeatSampler(data_source=eval_dataset, mini_repeat_count=1, shuffle=False)

    # Checkpoints also hold TRL's generation buffer (per process, next to rng_state*.pth): TRL resumes with
    # ``_step = 0`` and an empty buffer, so a checkpoint inside a buffer (``steps_per_generation`` >
    # ``gradient_accumulation_steps``, or ``num_iterations`` > 1) resumed with a regenerated batch (other
    # shuffle, other old log-probs) and shifted generation boundaries. Restored, resuming is bit-exact.

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        torch.save({**trl_compat.generation_buffer_state(self), "num_processes": self.accelerator.num_processes},
                   self._generation_buffer_file(output_dir))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)  # Trainer calls it once on resume, before the first training_step
        path = None if checkpoint is None else self._generation_buffer_file(checkpoint)
        if path is not None and path.is_file():
            saved = torch.load(path, map_location=self.accelerator.device, weights_only=True)
            # Another world size shards the data differently: every process keeps TRL's behaviour then.
            if saved.get("num_processes") == self.accelerator.num_processes:
                trl_compat.restore_generation_buffer(self, saved)

    def _generation_buffer_file(self, checkpoint: str) -> Path:
        return Path(checkpoint) / f"echo_generation_buffer_{self.args.process_index}.pt"

    # ----------------------------------------------------------------------------------------
    # Batches

    def _generate_and_score_completions(self, inputs):
        if inputs and "completion" in inputs[0]:
            return self._offline_batch(inputs)
        output = super()._generate_and_score_completions(inputs)
        return self._attach_online_masks(output)

    def _offline_batch(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Recorded trajectories -> the inputs TRL's ``_compute_loss`` expects, plus ECHO masks (no generation)."""
        if self._is_vlm:
            raise EchoTrlError("offline ECHO supports text-only models (got a multimodal processor)")
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        features = [trajectory_features(self._tokenizer, row, self._echo_settings) for row in rows]
        batch = {k: v.to(device) for k, v in collate_features(features, self._tokenizer.pad_token_id).items()}
        advantages = torch.tensor([float(row.get(ADVANTAGE_COLUMN) or 0.0) for row in rows], device=device)
        batch["advantages"] = advantages
        if EVAL_INDEX_COLUMN in rows[0]:
            batch[EVAL_INDEX_COLUMN] = torch.tensor([row[EVAL_INDEX_COLUMN] for row in rows], device=device)
        loss_mask = batch["completion_mask"] * batch["tool_mask"]
        batch["num_items_in_batch"] = self.accelerator.gather(loss_mask.sum()).sum()
        batch["world_num_items"] = self.accelerator.gather(
            global_count(batch["world_mask"], self.args.world_loss_normalization).to(device)).sum()

        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logits_to_keep = batch["completion_ids"].size(1)
        batch_size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        with torch.no_grad():
            old = batch.get("old_per_token_logps")
            if trl_compat.needs_old_logps(self) and (old is None or torch.isnan(old).all(dim=1).any()):
                # As TRL does when generation and optimizer steps are misaligned: the policy at sampling time
                # stands in for the behavior policy of rows that recorded none.
                current, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size)
                batch["old_per_token_logps"] = current if old is None else torch.where(torch.isnan(old), current, old)
            if self.beta != 0.0 and self.args.use_policy_loss:
                batch["ref_per_token_logps"] = trl_compat.reference_logps(
                    self, input_ids, attention_mask, logits_to_keep, batch_size)

        # Metrics of the batch as TRL logs them for generated ones
        rewards = torch.tensor([float(row.get("reward") or 0.0) for row in rows], device=device)
        all_rewards = self.accelerator.gather(rewards)
        m = self._metrics[mode]
        m["reward"].append(all_rewards.mean().item())
        m["reward_std"].append(all_rewards.std().item() if all_rewards.numel() > 1 else 0.0)
        m["frac_reward_zero_std"].append(self.accelerator.gather((advantages == 0).float()).mean().item())
        lengths = self.accelerator.gather(batch["completion_mask"].sum(1).float())
        m["completions/mean_length"].append(lengths.mean().item())
        stats = torch.tensor([[sum(not f.passes for f in features), sum(f.truncated_tokens for f in features),
                               len(features)]], dtype=torch.float32, device=device)
        filtered, truncated, n = self.accelerator.gather(stats).sum(0).tolist()
        m["world/filtered_rollouts"].append(filtered)
        m["world/filtered_frac"].append(filtered / max(n, 1.0))
        m["world/truncated_tokens"].append(truncated)
        if mode == "train":
            tokens = self.accelerator.gather(attention_mask.sum()).sum().item()
            self.state.num_input_tokens_seen += tokens
        m["num_tokens"] = [self.state.num_input_tokens_seen]
        return batch

    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        _, completion_ids, tool_mask, completions, _, extra_fields, _, _ = result
        self._echo_online = {"completion_ids": completion_ids, "tool_mask": tool_mask, "completions": completions,
                             "extra": extra_fields}
        return result

    def _attach_online_masks(self, output: dict[str, Any]) -> dict[str, Any]:
        """Env-output / warning / world masks for completions TRL generated (tool loop or rollout_func)."""
        state, self._echo_online = self._echo_online, None
        completion_ids = output["completion_ids"]
        shape, device = completion_ids.shape, completion_ids.device
        env = torch.zeros(shape, dtype=torch.long, device=device)
        warn = torch.zeros(shape, dtype=torch.long, device=device)
        passes = torch.ones(shape[0], dtype=torch.bool, device=device)
        failures = 0
        if state is not None:
            extra = state["extra"] or {}
            ids_list, tool_masks, completions = state["completion_ids"], state["tool_mask"], state["completions"]
            for i, ids in enumerate(ids_list):
                row_env = None
                if "env_output_mask" in extra:
                    row_env = list(extra["env_output_mask"][i])
                    if "warning_mask" in extra:
                        warn[i, :len(ids)] = torch.tensor(list(extra["warning_mask"][i])[:len(ids)], device=device)
                elif self.tools and tool_masks is not None and isinstance(completions[i], list):
                    row_env = tool_content_mask(self._tokenizer, ids, tool_masks[i], completions[i],
                                                lambda msgs: trl_compat.render_tool_suffix(self, msgs))
                    if row_env is None:
                        failures += 1
                elif tool_masks is not None:
                    self._warn_once("rollout_env_mask",
                                    "rollout_func returned env_mask but no env_output_mask: every env_mask == 0 token "
                                    "counts as environment output (template scaffolding included). Return "
                                    "env_output_mask for content-only world-model targets.")
                    row_env = [1 - int(v) for v in tool_masks[i]]
                if row_env is not None:
                    env[i, :len(ids)] = torch.tensor(row_env[:len(ids)], device=device)
                if isinstance(completions[i], list):
                    quality = rollout_quality(completions[i], self.tools or [])
                    passes[i] = passes_filters(quality, self._echo_settings)
        if failures:
            self._warn_once("align", "could not locate tool-output content in some tool_mask == 0 spans; those "
                            "completions train no world term (see world/online_align_failures)")
        tool_mask = output.get("tool_mask")
        completion_mask = output["completion_mask"]
        env = env * completion_mask
        warn = warn * completion_mask * (1 - env)
        outside = completion_mask * (1 - tool_mask) if tool_mask is not None else torch.zeros_like(env)
        target = self.args.world_loss_target
        if target == "env_only":
            world = env
        elif target == "observation":
            world = ((env + outside * (1 - warn)) > 0).long()
        else:
            world = ((env + outside + warn) > 0).long()
        world = world * passes.unsqueeze(1).long()
        if self.args.max_world_model_tokens is not None:
            world = _cap_runs(world, self.args.max_world_model_tokens)
        mode = "train" if self.model.training else "eval"
        output["env_output_mask"], output["warning_mask"], output["world_mask"] = env, warn, world
        output["world_num_items"] = self.accelerator.gather(
            global_count(world, self.args.world_loss_normalization)).sum()
        n_filtered = self.accelerator.gather((~passes).sum().float()).sum().item()
        self._metrics[mode]["world/filtered_rollouts"].append(n_filtered)
        self._metrics[mode]["world/online_align_failures"].append(
            self.accelerator.gather(torch.tensor(float(failures), device=device)).sum().item())
        return output

    # ----------------------------------------------------------------------------------------
    # Loss

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if not self._echo_capture:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                              *args, **kwargs)
        self._echo_capture = False  # only the loss forward of this micro-batch
        if self._echo_reproject:
            with trl_compat.capture_hidden_states(model) as hidden:
                result = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                                    logits_to_keep, *args, **kwargs)
            self._echo_stash["hidden"] = torch.cat(hidden, dim=0)
        else:
            result = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                                *args, **kwargs)
        logps = result[0]
        self._echo_stash["logps"] = logps
        inputs = self._echo_inputs
        old = None if inputs is None else inputs.get("old_per_token_logps")
        if old is not None and torch.isnan(old).any():
            # Rows without recorded behavior log-probs are on-policy: ratio 1, like TRL's own default.
            inputs["old_per_token_logps"] = torch.where(torch.isnan(old), logps.detach(), old)
        return result

    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        self._warn_if_fp16(model)
        inputs = dict(inputs)  # the world term may fill old log-probs in; never touch TRL's buffered batch
        self._echo_stash, self._echo_inputs, self._echo_capture = {}, inputs, True
        try:
            if self.args.use_policy_loss:
                loss = super()._compute_loss(model, inputs)
            else:
                loss = None
                input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
                attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
                self._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, inputs["completion_ids"].size(1),
                    **{k: inputs.get(k) for k in _FORWARD_KWARGS})
        finally:
            self._echo_capture, self._echo_inputs = False, None
        stash, self._echo_stash = self._echo_stash, {}
        world_scaled = self._world_term(model, inputs, stash, mode)
        if loss is not None and self._current_coeff() == 0.0:
            return loss  # lambda = 0 is GRPO, bit for bit
        if mode == "train":
            self._check_world_finite(loss)
        return world_scaled if loss is None else loss + world_scaled

    def _check_world_finite(self, policy_loss: torch.Tensor | None) -> None:
        """Stop before a non-finite world term reaches ``backward``.

        Raising, not skipping the term: the world CE reuses GRPO's own log-probs, so a non-finite one means
        the forward overflowed (typically fp16). TRL's policy loss is then non-finite too (its masks multiply,
        NaN x 0 is NaN) and an overflowed head backpropagates NaN: one step makes every weight NaN while the
        Trainer logs the loss as 0. Dropping only the world term would not prevent that. The value read is
        the all-reduced ``world/loss_unscaled`` that ``_world_term`` just logged, so every process raises at
        the same micro-batch (none is left waiting in the gradient all-reduce).
        """
        value = self._metrics["train"]["world/loss_unscaled"][-1]
        if math.isfinite(value):
            return
        policy = ("" if policy_loss is None else
                  "; the GRPO term is " + ("finite" if torch.isfinite(policy_loss).item() else "non-finite too"))
        raise EchoTrlError(
            f"optimizer step {self.state.global_step + 1}: the world-model cross-entropy on environment-output "
            f"tokens is {value} (non-finite per-token log-probs from the forward){policy}. Stopped before the "
            "update would make the weights NaN. This is usually an fp16 overflow: train in bf16 (bf16=True, or "
            "load the model with dtype=torch.bfloat16) or float32.")

    def _warn_if_fp16(self, model) -> None:
        """Once: fp16 weights, or a forward autocast to fp16 (accelerate's ``fp16=True``, a caller's autocast).

        fp16 tops out at 65504 and TRL's fused LM head computes the logits in the weight / autocast dtype,
        so large logits or activations become inf and the log-probs NaN; :meth:`_check_world_finite` then
        stops the run. bf16 has float32's range at the same memory. The autocast is probed inside
        ``accelerator.autocast()``, where TRL runs the forward (on CPU accelerate runs ``fp16=True`` in fp32).
        """
        if "fp16" in self._echo_warned:
            return
        device = self.accelerator.device.type
        weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
        with self.accelerator.autocast():
            autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16
        if weights == torch.float16 or autocast:
            self._warn_once("fp16", "fp16 weights or autocast: fp16 overflows above 65504, so large logits or "
                            "activations turn the per-token log-probs (GRPO's and the world CE's) into inf/NaN, "
                            "and ECHO stops with an error when the world term does. Prefer bf16 where the "
                            "hardware has it (bf16=True, or load the model with dtype=torch.bfloat16): the same "
                            "memory as fp16 with float32's range. Keeping fp16, cast_lm_head_to_fp32=True at "
                            "least computes the logits in float32.")

    def _current_coeff(self) -> float:
        a = self.args
        return world_coeff_at(self.state.global_step, coeff=a.world_model_coeff, schedule=a.world_model_coeff_schedule,
                              end=a.world_model_coeff_end, steps=a.world_model_coeff_steps,
                              values=a.world_model_coeff_values, max_steps=self.state.max_steps)

    def _world_logps(self, model, inputs, stash) -> torch.Tensor:
        """Per-token log-probs at ``world_loss_temperature`` (GRPO's own, or re-projected hidden states)."""
        logps = stash["logps"]
        if not self._echo_reproject:
            return logps
        completion_ids = inputs["completion_ids"]
        need = (inputs.get("world_mask", torch.zeros_like(completion_ids)) + inputs.get(
            "env_output_mask", torch.zeros_like(completion_ids)) + inputs.get(
            "warning_mask", torch.zeros_like(completion_ids))) > 0
        need = need & inputs["completion_mask"].bool()
        k = completion_ids.size(1)
        hidden = stash["hidden"][:, -k - 1:-1]  # the position before each completion token predicts it
        values = trl_compat.logps_at_temperature(model, hidden[need], completion_ids[need],
                                                 self.args.world_loss_temperature)
        return torch.zeros(need.shape, dtype=values.dtype, device=values.device).masked_scatter(need, values)

    def _world_term(self, model, inputs, stash, mode: str) -> torch.Tensor:
        completion_mask = inputs["completion_mask"].bool()
        zeros = torch.zeros_like(completion_mask)
        world_mask = inputs.get("world_mask", zeros).bool() & completion_mask
        env_mask = inputs.get("env_output_mask", zeros).bool() & completion_mask
        warn_mask = inputs.get("warning_mask", zeros).bool() & completion_mask
        action_mask = completion_mask & (inputs["tool_mask"].bool() if "tool_mask" in inputs else True)
        logps = self._world_logps(model, inputs, stash)
        training = mode == "train"
        world_items = inputs.get("world_num_items")
        if world_items is None:
            world_items = self.accelerator.gather(global_count(world_mask, self.args.world_loss_normalization)).sum()
        divisor = divisor_for(world_items, num_processes=self.accelerator.num_processes,
                              gradient_accumulation_steps=getattr(self, "current_gradient_accumulation_steps",
                                                                  self.args.gradient_accumulation_steps),
                              steps_per_generation=self.args.steps_per_generation, training=training)
        wl = world_loss(logps, world_mask, normalization=self.args.world_loss_normalization, divisor=divisor)
        coeff = self._current_coeff()

        env_sum, env_n = nll_sum_and_count(logps, env_mask)
        warn_sum, warn_n = nll_sum_and_count(logps, warn_mask)
        local = torch.stack([env_sum, env_n, warn_sum, warn_n, wl.numerator.float(), wl.count.float(),
                             action_mask.sum().float()]).to(self.accelerator.device)
        tot = self.accelerator.reduce(local, reduction="sum").tolist()
        m = self._metrics[mode]
        if training:
            if tot[1] > 0:
                m["world/ce_env"].append(tot[0] / tot[1])
            if tot[3] > 0:
                m["world/ce_warning"].append(tot[2] / tot[3])
        else:
            # Held-out CE is a token-weighted mean over the whole evaluation (not a mean of batch means).
            self._add_eval_totals(inputs.get(EVAL_INDEX_COLUMN), logps, env_mask, warn_mask, tot[:4])
            e = self._echo_eval_totals
            if e[1] > 0:
                m["world/ce_env"] = [(e[0] / e[1]).item()]
            if e[3] > 0:
                m["world/ce_warning"] = [(e[2] / e[3]).item()]
        unscaled = tot[4] / tot[5] if tot[5] > 0 else 0.0
        m["world/loss_unscaled"].append(unscaled)
        m["world/loss_scaled"].append(coeff * unscaled)
        m["world/coeff"].append(coeff)
        m["world/tokens_env"].append(tot[1])
        m["world/tokens_warning"].append(tot[3])
        m["world/tokens_action"].append(tot[6])
        return coeff * wl.loss

    def _add_eval_totals(self, index: torch.Tensor | None, logps: torch.Tensor, env_mask: torch.Tensor,
                         warn_mask: torch.Tensor, batch_totals: list[float]) -> None:
        """Add a micro-batch to the held-out totals, each recorded trajectory once.

        With several processes accelerate evens out the last eval batch by repeating rows from the start
        of the eval set; their per-row sums are gathered with their row index and repeats are skipped.
        Without an index (generated completions: every one is a new sample) the all-reduced sums are added.
        """
        if index is None:
            self._echo_eval_totals += torch.tensor(batch_totals, dtype=torch.float64)
            return
        sums = torch.stack([masked_nll(logps.detach(), env_mask).sum(1), env_mask.sum(1).float(),
                            masked_nll(logps.detach(), warn_mask).sum(1), warn_mask.sum(1).float()], 1)
        for i, row in zip(self.accelerator.gather(index).tolist(), self.accelerator.gather(sums).tolist(), strict=True):
            if i not in self._echo_eval_seen:
                self._echo_eval_seen.add(i)
                self._echo_eval_totals += torch.tensor(row, dtype=torch.float64)

    # ----------------------------------------------------------------------------------------
    # Model card

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None):
        """TRL's card plus the ECHO settings, the final world-model metrics and the ECHO / AWM citations."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            add_echo_section(f"{self.args.output_dir}/README.md", self.args, self.state.log_history,
                             base_model=getattr(self.model.config, "name_or_path", None))

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """``Trainer.save_model``; a save to ``output_dir`` also writes the model card there (TRL writes it only
        with checkpoints and on ``push_to_hub``)."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and (output_dir is None or str(output_dir) == str(self.args.output_dir)):
            name = self.args.hub_model_id.split("/")[-1] if self.args.hub_model_id else None
            self.create_model_card(model_name=name or Path(self.args.output_dir).name)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._echo_warned:
            self._echo_warned.add(key)
            warnings.warn(message, UserWarning, stacklevel=2)


class _ResumableRepeatSampler(RepeatSampler):
    """TRL's ``RepeatSampler`` with the order of epoch ``e`` a function of ``(seed, e)``: resume-exact.

    TRL draws each epoch's permutation from one generator seeded once, so epoch ``e``'s order depends on
    the sampler having been iterated ``e`` times before. ``Trainer`` resuming from a checkpoint in epoch
    ``e >= 1`` builds a fresh sampler and starts at epoch ``e`` (it only calls ``set_epoch(e)``), which
    replayed epoch 0's order. Here ``__iter__`` re-seeds and discards the first ``e`` permutations: the
    same order as TRL's for every epoch of an uninterrupted run, and the same order after a resume.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epoch = 0

    @classmethod
    def like(cls, sampler):
        """The resumable version of TRL's ``RepeatSampler`` ``sampler`` (same settings); anything else as is."""
        if type(sampler) is not RepeatSampler:
            return sampler
        return cls(data_source=sampler.data_source, mini_repeat_count=sampler.mini_repeat_count,
                   batch_size=sampler.batch_size, repeat_count=sampler.repeat_count, shuffle=sampler.shuffle,
                   seed=sampler.seed)

    def set_epoch(self, epoch: int) -> None:  # accelerate's DataLoaderShard calls it before every epoch
        self.epoch = epoch

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1  # without set_epoch: consecutive epochs, as TRL's
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(epoch):
                torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()


def _has_behavior_logprobs(ds) -> bool:
    return "behavior_logprobs" in ds.column_names and any(v is not None for v in ds["behavior_logprobs"])


def _cap_runs(mask: torch.Tensor, cap: int) -> torch.Tensor:
    """Keep the first ``cap`` ones of every run of consecutive ones in each row."""
    out = mask.clone()
    for i in range(mask.size(0)):
        run = 0
        for j, v in enumerate(mask[i].tolist()):
            run = run + 1 if v else 0
            if run > cap:
                out[i, j] = 0
    return out
