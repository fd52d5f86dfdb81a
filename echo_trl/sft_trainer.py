"""``EchoSFTTrainer``: TRL's ``SFTTrainer``, plus per-token role weights where the rows have roles (ActObs).

Everything ``SFTTrainer`` does stays TRL's: the datasets it takes (``text``, ``messages``, prompt-completion,
pre-tokenized, ``formatting_func``, streaming), its preparation (truncation, ``bfd`` / ``wrapped`` packing,
padding-free collation), its options and losses (``assistant_only_loss``, ``completion_only_loss``, ``nll`` /
``dft``, label smoothing, the MoE aux loss), PEFT, its metrics. On top, in a conversation with tool messages (and in
ECHO trajectory datasets), tool-message content is trained with ``observation_weight`` and the assistant's tokens
with ``action_weight`` (``train/sft/weights.py``); a dataset without roles trains exactly as with ``SFTTrainer``.

It overrides these ``SFTTrainer`` / ``Trainer`` hooks (TRL 1.16, transformers 5):

* ``__init__``: the same signature; ``TrainingArguments`` / ``SFTConfig`` converted to ``EchoSFTConfig``; rows
  filtered by ``min_reward`` (``train/sft/reward_filter.py``);
* ``_prepare_dataset``: TRL's preparation with role weights coded into ``labels`` (``train/sft/prepare.py``), so
  TRL's truncation, packing and collation carry them;
* ``get_batch_samples``: the accumulation window's divisor is its weight sum (TRL's token count when no token is
  weighted), over every process;
* ``compute_loss``: TRL's own when the batch carries no role weight; else TRL's loss with a weight per token
  (``train/sft/loss.py``) and TRL's metrics, plus per-role CE;
* ``create_model_card`` / ``save_model``: TRL's card plus the SFT stage's section (``train/model_card.py``).
"""

from __future__ import annotations

import logging
import warnings

import torch
from datasets import Dataset, IterableDataset
from trl import SFTTrainer

from .errors import EchoTrlError
from .sft_config import as_echo_sft_config
from .train import trl_compat
from .train.model_card import add_sft_section
from .train.sft.loss import align_weights, role_nll, weighted_label_smoothing, weighted_nll
from .train.sft.prepare import prepare_sft_dataset
from .train.sft.reward_filter import filter_by_reward
from .train.sft.weights import ACTION, OBSERVATION, SFTWeights, batch_weight_sum, class_weights, split_labels
from .train.step.trainable import guard_training, require_trainable_tokens

__all__ = ["EchoSFTTrainer"]

logger = logging.getLogger(__name__)


