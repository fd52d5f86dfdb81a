"""Scale: build time and peak memory, token-cache build time (num_proc 1 and 2) and size, ``stats``, and the time
to the first training step, vs N.

N distinct valid AWM episodes (``scale_episodes.py``: the bundled ones replicated into distinct scenarios, ~31 KB
each) go through ``echo-trl build-dataset`` (``--num_proc 1``), the token cache build (``tokenize_dataset`` with
num_proc 1, then 2, each into an empty cache; also timed inside the process, without the interpreter start) and
``echo-trl stats`` on the built cache. Every step is its own
child process measured by ``/usr/bin/time -v`` (CPU seconds = user + system, peak RSS; the machine may be
shared, so CPU seconds are what compare). The cache's size is compared with its token columns' own bytes
(int32 ids, int8 roles, int32 prompt length and message ends, three float64 quality values per row). Linear
fits (least squares) of CPU seconds and peak RSS over N.

With ``--first_step``, ``echo-trl train --max_steps 1`` on the built cache (a tiny 64-wide Qwen3 model with the same
tokenizer, float32 on CPU, 2 trajectories a step, otherwise the command's defaults), once with the default
``behavior_policy="initial"``
and once with ``current``: the whole process (imports, model and cache load, the one step), so the difference
between the sizes is what grows with N before the first step.

    python benchmarks/data_scale/scale.py [--quick] [--json] [--sizes 1000 10000] [--cache_procs 1 2]
        [--first_step [--repeats 3]]
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py

from common import parser  # noqa: E402
from scale_episodes import write_episodes  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

CACHE_BUILD = """
import json, sys, datasets
from transformers import AutoTokenizer
from echo_trl.tokens.cache import TOKEN_COLUMNS, token_cache_dir, tokenize_dataset
ds = datasets.load_from_disk(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[2])
import time
t0 = time.perf_counter()
out = tokenize_dataset(ds, tok, num_proc=int(sys.argv[3]), show_progress=False)
build_s = time.perf_counter() - t0
d = token_cache_dir(ds, tok)
size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
cols = out.select_columns(["echo_input_ids", "echo_message_ends"]).with_format("arrow")[:]
import pyarrow.compute as pc
tokens = int(pc.sum(pc.list_value_length(cols["echo_input_ids"])).as_py())
ends = int(pc.sum(pc.list_value_length(cols["echo_message_ends"])).as_py())
print(json.dumps({"cache_bytes": size, "token_bytes": 5 * tokens + 4 * ends + 28 * len(out), "tokens": tokens,
                  "build_wall_s": round(build_s, 2)}))
"""


def tree_anon_kb(pid: int) -> int:
    """Anonymous memory (kB) of ``pid`` and every process under it, each page counted once (``Pss_Anon``: a page a
    forked worker still shares with its parent is split between them): what the process tree itself holds, without
    the pages of memory-mapped files it read (``datasets`` maps its Arrow files; the kernel can drop those pages,
    and peak RSS counts them)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            rollup = Path(f"/proc/{p}/smaps_rollup").read_text()
            total += int(re.search(r"Pss_Anon:\s+(\d+)", rollup).group(1))
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, AttributeError):
            continue  # the process ended while it was read
    return total


def timed(cmd: list[str], env: dict) -> tuple[dict, str]:
    """Run ``cmd`` under ``/usr/bin/time -v``: CPU seconds, wall seconds, peak RSS (MB), peak anonymous memory of
    its process tree (MB, sampled every 0.2 s) and its stdout."""
    peak = 0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(["/usr/bin/time", "-v", *cmd], stdout=out, stderr=err, text=True, env=env)
        while child.poll() is None:
            peak = max(peak, tree_anon_kb(child.pid))
            time.sleep(0.2)
        out.seek(0), err.seek(0)
        proc = subprocess.CompletedProcess(cmd, child.returncode, out.read(), err.read())
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")

    def field(name: str) -> str:
        return re.search(rf"{re.escape(name)}: (.+)", proc.stderr).group(1).strip()

    wall = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")
    seconds = sum(float(x) * 60**k for k, x in enumerate(reversed(wall)))
    cpu = float(field("User time (seconds)")) + float(field("System time (seconds)"))
    return {
        "cpu_s": round(cpu, 2),
        "wall_s": round(seconds, 2),
        "peak_mb": int(field("Maximum resident set size (kbytes)")) // 1024,
        "peak_anon_mb": peak // 1024,
    }, proc.stdout


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``: (a, b)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs) or 1.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


