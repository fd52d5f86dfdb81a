"""The launch checks of ``echo-trl train``, as pure functions of the launcher's environment and the resolved state
(the real launches are in tests/test_distributed.py)."""

from __future__ import annotations

import pytest

from echo_trl.commands.support.launch_checks import check_precision, check_processes
from echo_trl.errors import EchoTrlError


@pytest.mark.parametrize("distributed_type", ["MULTI_CPU", "NO", "DEEPSPEED"])
def test_fsdp_is_refused_where_accelerate_would_drop_it(distributed_type):
    env = {"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "2"}
    with pytest.raises(EchoTrlError, match=f"FSDP was requested .* run as {distributed_type}.*plain DDP"):
        check_processes(env, distributed_type=distributed_type, num_processes=2)


def test_fsdp_on_gpus_and_ddp_on_cpu_pass():
    check_processes({"ACCELERATE_USE_FSDP": "true", "WORLD_SIZE": "8"}, distributed_type="MULTI_GPU", num_processes=8)
    check_processes({"WORLD_SIZE": "2"}, distributed_type="MULTI_CPU", num_processes=2)
    check_processes({}, distributed_type="NO", num_processes=1)  # a plain single process


@pytest.mark.parametrize(
    "env, fix", [({}, "--use_cpu true"), ({"ACCELERATE_USE_DEEPSPEED": "true"}, "--ddp_backend gloo")]
)
def test_processes_launched_together_that_joined_no_group_are_refused(env, fix):
    with pytest.raises(EchoTrlError, match="launched as 2 processes .* joined no process group") as err:
        check_processes({**env, "WORLD_SIZE": "2"}, distributed_type="NO", num_processes=1)
    assert fix in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "env, bf16, fp16, named",
    [
        ({"ACCELERATE_MIXED_PRECISION": "bf16"}, False, False, ["mixed_precision: bf16", "--bf16 false"]),
        ({"ACCELERATE_MIXED_PRECISION": "fp16"}, True, False, ["mixed_precision: fp16", "--bf16 true"]),
        (
            {"ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_DEEPSPEED": "true"},
            True,
            False,
            ["mixed_precision: no", "--bf16 true"],
        ),
    ],
)
def test_a_precision_mismatch_names_both_sides(env, bf16, fp16, named):
    with pytest.raises(EchoTrlError, match="precision mismatch") as err:
        check_precision(env, bf16=bf16, fp16=fp16)
    assert all(n in str(err.value) for n in named)


def test_agreeing_precisions_pass():
    check_precision({"ACCELERATE_MIXED_PRECISION": "bf16"}, bf16=True, fp16=False)
    check_precision({"ACCELERATE_MIXED_PRECISION": "no"}, bf16=False, fp16=False)
    check_precision({"ACCELERATE_MIXED_PRECISION": "no"}, bf16=True, fp16=False)  # DDP: the trainer flag decides
    check_precision({}, bf16=True, fp16=False)  # not launched by accelerate
