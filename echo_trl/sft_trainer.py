"""``EchoSFTTrainer``: TRL's ``SFTTrainer`` on recorded trajectories, with per-token role weights (ActObs).

    loss = sum_t w_t * CE_t / sum_t w_t,   w_t = action_weight on action tokens, world_model_coeff on env_output
                                                (world-target) tokens, 0 on context and warnings

The SFT stage before ECHO-GRPO, on the same datasets, token cache and role masks as ``EchoGRPOTrainer``
(``train/sft_collator.py`` collates each row from ``train/collator.py``'s features); the loss is
``train/sft_loss.py``'s. It overrides these ``SFTTrainer`` / ``Trainer`` hooks (TRL 1.16, transformers 5):

* ``__init__``: reward filtering (``train/sft_data.py``), TRL's dataset preparation skipped (the rows are
  trajectories, collated here), token columns cached once per dataset and tokenizer;
* ``compute_loss``: TRL's fused-LM-head forward, the weighted CE instead of TRL's unweighted one;
* ``get_batch_samples``: ``num_items_in_batch`` is the accumulation window's weight sum over every process (TRL
  counts the labels), so the loss is exact under gradient accumulation and data parallelism;
* ``_set_signature_columns_if_needed``: the trajectory columns reach the collator;
* ``create_model_card`` / ``save_model``: TRL's card plus the SFT stage's section (``train/model_card.py``).
"""

from __future__ import annotations

import logging

import torch
from trl import SFTTrainer

from .errors import EchoTrlError
from .sft_config import EchoSFTConfig
from .train import offline, trl_compat
from .train.collator import CollatorSettings
from .train.model import context_length
from .train.model_card import add_sft_section
from .train.sft_collator import SFTCollator, SFTWeights
from .train.sft_data import filter_by_reward
from .train.sft_loss import ACTION_MASK, EXTRA_COLUMNS, WEIGHTS, WORLD_MASK, role_nll, weighted_ce, window_weight_sum
from .train.trainable import guard_training

__all__ = ["EchoSFTTrainer"]

logger = logging.getLogger(__name__)


