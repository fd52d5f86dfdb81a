"""What ``accelerate launch`` asked for against what the processes will really run, checked before any model loads.

accelerate resolves a launch in ways that train something other than what the config says, without an error:

* FSDP is kept only for processes on a GPU-type device (``AcceleratorState.__init__`` sets the FSDP plugin for
  ``MULTI_GPU``/``MULTI_XPU``/... states only): with ``--use_cpu`` the FSDP config runs as plain DDP, every rank
  holding the full weights;
* processes launched together but with no backend to join (no GPU, no ``--use_cpu``, no ``--ddp_backend``)
  each run as a world of one: every process trains alone on its share of the batch and all of them write
  the same ``--output_dir``;
* a config's ``mixed_precision`` that disagrees with ``--bf16`` / ``--fp16``: DDP trains in the config's
  precision whatever the flags say, DeepSpeed stops with a ``ValueError`` about its ``bf16.enabled``.

:func:`check_launch` refuses each in one line that says what would have happened and what to do.
:func:`leave_process_group` is the teardown every exit path of ``echo-trl train`` takes.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

from ...errors import EchoTrlError

__all__ = ["check_launch", "check_precision", "check_processes", "leave_process_group"]

#: The accelerate distributed types ``AcceleratorState`` keeps an FSDP plugin for (accelerate 1.15).
FSDP_DEVICE_TYPES = frozenset(
    {"MULTI_GPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_NPU", "MULTI_XPU", "MULTI_HPU", "MULTI_NEURON"}
)
CPU_ZERO_CONFIG = "examples/accelerate_configs/deepspeed_zero3_cpu.yaml"


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").lower() in ("true", "1")


def check_precision(env: Mapping[str, str], *, bf16: bool, fp16: bool) -> None:
    """The launcher's ``mixed_precision`` (``ACCELERATE_MIXED_PRECISION``) and the trainer flags agree."""
    launched = env.get("ACCELERATE_MIXED_PRECISION")
    flags = "bf16" if bf16 else "fp16" if fp16 else "no"
    if launched is None or launched == flags:
        return
    if launched == "no" and not _flag(env, "ACCELERATE_USE_DEEPSPEED"):
        return  # DDP: the trainer's flag decides, nothing disagrees at run time
    flag_text = f"--{flags} true" if flags != "no" else "--bf16 false --fp16 false"
    raise EchoTrlError(
        f"precision mismatch: the accelerate config has mixed_precision: {launched} but the trainer flags say "
        f"{flag_text}; make them agree (e.g. --{launched} true, or mixed_precision: {flags} in the config / "
        f"`accelerate launch --mixed_precision {flags}`)"
    )


def check_processes(env: Mapping[str, str], *, distributed_type: str, num_processes: int) -> None:
    """The processes accelerate will run are the ones the launch asked for: sharded where FSDP was asked, and
    in one process group where several were launched (``distributed_type``, ``num_processes``: this process's
    resolved ``PartialState``)."""
    launched = int(env.get("WORLD_SIZE", "1") or 1)
    if _flag(env, "ACCELERATE_USE_FSDP") and distributed_type not in FSDP_DEVICE_TYPES:
        raise EchoTrlError(
            f"FSDP was requested (accelerate config distributed_type: FSDP) but these processes run as "
            f"{distributed_type} (no GPU, or --use_cpu), for which accelerate drops FSDP and would train plain DDP "
            f"with the full weights on every rank: launch the FSDP config on GPUs, or on CPU use DeepSpeed ZeRO "
            f"({CPU_ZERO_CONFIG} with --ddp_backend gloo)"
        )
    if launched > 1 and num_processes == 1:
        how = (
            "--ddp_backend gloo (DeepSpeed on CPU)"
            if _flag(env, "ACCELERATE_USE_DEEPSPEED")
            else "--use_cpu true (DDP on CPU processes)"
        )
        raise EchoTrlError(
            f"launched as {launched} processes (WORLD_SIZE={launched}) but this one joined no process group (no GPU "
            f"and no CPU backend): each would train alone on its share of the batch and all would write the same "
            f"--output_dir; on a machine without a GPU pass {how}"
        )


def check_launch(training_args, env: Mapping[str, str] | None = None) -> None:
    """:func:`check_precision` and :func:`check_processes` for parsed ``training_args`` (reading them starts the
    process group accelerate would start anyway)."""
    env = os.environ if env is None else env
    check_precision(env, bf16=bool(training_args.bf16), fp16=bool(training_args.fp16))
    _ = training_args.device  # transformers resolves the distributed state with the device
    state = training_args.distributed_state
    if state is None:
        return
    check_processes(env, distributed_type=str(state.distributed_type.name), num_processes=state.num_processes)


def leave_process_group() -> None:
    """Tear down in the order that cannot hang: the trainer's DDP/DeepSpeed objects (whose destructors wait on
    the backend's threads) are collected while the process group still exists, then the group is destroyed,
    before the interpreter starts its own exit. Called on every exit path of ``echo-trl train``; a no-op in a
    single process."""
    import torch.distributed as dist

    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
