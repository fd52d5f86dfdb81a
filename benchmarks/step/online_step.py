"""One online ECHO step on the bundled AWM scenario, split into generation / environment / loss forward /
backward, at G = 4, 8, 16, with prefix sharing on and off.

What runs is what ``examples/train_online_awm.py`` runs: ``EchoGRPOTrainer(environment_factory=...)`` on the bundled
``library_1`` scenario (data/awm_scenarios: its generated MCP server, sandboxed, a pool of server processes, the
task verifier), TRL 1.16's own tool loop, one prompt x G generations per step. The model is a tiny random-init
Qwen3 (tokenizer trained on the scenario's text) whose decoding is held by a logits processor to a
``search_members`` call (the model samples the member name among six: the G rollouts diverge inside the call);
``max_tool_calling_iterations = 2``, so each rollout makes two real tool calls and is verified once.

Per step (``EchoGRPOTrainer`` subclassed only to time TRL's hooks):

* generation: TRL's ``_generate_single_turn`` calls (every turn, the model's ``generate``);
* environment: the rest of ``_generate`` (environment resets, tool calls, TRL's tool-loop bookkeeping) and
  ``_calculate_rewards`` (the verifier);
* loss forward: ``_compute_loss`` (TRL's loss forward and loss, ECHO's world term);
* backward: ``training_step`` minus the two above and ``_prepare_inputs`` (the backward);
* other: the step minus all of them (TRL's scoring and masks, the optimizer step).

Wall seconds and this process's CPU seconds (all its threads; the scenario servers and verifier sandboxes are other
processes) are the median over the measured steps (the first step, which starts the pool's servers, is not
measured). Tokens: the loss forward's own tokens (padding excluded), the tokens it ran (``batch/packing_ratio``'s
denominator) and the micro-batch's unique tokens (distinct prefixes: what a perfect prefix tree forwards). Exactness:
the last shared micro-batch's loss (random advantages) recomputed unshared on the same weights.

    python benchmarks/step/online_step.py            # G = 4, 8, 16
    python benchmarks/step/online_step.py --quick    # G = 2, one measured step (the test suite's run)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
from common import REPO, parser, report, setup  # noqa: E402

SCENARIO = "library_1"
NAMES = ["Priya Raman", "Grace Liu", "Omar Haddad", "Lena Fischer", "Tomas Silva", "Aiko Tanaka"]
PHASES = ("generation", "environment", "loss_forward", "backward", "other")


def tool_call(name: str) -> str:
    return f'<tool_call>\n{{"name": "search_members", "arguments": {{"query": "{name}"}}}}\n</tool_call><|im_end|>'


def tool_calling_model(factory, prompts, out: Path, *, hidden: int, layers: int) -> Path:
    """A tiny random-init Qwen3 and its tokenizer (trained on the scenario's tool schemas and prompts), saved."""
    from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer

    corpus = [json.dumps(factory.environment_class._tools)] + [tool_call(n) for n in NAMES]
    corpus += [json.dumps(p) for p in prompts["prompt"]]
    tok = build_tiny_tokenizer("qwen3", corpus, vocab_size=4096)
    model = build_tiny_model(tok, "qwen3", hidden_size=hidden, num_layers=layers, num_heads=max(2, hidden // 32))
    path = out / "model"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def call_grammar(tokenizer):
    """A logits processor class keeping only the tokens that continue one of the ``search_members`` calls (one per
    name): the model still picks every token (it samples the member name), the call's JSON syntax is fixed. A
    random-init tiny model cannot learn the syntax in seconds; constrained decoding holds it to it, as it would a
    real model."""
    import torch
    from transformers import LogitsProcessor

    calls = [tokenizer(tool_call(n), add_special_tokens=False)["input_ids"] for n in NAMES]

    class CallGrammar(LogitsProcessor):
        def __init__(self):
            self.start = None

        def __call__(self, input_ids, scores):
            self.start = input_ids.shape[1] if self.start is None else self.start
            n = input_ids.shape[1] - self.start
            out = torch.full_like(scores, float("-inf"))
            for r in range(input_ids.shape[0]):
                done = input_ids[r, self.start :].tolist()
                allowed = sorted({c[n] for c in calls if len(c) > n and c[:n] == done})
                if not allowed:  # the row has finished (generate pads it)
                    out[r] = scores[r]
                    continue
                vals = scores[r, allowed]
                out[r, allowed] = vals if torch.isfinite(vals).any() else torch.zeros_like(vals)
            return out

    return CallGrammar


def hold_to_grammar(model, tokenizer) -> None:
    """Every ``model.generate`` (TRL's, each turn) decodes under a fresh :func:`call_grammar` processor."""
    import functools

    from transformers import LogitsProcessorList

    grammar, generate = call_grammar(tokenizer), model.generate

    @functools.wraps(generate)
    def constrained(*a, **k):
        return generate(*a, logits_processor=LogitsProcessorList([grammar()]), **k)

    model.generate = constrained


def timed_trainer_class():
    import torch
    from transformers import TrainerCallback

    from echo_trl.trainer import EchoGRPOTrainer

    class Clock:
        def __init__(self):
            self.now, self.steps = defaultdict(lambda: [0.0, 0.0]), []

        @contextlib.contextmanager
        def __call__(self, name: str):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                yield
            finally:
                self.now[name][0] += time.perf_counter() - wall
                self.now[name][1] += time.process_time() - cpu

    class StepClock(TrainerCallback):
        def __init__(self, clock):
            self.clock = clock

        def on_step_begin(self, args, state, control, **kw):
            self.clock.now.clear()
            self.start = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kw):
            c = {k: tuple(v) for k, v in self.clock.now.items()}
            step = (time.perf_counter() - self.start[0], time.process_time() - self.start[1])
            get = lambda k: c.get(k, (0.0, 0.0))  # noqa: E731
            split = {}
            for i, unit in enumerate(("wall", "cpu")):
                generation = get("generation")[i]
                environment = get("generate")[i] - generation + get("rewards")[i]
                backward = get("training_step")[i] - get("prepare")[i] - get("loss")[i]
                parts = {"generation": generation, "environment": environment}
                parts |= {"loss_forward": get("loss")[i], "backward": backward}
                parts["other"] = step[i] - sum(parts.values())
                split[unit] = parts | {"step": step[i]}
            self.clock.steps.append(split)

    class Timed(EchoGRPOTrainer):
        def __init__(self, *a, **k):
            self.clock = Clock()
            super().__init__(*a, callbacks=[StepClock(self.clock)], **k)

        def _generate_single_turn(self, *a, **k):
            with self.clock("generation"):
                return super()._generate_single_turn(*a, **k)

        def _generate(self, prompts):
            with self.clock("generate"):
                return super()._generate(prompts)

        def _calculate_rewards(self, *a, **k):
            with self.clock("rewards"):
                return super()._calculate_rewards(*a, **k)

        def _prepare_inputs(self, batch):
            with self.clock("prepare"):
                return super()._prepare_inputs(batch)

        def _compute_loss(self, model, inputs):
            self.last_inputs = {k: v.detach() if torch.is_tensor(v) else v for k, v in inputs.items()}
            with self.clock("loss"):
                return super()._compute_loss(model, inputs)

        def training_step(self, *a, **k):
            with self.clock("training_step"):
                return super().training_step(*a, **k)

    return Timed


def unique_tokens(inputs) -> tuple[int, int, int]:
    """(own, padded, unique) tokens of a micro-batch: unpadded, as TRL forwards it, and its distinct prefixes (the
    nodes of the rows' token trie: rows sorted, each adds its length minus its common prefix with the previous)."""
    import torch

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1).bool()
    rows = sorted(r[m].tolist() for r, m in zip(ids, mask, strict=True))
    unique, prev = 0, []
    for r in rows:
        common = next((i for i, (a, b) in enumerate(zip(r, prev, strict=False)) if a != b), min(len(r), len(prev)))
        unique += len(r) - common
        prev = r
    return int(mask.sum()), ids.numel(), unique


def unshared_loss_gap(trainer) -> float:
    """|loss shared - loss unshared| on the trainer's last micro-batch, same weights, no gradient, with random
    advantages (the bundled scenario's rewards are all 0 for a random model, so TRL's advantages are 0 and the policy
    term would compare nothing)."""
    import torch

    inputs = dict(trainer.last_inputs)
    g = torch.Generator().manual_seed(0)
    inputs["advantages"] = torch.randn(inputs["advantages"].shape, generator=g)
    losses = []
    with torch.no_grad():
        for share in (True, False):
            trainer._echo_share = share
            losses.append(trainer._compute_loss(trainer.model, dict(inputs)).item())
    trainer._echo_share = True
    return abs(losses[0] - losses[1])


def run(G: int, share: bool, model_dir: Path, prompts, factory, args, out_dir: Path) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.trainer_callback import PrinterCallback

    from echo_trl.config import EchoGRPOConfig

    steps = 1 + args.repeats
    config = EchoGRPOConfig(
        output_dir=str(out_dir / f"G{G}-share{int(share)}"),
        per_device_train_batch_size=G,
        num_generations=G,
        max_steps=steps,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=2,
        learning_rate=1e-5,
        world_model_coeff=0.05,
        prefix_sharing=share,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        gradient_checkpointing=False,
        seed=0,
    )
    model, tok = AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)
    hold_to_grammar(model, tok)
    trainer = timed_trainer_class()(
        model,
        args=config,
        train_dataset=prompts.select(range(steps)),
        processing_class=tok,
        environment_factory=factory,
    )
    trainer.remove_callback(PrinterCallback)  # one table, not a log line per step
    trainer.train()
    measured = trainer.clock.steps[1:]
    result = {
        unit: {k: round(median(s[unit][k] for s in measured), 3) for k in (*PHASES, "step")}
        for unit in ("wall", "cpu")
    }
    own, padded, unique = unique_tokens(trainer.last_inputs)
    logs = [h for h in trainer.state.log_history if "batch/packing_ratio" in h]
    result |= {
        "tokens": {"own": own, "padded": padded, "unique": unique},
        "packing_ratio": round(logs[-1]["batch/packing_ratio"], 3),
        "run_tokens": round(own / logs[-1]["batch/packing_ratio"]),
        "environment_share": round(result["wall"]["environment"] / result["wall"]["step"], 3),
        "tool_calls_per_rollout": round(logs[-1].get("tools/call_frequency", float("nan")), 2),
        "world_tokens": int(logs[-1].get("world/tokens_env", 0)),
    }
    if share:
        result["loss_gap_vs_unshared"] = unshared_loss_gap(trainer)
    return result


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, nargs="+", default=None, help="G values (default 4 8 16; --quick: 2)")
    p.add_argument("--repeats", type=int, default=None, help="measured steps per run (default 3; --quick: 1)")
    p.add_argument("--hidden_size", type=int, default=64)
    p.add_argument("--num_layers", type=int, default=2)
    p.add_argument("--max_completion_length", type=int, default=1024)
    p.add_argument("--max_servers", type=int, default=4, help="scenario server processes (the pool's bound)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = p.parse_args(argv)
    args.groups = args.groups or ([2] if args.quick else [4, 8, 16])
    args.repeats = args.repeats or (1 if args.quick else 3)
    setup(args)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    from echo_trl.envs.awm.online.dataset import awm_task_dataset
    from echo_trl.envs.awm.online.environment import awm_environment_factory, close_environments
    from echo_trl.envs.awm.scenario.source import ScenarioSource

    scenario = ScenarioSource.from_dir(REPO / "data" / "awm_scenarios").load(SCENARIO)
    tasks = json.loads((REPO / "data" / "awm_scenarios" / "splits.json").read_text())[SCENARIO]["train"]
    prompts = awm_task_dataset(scenario, [int(t) for t in tasks], repeats=8).shuffle(seed=0)
    results: dict = {"benchmark": "online_step", "quick": args.quick, "runs": {}}
    factory = awm_environment_factory(scenario, max_servers=args.max_servers)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            model_dir = tool_calling_model(
                factory, prompts, Path(out_dir), hidden=args.hidden_size, layers=args.num_layers
            )
            for G in args.groups:
                for share in (False, True):
                    results["runs"][f"G{G}_{'shared' if share else 'unshared'}"] = run(
                        G, share, model_dir, prompts, factory, args, Path(out_dir)
                    )
    finally:
        close_environments()
    results |= {
        "model": f"tiny random-init qwen3 (search_members calls by constrained decoding), hidden {args.hidden_size}, "
        f"{args.num_layers} layers, vocab 4096, fp32",
        "scenario": SCENARIO,
        "max_servers": args.max_servers,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "repeats": args.repeats,
    }
    rows = []
    for G in args.groups:
        a, b = results["runs"][f"G{G}_unshared"], results["runs"][f"G{G}_shared"]
        for name, r in (("unshared", a), ("shared", b)):
            t = r["tokens"]
            rows.append(
                (
                    str(G),
                    name,
                    *(f"{r['cpu'][k]:.2f}" for k in (*PHASES, "step")),
                    f"{r['wall']['step']:.2f}",
                    f"{r['environment_share']:.0%}",
                    f"{r['tool_calls_per_rollout']:.1f}",
                    str(r["packing_ratio"]),
                    f"{r['run_tokens'] / t['unique']:.2f}x",
                    f"{r.get('loss_gap_vs_unshared', 0):.1e}" if name == "shared" else "",
                )
            )
        results[f"G{G}_step_ratio"] = round(b["wall"]["step"] / a["wall"]["step"], 3)
        results[f"G{G}_cpu_step_ratio"] = round(b["cpu"]["step"] / a["cpu"]["step"], 3)
    for G in args.groups:
        print(
            f"G={G}: shared / unshared step = {results[f'G{G}_step_ratio']} wall, "
            f"{results[f'G{G}_cpu_step_ratio']} CPU"
        )
    print(
        f"EchoGRPOTrainer online step on {SCENARIO} ({results['model']}); CPU seconds of this process per phase, "
        f"median of {args.repeats} steps after a warm-up step; env share = environment / step, wall time"
    )
    header = ("G", "forward", *PHASES, "step CPU", "step wall", "env share", "calls", "packing", "run/unique", "gap")
    report(rows, header, results, args)
    return results


if __name__ == "__main__":
    main()