class EchoSFTTrainer(SFTTrainer):
    """``SFTTrainer`` with observation supervision: ``observation_weight`` x CE on tool-message content,
    ``action_weight`` x CE on the assistant's tokens, TRL's mask elsewhere; normalised by the weight sum.

    Takes what ``SFTTrainer`` takes, in the same positions. ``reward_filter`` says what ``min_reward`` kept.
    """

    _tag_names = ["trl", "sft", "echo"]
    _name = "ECHO-SFT"

    def __init__(
        self,
        model,
        args=None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_loss_func=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        optimizer_cls_and_kwargs=None,
        preprocess_logits_for_metrics=None,
        quantization_config=None,
        peft_config=None,
        formatting_func=None,
    ):
        args = as_echo_sft_config(args, model)
        self.sft_weights = SFTWeights.from_args(args)
        actions = args.action_weight > 0
        world = args.world_loss_target if args.observation_weight > 0 else None
        if isinstance(train_dataset, Dataset):  # before TRL's preparation drops the rows without a label
            require_trainable_tokens(train_dataset, "train_dataset", actions=actions, world_target=world)
        if isinstance(train_dataset, (Dataset, IterableDataset)):
            train_dataset, self.reward_filter = filter_by_reward(
                train_dataset, args.min_reward, args.world_all_episodes
            )
            logger.info(self.reward_filter.summary())
        else:  # None or not a dataset: TRL's own error follows
            _, self.reward_filter = filter_by_reward(None, None)
        super().__init__(
            model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_loss_func=compute_loss_func,
            compute_metrics=compute_metrics,
            callbacks=callbacks,
            optimizers=optimizers,
            optimizer_cls_and_kwargs=optimizer_cls_and_kwargs,
            preprocess_logits_for_metrics=preprocess_logits_for_metrics,
            quantization_config=quantization_config,
            peft_config=peft_config,
            formatting_func=formatting_func,
        )
        if isinstance(self.train_dataset, Dataset) and len(self.train_dataset) == 0:  # TRL's sampler would raise
            raise EchoTrlError(
                "train_dataset: no row is left after TRL's preparation (a row whose trainable tokens all fall past "
                f"max_length={args.max_length} is dropped; trajectories with long prompts need a larger --max_length)"
            )
        guard_training(self, actions=actions, world_target=world)  # untrainable batches, non-finite steps

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        """TRL 1.16's hook (called by ``__init__`` and ``evaluate``): TRL's preparation, role weights in ``labels``."""
        return prepare_sft_dataset(
            trl_compat.sft_prepare_dataset(self),
            dataset,
            processing_class,
            args,
            packing,
            formatting_func,
            dataset_name,
            tokenizer=trl_compat.tokenizer(self),
            weights=self.sft_weights,
            completion_only=self.completion_only_loss,
            chat_template=self.chat_template,
        )

    # ----------------------------------------------------------------------------------------
    # Loss

    def get_batch_samples(self, epoch_iterator, num_batches: int, device):
        """The accumulation window's micro-batches, and the divisor of their loss: when any token carries a role
        weight, the window's weight sum over every process, in place of transformers' token count."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if num_items is None or all(split_labels(b.get("labels")) is None for b in batches):
            return batches, num_items
        total = sum(batch_weight_sum(b["labels"], self.sft_weights.table) for b in batches).to(device)
        if self.args.average_tokens_across_devices and self.args.world_size > 1:
            total = self.accelerator.gather(total).sum()
        total = total / (self.get_tp_size() * self.get_cp_size() * self.get_sp_size())
        return batches, total.float()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss, or, for a batch whose labels carry role weights, TRL's loss with a weight per token."""
        split = split_labels(inputs.get("labels"))
        if split is None:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs["labels"], classes = split  # in place, as TRL edits inputs: evaluation's metrics see plain labels
        if self.compute_loss_func is not None:
            raise EchoTrlError(
                "compute_loss_func receives TRL's labels only, so the role weights of this batch cannot reach it: "
                "drop compute_loss_func, or train without tool messages"
            )
        if "shift_labels" in inputs:
            raise EchoTrlError("role weights are not supported with context or sequence parallelism (shift_labels)")
        mode = "train" if self.model.training else "eval"
        weights = class_weights(classes, self.sft_weights.table)
        inputs["use_cache"] = False
        if self.aux_loss_enabled:
            inputs["output_router_logits"] = True
        logits_inputs = {k: v for k, v in inputs.items() if k != "labels"}
        smoothing = self.label_smoother is not None and self.args.loss_type == "nll"
        if smoothing:  # label smoothing needs the full logits; the fused outputs feed the metrics only (as TRL)
            eps = self.args.label_smoothing_factor
            result = weighted_label_smoothing(
                model(**logits_inputs).logits, inputs["labels"], weights, eps, divisor=num_items_in_batch
            )
            with torch.no_grad():
                outputs = model(**inputs, fused_lm_head=True)
        else:
            outputs = model(**inputs, fused_lm_head=True)
            w = align_weights(weights, outputs.log_probs.shape[-1])
            dft = self.args.loss_type == "dft"
            result = weighted_nll(outputs.log_probs, w, divisor=num_items_in_batch, dft=dft)
        loss = result.loss
        if self.args.average_tokens_across_devices and num_items_in_batch is not None:
            loss = loss * (self.accelerator.num_processes // self.get_tp_size())  # DDP averages the gradients
        if self.aux_loss_enabled and not smoothing:  # as TRL: a per-micro-batch mean, averaged over the window
            steps = self.current_gradient_accumulation_steps if num_items_in_batch is not None else 1
            loss = loss + self.router_aux_loss_coef * outputs.aux_loss / steps
        trl_compat.log_sft_step_metrics(self, outputs, inputs, mode)
        self._log_roles(mode, outputs.log_probs, classes, result)
        if return_outputs:
            warnings.warn(
                "`return_outputs=True` recomputes the logits with an extra forward pass (as TRL's SFTTrainer)",
                FutureWarning,
                stacklevel=2,
            )
            with torch.no_grad():
                outputs = model(**logits_inputs)
        return (loss, outputs) if return_outputs else loss

    def _log_roles(self, mode: str, log_probs: torch.Tensor, classes: torch.Tensor, result) -> None:
        """Per-role CE (nats/token) over this micro-batch's weighted tokens and the weighted CE, summed over
        processes."""
        n = log_probs.shape[-1]
        env = align_weights((classes == OBSERVATION).float(), n)
        act = align_weights((classes == ACTION).float(), n)
        env_nll, env_n = role_nll(log_probs, env)
        act_nll, act_n = role_nll(log_probs, act)
        local = torch.stack([env_nll, env_n, act_nll, act_n, result.weighted_nll.float(), result.weight_sum.float()])
        s = self.accelerator.reduce(local.to(self.accelerator.device), reduction="sum").tolist()
        m = trl_compat.metrics(self, mode)
        if s[1]:
            m["sft/ce_env"].append(s[0] / s[1])
        if s[3]:
            m["sft/ce_action"].append(s[2] / s[3])
        m["sft/weighted_ce"].append(s[4] / s[5] if s[5] else 0.0)
        m["sft/tokens_env"].append(s[1])
        m["sft/tokens_action"].append(s[3])

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
