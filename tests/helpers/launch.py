"""Multi-process launches of ``echo-trl train`` for the distributed tests: the launcher from the running
interpreter (never a skip for one missing on PATH), the environment, the tiny assets and a per-rank probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers.processes import free_port

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "accelerate_configs"
#: One process of ``echo-trl train`` (what ``accelerate launch -m`` starts per rank).
CLI = ["-m", "echo_trl.commands.cli"]

#: ``sitecustomize`` for the launched processes only (``PYTHONPATH``): per rank, the starting-model log-probs
#: :func:`echo_trl.train.offline.behavior.starting_logps` returned, and at ``save_model`` the parameters, the world
#: size, the DeepSpeed ZeRO stage and how much of the weights this process held; when the process group is
#: destroyed, whether the trained (DDP / DeepSpeed) model was already collected. Nothing in echo_trl changes.
PROBE = """
import os
if os.environ.get("ECHO_TRL_TEST_PROBE_DIR") and "RANK" in os.environ:
    import torch
    import echo_trl.trainer as _t
    import echo_trl.train.offline.behavior as _b
    from echo_trl.train.engines import local_shard

    _out = lambda what: os.path.join(os.environ["ECHO_TRL_TEST_PROBE_DIR"], "%s%s.pt" % (what, os.environ["RANK"]))
    _orig, _orig_logps = _t.EchoGRPOTrainer.save_model, _b.starting_logps

    def starting_logps(trainer, *args, **kwargs):
        values = _orig_logps(trainer, *args, **kwargs)
        torch.save({"values": values, "step": trainer.state.global_step}, _out("initial"))
        return values

    def save_model(self, *args, **kwargs):
        model = self.accelerator.unwrap_model(self.model)
        wrapped = getattr(self, "model_wrapped", None)
        stage = wrapped.zero_optimization_stage() if hasattr(wrapped, "zero_optimization_stage") else None
        held = sum(local_shard(p).numel() for p in model.parameters())
        full = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
        params = None
        if stage != 3:
            params = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        torch.save(
            {"params": params, "world_size": self.accelerator.num_processes, "zero_stage": stage,
             "held": held, "full": full},
            _out("rank"),
        )
        return _orig(self, *args, **kwargs)

    _b.starting_logps = starting_logps
    _t.EchoGRPOTrainer.save_model = save_model

    import json, weakref
    import torch.distributed as _dist

    _wrapped, _destroy = [], _dist.destroy_process_group
    _orig_train = _t.EchoGRPOTrainer.train

    def train(self, *args, **kwargs):
        result = _orig_train(self, *args, **kwargs)
        _wrapped.append(weakref.ref(self.model_wrapped))
        return result

    def destroy_process_group(*args, **kwargs):  # teardown order: is the wrapped model gone by now?
        alive = [ref() is not None for ref in _wrapped]
        with open(_out("teardown").replace(".pt", ".json"), "w") as f:
            json.dump({"wrapped_alive": alive}, f)
        return _destroy(*args, **kwargs)

    _t.EchoGRPOTrainer.train = train
    _dist.destroy_process_group = destroy_process_group
"""


def accelerate_launch(*args: str, port: int | None = None) -> list[str]:
    """``accelerate launch ARGS -m echo_trl.commands.cli`` with the running interpreter's accelerate."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--main_process_port",
        str(port or free_port()),
        *args,
        *CLI,
    ]


def single_process() -> list[str]:
    return [sys.executable, *CLI]


def write_probe(root: Path) -> Path:
    probe = root / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(PROBE)
    return probe


def launch_env(probe: Path | None = None, probe_out: Path | None = None, **extra: str) -> dict[str, str]:
    """Offline, one thread per process, this checkout first on the path (the probe before it when given)."""
    path = [str(probe)] if probe else []
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRL_EXPERIMENTAL_SILENCE": "1",
        "OMP_NUM_THREADS": "1",
        "ECHO_TRL_PROGRESS": "0",
        "PYTHONPATH": os.pathsep.join([*path, str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        **extra,
    }
    if probe_out is not None:
        env["ECHO_TRL_TEST_PROBE_DIR"] = str(probe_out)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for name in ("ACCELERATE_USE_CPU", "ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "WORLD_SIZE", "RANK"):
        if name not in extra:
            env.pop(name, None)
    return env


def run(
    cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 900
) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd``; its result and wall time in seconds."""
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    return proc, time.monotonic() - start


def loss_logs(out: Path, key: str = "loss") -> list[dict]:
    return [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if key in h]