#: ``echo-trl train`` for one step of 2 trajectories on CPU, float32, nothing saved (the rest: the command's
#: defaults; a step of ~36k tokens, so the step itself stays small next to what grows with N).
TRAIN_FLAGS = [
    *("--max_steps", "1", "--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--save_strategy", "no"),
    *(
        "--disable_tqdm",
        "true",
        "--logging_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
    ),
]


def first_steps(n: int, data: Path, model: Path, root: Path, env: dict, repeats: int = 1) -> dict:
    """CPU seconds, wall seconds and memory of ``echo-trl train --max_steps 1`` with each behaviour policy (the cache
    built): the median of ``repeats`` runs each, the two policies' order flipped every repetition, each run in a
    fresh output directory (the starting log-probs' store is new every time)."""
    runs: dict[str, list[dict]] = {"initial": [], "current": []}
    for rep in range(repeats):
        for policy in ("initial", "current") if rep % 2 == 0 else ("current", "initial"):
            cmd = [sys.executable, "-m", "echo_trl.commands.cli", "train", "--model_name_or_path", str(model)]
            cmd += ["--dataset_name", str(data), "--output_dir", str(root / f"run-{n}-{policy}-{rep}")]
            runs[policy].append(timed([*cmd, *TRAIN_FLAGS, "--behavior_policy", policy], env)[0])
    return {policy: {m: statistics.median(r[m] for r in rs) for m in rs[0]} for policy, rs in runs.items()}


def measure(
    n: int, root: Path, tokenizer: Path, env: dict, procs_list=(1, 2), first_step: bool = False, repeats: int = 1
) -> dict:
    episodes, data = root / f"episodes-{n}", root / f"ds-{n}"
    raw = write_episodes(n, episodes)
    python = sys.executable
    build, _ = timed(
        [python, "-m", "echo_trl.commands.cli", "build-dataset", str(episodes), "-o", str(data), "--num_proc", "1"],
        env,
    )
    arrow = sum(f.stat().st_size for f in data.glob("*.arrow"))
    row: dict = {"n": n, "input_mb": round(raw / 1e6, 1), "arrow_mb": round(arrow / 1e6, 1), "build": build}
    for procs in procs_list:
        cache_env = {**env, "ECHO_TRL_CACHE": str(root / f"cache-{n}-{procs}")}
        stats, out = timed([python, "-c", CACHE_BUILD, str(data), str(tokenizer), str(procs)], cache_env)
        result = json.loads(out.strip().splitlines()[-1])
        stats["build_wall_s"] = result.pop("build_wall_s")  # tokenize_dataset alone: without interpreter start
        row[f"cache_np{procs}"] = stats
        row.update(result)
    stats_env = {**env, "ECHO_TRL_CACHE": str(root / f"cache-{n}-{procs_list[-1]}")}  # the cache exists: read
    row["stats"], _ = timed(
        [python, "-m", "echo_trl.commands.cli", "stats", str(data), "--tokenizer", str(tokenizer), "--json"], stats_env
    )
    if first_step:
        row["first_step"] = first_steps(n, data, tokenizer, root, stats_env, repeats)
    return row


def mem(step: dict) -> str:
    """Peak RSS / peak anonymous memory, MB."""
    return f"{step['peak_mb']}/{step['peak_anon_mb']}"