class EchoSFTTrainer(SFTTrainer):
    """SFT on recorded trajectories: ``action_weight`` x CE on the agent's tokens + ``world_model_coeff`` x CE on the
    environment's (observation supervision), normalised by the weight sum.

    ``train_dataset`` / ``eval_dataset``: trajectory datasets (``echo_trl.build_awm_dataset``,
    ``echo-trl build-dataset``). ``reward_filter`` says how many episodes ``min_reward`` kept.
    """

    _tag_names = ["trl", "sft", "echo"]
    _name = "ECHO-SFT"
    # compute_loss divides by the accumulation window's weight sum: transformers must not divide again
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model,
        args: EchoSFTConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else getattr(model.config, "_name_or_path", "model")
            args = EchoSFTConfig(f"{str(name).split('/')[-1]}-ECHO-SFT")
        if not isinstance(args, EchoSFTConfig):
            raise EchoTrlError(f"EchoSFTTrainer needs an EchoSFTConfig, got {type(args).__name__}")
        for what, ds in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            for d in ds.values() if isinstance(ds, dict) else [ds]:
                if d is not None and not offline.is_trajectory_dataset(d):
                    raise EchoTrlError(f"{what}: EchoSFTTrainer trains on trajectory datasets (prompt + completion)")
        if args.world_size > 1 and not args.average_tokens_across_devices:
            raise EchoTrlError(
                "average_tokens_across_devices=False with several processes averages per-process means (not exact): "
                "leave it True"
            )
        train_dataset, self.reward_filter = filter_by_reward(train_dataset, args.min_reward, args.world_all_episodes)
        logger.info(self.reward_filter.summary())
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}  # rows collated here
        collator = SFTCollator(None, CollatorSettings(), SFTWeights.from_args(args))
        super().__init__(
            model,
            args=args,
            data_collator=collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            quantization_config=quantization_config,
            peft_config=peft_config,
        )
        tokenizer = trl_compat.tokenizer(self)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token  # TRL sets it only for its own collator; padding is masked
        limit = context_length(self.model)
        collator.tokenizer = tokenizer
        collator.settings = CollatorSettings(
            world_loss_target=args.world_loss_target,
            max_completion_length=args.max_completion_length,
            max_length=min(n for n in (args.max_length, limit, 1 << 62) if n is not None),
            max_world_model_tokens=args.max_world_model_tokens,
        )
        self.train_dataset = offline.with_tokens(self.train_dataset, tokenizer)  # tokenized once, cached
        self.eval_dataset = offline.with_tokens(self.eval_dataset, tokenizer)
        offline.check_completion_room(self.train_dataset, args.max_completion_length, "train_dataset")
        target = args.world_loss_target if args.world_model_coeff > 0 else None  # #32: nothing non-finite, untrainable
        guard_training(self, actions=args.action_weight > 0, world_target=target)

    def _set_signature_columns_if_needed(self):
        super()._set_signature_columns_if_needed()
        trl_compat.add_signature_columns(self, offline.TRAJECTORY_COLUMNS)

    def evaluate(self, eval_dataset=None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval"):
        """``SFTTrainer.evaluate``; trajectories passed here get their cached token columns first."""
        eval_dataset = offline.with_tokens(eval_dataset, trl_compat.tokenizer(self))
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)

    # ----------------------------------------------------------------------------------------
    # Loss

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The accumulation window's micro-batches, and the divisor of their loss: their weight sum over every
        process (transformers counts the labels instead, which would ignore the role weights)."""
        batches, _ = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batches:
            return batches, None
        total = window_weight_sum(batches).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()
        return batches, total

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The weighted CE from TRL's fused-LM-head forward (TRL 1.16 adds the head at init): in training divided
        by the window's weight sum x processes (DDP averages the gradients); in evaluation the micro-batch's mean."""
        mode = "train" if self.model.training else "eval"
        inputs = dict(inputs)
        extra = {k: inputs.pop(k) for k in EXTRA_COLUMNS}
        outputs = model(**inputs, use_cache=False, fused_lm_head=True)
        over_processes = self.args.average_tokens_across_devices and num_items_in_batch is not None
        loss = weighted_ce(
            outputs.log_probs,
            extra[WEIGHTS],
            divisor=num_items_in_batch,
            scale=self.accelerator.num_processes if over_processes else 1,
        )
        self._log_batch(mode, outputs, extra, loss)
        return (loss.loss, outputs) if return_outputs else loss.loss

    def _log_batch(self, mode: str, outputs, extra, loss) -> None:
        """Per-role CE (nats/token) and TRL's entropy / token accuracy over the weighted tokens of this micro-batch,
        summed over processes."""
        env_nll, env_n = role_nll(outputs.log_probs, extra[WORLD_MASK])
        act_nll, act_n = role_nll(outputs.log_probs, extra[ACTION_MASK])
        label = outputs.label_mask
        local = torch.stack(
            [
                env_nll,
                env_n,
                act_nll,
                act_n,
                loss.weighted_nll,
                loss.weight_sum,
                outputs.entropy.detach().float().sum(),
                outputs.is_top1.float().sum(),
                label.sum().float(),
            ]
        )
        s = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").tolist()
        m = trl_compat.metrics(self, mode)
        if s[1]:
            m["sft/ce_env"].append(s[0] / s[1])
        if s[3]:
            m["sft/ce_action"].append(s[2] / s[3])
        m["sft/weighted_ce"].append(s[4] / s[5] if s[5] else 0.0)
        m["sft/tokens_env"].append(s[1])
        m["sft/tokens_action"].append(s[3])
        m["entropy"].append(s[6] / s[8] if s[8] else 0.0)
        m["mean_token_accuracy"].append(s[7] / s[8] if s[8] else 0.0)

    # ----------------------------------------------------------------------------------------
    # Model card

    def create_model_card(self, model_name: str | None = None, dataset_name: str | None = None, tags=None):
        """TRL's card plus the SFT stage's role weights, episode filter and final metrics."""
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if self.is_world_process_zero():
            add_sft_section(
                f"{self.args.output_dir}/README.md",
                self.args,
                self.state.log_history,
                base_model=getattr(self.model.config, "name_or_path", None),
                reward_filter=self.reward_filter.summary(),
                chat_template=getattr(trl_compat.tokenizer(self), "chat_template", None),
            )

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """``Trainer.save_model``; a save to ``output_dir`` also writes the model card there."""
        super().save_model(output_dir, _internal_call)
        if not _internal_call and (output_dir is None or str(output_dir) == str(self.args.output_dir)):
            name = self.args.hub_model_id.split("/")[-1] if self.args.hub_model_id else None
            self.create_model_card(model_name=name)
