"""What a forward outside the training step needs under a sharding engine (DeepSpeed ZeRO-3, FSDP2).

Under ZeRO-3 and FSDP each process holds a slice of every parameter; a forward gathers the full weights
layer by layer from every process, so it is collective: all processes must run the same number of forwards,
and after a no-gradient forward the gathered weights are let go (FSDP2 reshards its root module, which it
otherwise keeps whole for the backward that follows a training forward; ZeRO-3 empties its partition cache).
"""

from __future__ import annotations

import torch

__all__ = ["local_shard", "release_gathered"]


def local_shard(param: torch.Tensor) -> torch.Tensor:
    """The part of ``param`` this process holds: ZeRO-3's partition, an FSDP2 ``DTensor``'s local shard, else the
    tensor itself."""
    partition = getattr(param, "ds_tensor", None)  # DeepSpeed ZeRO-3: ``param.data`` is empty between forwards
    if partition is not None:
        return partition
    to_local = getattr(param, "to_local", None)  # torch DTensor (FSDP2)
    return to_local() if callable(to_local) else param


def release_gathered(trainer) -> None:
    """Let go of the full weights a no-gradient forward gathered (see the module docstring)."""
    wrapped = getattr(trainer, "model_wrapped", None)
    empty_cache = getattr(wrapped, "empty_partition_cache", None)  # deepspeed.DeepSpeedEngine under ZeRO-3
    if callable(empty_cache):
        empty_cache()
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch without FSDP2
        return
    for module in trainer.model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
