"""End to end on a GPU: sampler log-probs from ``vllm serve`` become behavior_logprobs equal to an independent forward.

One command, where a GPU and vLLM are present:

    python benchmarks/gpu/vllm_logprobs.py [--quick] [--json] [--temperature 0.8] [--episodes 8]   # --quick: 4

1. builds the tiny tool-calling model of the capture tests (tests/helpers/inference_server.py; hidden size 256, so
   vLLM's attention kernels get head size 64) and serves it with
   ``vllm serve MODEL --dtype float32 --logprobs-mode processed_logprobs --enable-auto-tool-choice
   --tool-call-parser hermes`` on 127.0.0.1 (processed log-probs: after temperature, as the trainer computes them);
2. collects library_1 episodes with ``echo-trl capture --policy openai:URL --verify-turn omit --logprobs on``;
3. checks: every sampled turn came back with token ids and log-probs, every turn aligned with the trainer's
   tokenization (the model's turns are exactly what its chat template renders), and each episode's
   ``behavior_logprobs`` equals the log-probs of an independent transformers forward of the same model over the
   trainer's token ids of the built dataset, at the same temperature (max absolute difference reported; the
   script exits 1 above ``--tolerance``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
os.environ.setdefault("ECHO_TRL_PROGRESS", "0")

from common import REPO, parser  # noqa: E402

DATA = REPO / "data" / "awm_scenarios"


def start_vllm(model: Path, port: int, log: Path) -> subprocess.Popen:
    vllm = shutil.which("vllm")
    if vllm is None:
        raise SystemExit("vllm is not installed here (pip install vllm, on a machine with a GPU)")
    cmd = [vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    cmd += ["--logprobs-mode", "processed_logprobs", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    cmd += ["--enforce-eager", "--gpu-memory-utilization", "0.3", "--max-model-len", "16384"]
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            time.sleep(1)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("vllm serve did not come up in 600 s")


def independent_logprobs(model_dir: Path, dataset, temperature: float) -> list[list[float]]:
    """Per row: log_softmax(logits / T) of the model at the trainer's action tokens (transformers, float32)."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from echo_trl.roles import Role
    from echo_trl.tokens.tokenization import tokenize_with_roles

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    out = []
    for row in dataset:
        tokens = tokenize_with_roles(tokenizer, row)
        ids = torch.tensor([tokens.input_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float() / temperature, -1)
        action = np.flatnonzero(tokens.roles == Role.ACTION.code)
        out.append([float(logp[p - 1, tokens.input_ids[p]]) for p in action])
    return out


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--episodes", type=int, default=None, help="episodes over library_1's tasks 0..3 (8; --quick 4)")
    p.add_argument("--tolerance", type=float, default=1e-3, help="max |behavior - independent| accepted")
    args = p.parse_args(argv)
    args.episodes = args.episodes or (4 if args.quick else 8)  # --quick: one episode per task

    from helpers.inference_server import tool_calling_model
    from helpers.processes import free_port

    from echo_trl.data.build import build_awm_dataset

    root = Path(tempfile.mkdtemp(prefix="echo_vllm_logprobs_"))
    model = tool_calling_model(root / "model", hidden=256)
    port = free_port()
    server = start_vllm(model, port, root / "vllm.log")
    out = root / "episodes"
    try:
        cmd = [sys.executable, "-m", "echo_trl.commands.cli", "capture", "--data", str(DATA)]
        cmd += ["--scenario", "library_1"]
        cmd += [x for k in range(4) for x in ("--task-idx", str(k))]
        cmd += ["--episodes", str(max(1, args.episodes // 4)), "--policy", f"openai:http://127.0.0.1:{port}/v1"]
        cmd += ["--model", str(model), "--tokenizer", str(model), "--logprobs", "on", "--verify-turn", "omit"]
        cmd += ["--temperature", str(args.temperature), "--max-steps", "3", "--max-new-tokens", "8"]
        cmd += ["--concurrency", "4", "--output", str(out), "--json"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"capture failed: {done.stderr[-3000:]}")
        summary = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    lp = summary["logprobs"]
    ds = build_awm_dataset([out], verify_turn="omit")
    recorded = [row["behavior_logprobs"] for row in ds]
    rows = [i for i, r in enumerate(recorded) if r is not None]
    independent = independent_logprobs(model, ds.select(rows), args.temperature)
    pairs = list(zip(rows, independent, strict=True))
    lengths_ok = all(len(recorded[i]) == len(ind) for i, ind in pairs)  # one value per trainer action token
    diffs = [abs(a - b) for i, ind in pairs for a, b in zip(recorded[i], ind, strict=False)] if lengths_ok else []
    results = {
        "turns": lp.get("turns", 0),
        "turns_with_logprobs": lp.get("turns_with_logprobs", 0),
        "turns_aligned": lp.get("turns_aligned", 0),
        "turns_flagged": lp.get("turns_flagged", 0),
        "episodes": summary["episodes"],
        "episodes_with_behavior_logprobs": len(rows),
        "max_abs_diff": max(diffs) if diffs else None,
        "temperature": args.temperature,
    }
    ok = (
        rows
        and lengths_ok
        and results["turns_with_logprobs"] == results["turns"] == results["turns_aligned"]
        and results["max_abs_diff"] is not None
        and results["max_abs_diff"] <= args.tolerance
    )
    results["ok"] = bool(ok)
    print(json.dumps(results) if args.json else "\n".join(f"{k}: {v}" for k, v in results.items()))
    if not ok:
        raise SystemExit(1)
    return results


if __name__ == "__main__":
    main()
