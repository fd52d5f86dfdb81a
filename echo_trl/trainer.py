"""``EchoGRPOTrainer``: TRL's ``GRPOTrainer`` plus ECHO's world-model term, from the same forward.

    loss = GRPO loss (TRL's ``_compute_loss``, untouched) + lambda * world_loss(same per-token log-probs)

Kept thin, it wires the modules of ``echo_trl/train/`` (offline batches ``offline.py``, online masks
``online_masks.py``, the world term ``loss.py``, behaviour log-probs ``behavior.py``); every TRL-private
attribute and call goes through ``trl_compat.py``. It overrides these ``GRPOTrainer`` hooks (TRL 1.16):

* ``_generate_and_score_completions``: recorded trajectories (rows with a ``completion``) are collated
  instead of generated (offline); otherwise TRL generates and the env-output masks are attached (online);
* ``_generate``: remembers the completion messages TRL's tool loop produced (online env mask);
* ``_compute_loss``: adds the world term, from the log-probs of TRL's own loss forward;
  ``evaluate``: exact held-out env CE; ``_get_per_token_logps_and_entropies`` / ``_prepare_inputs``:
  offline prefix sharing (``trl_compat.shared_forward``, micro-batches in the sampler's order);
* ``_get_train_sampler`` / ``_get_eval_sampler`` / ``_set_signature_columns_if_needed``: each recorded
  trajectory once per epoch (not ``num_generations`` times), in an order of (seed, epoch): resumable;
* ``_save_rng_state`` / ``_load_rng_state``: checkpoints keep TRL's generation buffer and ZeRO-3/FSDP's initial logps;
* ``create_model_card`` / ``save_model``: TRL's model card plus the ECHO section (``train/model_card.py``).
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
from trl import GRPOTrainer

from .config import TRL_MAX_COMPLETION_LENGTH, EchoGRPOConfig
from .data.citations import ECHO_PAPER
from .errors import EchoTrlError
from .train import metrics, offline, trl_compat
from .train.advantages import with_advantages
from .train.batch import CompletionMasks
from .train.behavior import TRAIN_INDEX, add_initial_logprobs
from .train.collator import CollatorSettings
from .train.loss import divisor_for, global_count, world_coeff_at, world_loss, world_totals
from .train.model import check_temperatures, context_length, logps_from_hidden
from .train.model_card import add_echo_section
from .train.offline import EVAL_INDEX_COLUMN
from .train.online_masks import GeneratedRollouts, online_masks
from .train.precision import FP16_WARNING, check_world_finite, uses_fp16
from .train.sampler import ResumableRepeatSampler
from .train.world_eval import HeldOutTotals

__all__ = ["EchoGRPOTrainer"]


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

    def __init__(
        self,
        model,
        reward_funcs=None,
        args: EchoGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools=None,
        rollout_func=None,
        environment_factory=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = EchoGRPOConfig(f"{str(name).split('/')[-1]}-ECHO")
        if not isinstance(args, EchoGRPOConfig):
            raise EchoTrlError(f"EchoGRPOTrainer needs an EchoGRPOConfig, got {type(args).__name__}")
        is_offline = train_dataset is not None and offline.is_trajectory_dataset(train_dataset)
        if args.max_completion_length is None and not is_offline:  # offline: whole recorded completions
            args.max_completion_length = TRL_MAX_COMPLETION_LENGTH  # generation needs a bound: TRL's default
        offline.check_settings(
            args, train_dataset, offline=is_offline, online=bool(tools or rollout_func or environment_factory)
        )
        if is_offline:
            train_dataset = with_advantages(train_dataset, args.scale_rewards, "train_dataset")
        reward_funcs = offline.reward_source(
            reward_funcs, args, offline=is_offline, environment=environment_factory is not None
        )
        super().__init__(
            model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=offline.prepare_eval(eval_dataset, args.scale_rewards),
            processing_class=processing_class,
            reward_processing_classes=reward_processing_classes,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
            tools=tools,
            rollout_func=rollout_func,
            environment_factory=environment_factory,
        )
        self._echo_settings = CollatorSettings.from_args(args, context_length(self.model))
        self._echo_offline, self._echo_share = is_offline, is_offline and args.prefix_sharing
        offline.tokenize_and_share(self, share=self._echo_share)  # tokens once; prefix-tree attention
        self._echo_initial = add_initial_logprobs(self, self._echo_settings, share=self._echo_share)  # "initial"
        check_temperatures(
            self.model,
            temperature=self.temperature,
            world_loss_temperature=args.world_loss_temperature,
            evaluates=args.eval_strategy != "no",
        )
        self._echo_reproject = not math.isclose(args.world_loss_temperature, self.temperature)
        self._echo_rollouts: GeneratedRollouts | None = None  # the last _generate's, for the masks
        self._echo_eval = HeldOutTotals()
        self._echo_warned: set[str] = set()

    # ----------------------------------------------------------------------------------------
    # Datasets, samplers, checkpoints

    def evaluate(self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"):
        """``Trainer.evaluate`` with the held-out env CE totals restarted (also after an interrupted evaluation
        or a ``predict``); trajectories passed here are prepared as ``eval_dataset`` at init is."""
        self._echo_eval.reset()
        eval_dataset = offline.prepare_eval(eval_dataset, self.args.scale_rewards, trl_compat.tokenizer(self))
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        trl_compat.add_signature_columns(self, [*offline.TRAJECTORY_COLUMNS, EVAL_INDEX_COLUMN, TRAIN_INDEX])

    def _get_train_sampler(self, dataset=None):
        dataset = self.train_dataset if dataset is None else dataset
        if not offline.is_trajectory_dataset(dataset):  # online: TRL's settings, resumable
            return ResumableRepeatSampler.like(super()._get_train_sampler(dataset))
        return offline.train_sampler(
            dataset, self.args, self.num_iterations, self.shuffle_dataset, grouped=self._echo_share
        )

    def _get_eval_sampler(self, eval_dataset):
        if not offline.is_trajectory_dataset(eval_dataset):
            return super()._get_eval_sampler(eval_dataset)
        return offline.eval_sampler(eval_dataset)

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        trl_compat.save_generation_buffer(self, output_dir)
        self._echo_initial.save(self, output_dir)  # ZeRO-3/FSDP: the starting-model column travels with it

    def _load_rng_state(self, checkpoint: str | None) -> None:
        super()._load_rng_state(checkpoint)  # Trainer calls it once on resume, before the first training_step
        trl_compat.load_generation_buffer(self, checkpoint)
        self._echo_initial.load(checkpoint)

    # ----------------------------------------------------------------------------------------
    # Batches

    def _generate_and_score_completions(self, inputs):
        if inputs and "completion" in inputs[0]:  # offline: recorded trajectories, collated instead of generated
            return offline.collate_batch(self, self._echo_initial.rows(self, inputs), self._echo_settings)
        output = super()._generate_and_score_completions(inputs)
        rollouts, self._echo_rollouts = self._echo_rollouts, None
        masks = online_masks(
            rollouts,
            output["completion_mask"],
            output.get("tool_mask"),
            tokenizer=trl_compat.tokenizer(self),
            tools=self.tools,
            settings=self._echo_settings,
            render_suffix=lambda msgs, **kw: trl_compat.render_tool_suffix(self, msgs, **kw),
        )
        for key, message in masks.warnings().items():
            self._warn_once(key, message)
        world_count = global_count(masks.world_mask, self.args.world_loss_normalization)
        output.update(masks.columns(), world_num_items=self.accelerator.gather(world_count).sum())
        metrics.log_online_batch(
            trl_compat.metrics(self, self._mode()), masks.passes, masks.align_failures, self.accelerator.gather
        )
        return output

    def _prepare_inputs(self, generation_batch):
        with trl_compat.keep_generation_order(self._echo_offline):  # offline: micro-batches in sampler order
            return super()._prepare_inputs(generation_batch)

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        shared = self._echo_share and trl_compat.shared_forward(self, model, *args, **kwargs)  # offline, exact
        return shared or super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    def _generate(self, prompts: list):
        result = super()._generate(prompts)
        self._echo_rollouts = trl_compat.generated_rollouts(result)
        return result

    # ----------------------------------------------------------------------------------------
    # Loss

    def _compute_loss(self, model, inputs):
        mode = self._mode()
        if "fp16" not in self._echo_warned and uses_fp16(model, self.accelerator):
            self._warn_once("fp16", FP16_WARNING)
        inputs = dict(inputs)  # the capture may fill old log-probs in; never touch TRL's buffered batch
        hidden = self._echo_reproject or (mode == "eval" and not math.isclose(self.temperature, 1.0))
        with trl_compat.capture_loss_forward(self, inputs, hidden_states=hidden) as forward:
            if self.args.use_policy_loss:
                loss = super()._compute_loss(model, inputs)
            else:
                loss = None
                trl_compat.run_loss_forward(self, model, inputs)
        world_scaled = self._world_term(model, inputs, forward, mode)
        if loss is not None and self._current_coeff() == 0.0:
            return loss  # lambda = 0 is GRPO, bit for bit
        if mode == "train":
            check_world_finite(
                trl_compat.metrics(self, "train")["world/loss_unscaled"][-1], self.state.global_step + 1, loss
            )
        return world_scaled if loss is None else loss + world_scaled

    def _current_coeff(self) -> float:
        a = self.args
        return world_coeff_at(
            self.state.global_step,
            coeff=a.world_model_coeff,
            schedule=a.world_model_coeff_schedule,
            end=a.world_model_coeff_end,
            steps=a.world_model_coeff_steps,
            values=a.world_model_coeff_values,
            max_steps=self.state.max_steps,
        )

    def _logps_at(self, temperature: float, model, inputs, forward, masks: CompletionMasks) -> torch.Tensor:
        """Per-token log-probs at ``temperature``: TRL's own, or its hidden states re-projected (ECHO's tokens)."""
        if math.isclose(temperature, self.temperature):
            return forward.logps
        return logps_from_hidden(model, forward.hidden, inputs["completion_ids"], masks.scored, temperature)

    def _world_term(self, model, inputs, forward: trl_compat.LossForward, mode: str) -> torch.Tensor:
        masks, training, a = CompletionMasks.of(inputs), mode == "train", self.args
        logps = self._logps_at(a.world_loss_temperature, model, inputs, forward, masks)
        # Metrics: the CE the world term trains on; held out, the true CE (temperature 1) the paper plots.
        held_out_t1 = not training and not math.isclose(a.world_loss_temperature, 1.0)
        ce_logps = self._logps_at(1.0, model, inputs, forward, masks) if held_out_t1 else logps
        world_items = inputs.get("world_num_items")
        if world_items is None:
            world_items = self.accelerator.gather(global_count(masks.world, a.world_loss_normalization)).sum()
        accumulation = getattr(self, "current_gradient_accumulation_steps", a.gradient_accumulation_steps)
        divisor = divisor_for(
            world_items,
            num_processes=self.accelerator.num_processes,
            gradient_accumulation_steps=accumulation,
            steps_per_generation=a.steps_per_generation,
            training=training,
        )
        wl = world_loss(logps, masks.world, normalization=a.world_loss_normalization, divisor=divisor)
        totals = world_totals(
            ce_logps, masks, wl, lambda t: self.accelerator.reduce(t.to(self.accelerator.device), reduction="sum")
        )
        if not training:  # held-out CE: token-weighted over the whole evaluation, each trajectory once
            self._echo_eval.add(inputs.get(EVAL_INDEX_COLUMN), ce_logps, masks, totals, self.accelerator.gather)
        held_out = None if training else self._echo_eval.means()
        coeff = self._current_coeff()
        metrics.log_world_term(trl_compat.metrics(self, mode), totals, coeff, held_out)
        return coeff * wl.loss

    # ----------------------------------------------------------------------------------------
    # Model card and helpers

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None):
        """TRL's card plus the ECHO settings, the final world-model metrics and the ECHO / AWM citations."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            add_echo_section(
                f"{self.args.output_dir}/README.md",
                self.args,
                self.state.log_history,
                base_model=getattr(self.model.config, "name_or_path", None),
            )

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """``Trainer.save_model``; a save to ``output_dir`` also writes the model card there (TRL writes it only
        with checkpoints and on ``push_to_hub``)."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and (output_dir is None or str(output_dir) == str(self.args.output_dir)):
            name = self.args.hub_model_id.split("/")[-1] if self.args.hub_model_id else None
            self.create_model_card(model_name=name or Path(self.args.output_dir).name)

    def _mode(self) -> str:
        return "train" if self.model.training else "eval"

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._echo_warned:
            self._echo_warned.add(key)
            warnings.warn(message, UserWarning, stacklevel=2)