def main(argv: list[str] | None = None) -> dict:
    p = parser(__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=None, help="episode counts (default 1000 10000)")
    p.add_argument("--cache_procs", type=int, nargs="+", default=[1, 2], help="num_proc of the cache builds")
    p.add_argument("--first_step", action="store_true", help="also time echo-trl train --max_steps 1 on the cache")
    p.add_argument("--repeats", type=int, default=1, help="runs of each first step (their median; default 1)")
    args = p.parse_args(argv)
    sizes = args.sizes or ([120, 480] if args.quick else [1000, 10000])
    env = {**os.environ, "ECHO_TRL_PROGRESS": "0", "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    with tempfile.TemporaryDirectory(prefix="echo-scale-") as tmp:
        root = Path(tmp)
        sys.path.insert(0, str(REPO))
        from echo_trl.demo.tiny import build_tiny_model, build_tiny_tokenizer

        tokenizer = root / "tokenizer"  # and the tiny model of the first-step runs, in the same directory
        tok = build_tiny_tokenizer("qwen3")
        tok.save_pretrained(str(tokenizer))
        if args.first_step:
            build_tiny_model(tok, "qwen3", hidden_size=64).save_pretrained(str(tokenizer))
        rows = [measure(n, root, tokenizer, env, args.cache_procs, args.first_step, args.repeats) for n in sizes]
    fits = {}
    xs = [r["n"] for r in rows]
    steps = ["build", *(f"cache_np{k}" for k in args.cache_procs), "stats"]
    measures = ("cpu_s", "peak_mb", "peak_anon_mb")
    series = {f"{step}.{m}": [r[step][m] for r in rows] for step in steps for m in measures}
    if args.first_step:
        for policy in ("initial", "current"):
            for m in measures:
                series[f"first_step_{policy}.{m}"] = [r["first_step"][policy][m] for r in rows]
    for name, ys in series.items():
        a, b = linear_fit(xs, ys)
        fits[name] = {"at_0": round(a, 2), "per_1k": round(1000 * b, 3)}
    out = {"rows": rows, "fits": fits}
    if args.output:
        args.output.write_text(json.dumps(out, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(out))
        return out
    print("peak memory: RSS / anonymous (RSS counts the pages of memory-mapped Arrow files read; anonymous does not)")
    if args.first_step:
        print(f"{'N':>7} | {'first step CPU s (initial / current)':>36} | {'peak MB (initial; current)':>28}")
        for r in rows:
            i, c = r["first_step"]["initial"], r["first_step"]["current"]
            print(f"{r['n']:>7} | {i['cpu_s']:>17} / {c['cpu_s']:<16} | {mem(i):>13}; {mem(c):<12}")
    if args.cache_procs != [1, 2]:
        for name, fit in fits.items():
            print(f"fit {name}: {fit['at_0']} + {fit['per_1k']} per 1k episodes")
        return out
    print(
        f"{'N':>7} {'arrow MB':>8} | {'build CPU s':>11} {'peak MB':>9} | {'cache np1 CPU/wall s':>20} "
        f"{'np2 CPU/wall s':>15} {'np1/np2 wall':>12} {'(build alone)':>13} {'peak MB np1; np2':>16} | "
        f"{'cache/tokens':>12} | {'stats CPU s':>11} {'peak MB':>9}"
    )
    for r in rows:
        c1, c2 = r["cache_np1"], r["cache_np2"]
        print(
            f"{r['n']:>7} {r['arrow_mb']:>8} | {r['build']['cpu_s']:>11} {mem(r['build']):>9} | "
            f"{c1['cpu_s']:>9}/{c1['wall_s']:<10} {c2['cpu_s']:>7}/{c2['wall_s']:<7} "
            f"{c1['wall_s'] / c2['wall_s']:>12.2f} {c1['build_wall_s'] / c2['build_wall_s']:>13.2f} "
            f"{mem(c1) + '; ' + mem(c2):>16} | {r['cache_bytes'] / r['token_bytes']:>12.2f} | "
            f"{r['stats']['cpu_s']:>11} {mem(r['stats']):>9}"
        )
    for name, fit in fits.items():
        print(f"fit {name}: {fit['at_0']} + {fit['per_1k']} per 1k episodes")
    return out


if __name__ == "__main__":
    main()
