"""Build + tokenize throughput: exact whole-conversation tokenization vs per-segment (the seeds' way).

Episodes are AWM-size: a real captured e_commerce_33 episode (``--episode FILE``) with full tool
schemas built from that scenario's AWM-1K API spec (``--awm1k_samples DIR``, a directory of AWM-1K
files holding ``gen_spec.jsonl``), both given; else a synthetic episode of the same shape (39 tools,
6 steps). Each episode gets distinct ids/text in its
outputs so nothing is trivially repeated except what AWM repeats: the scenario's tool preamble.

Per-segment tokenization cuts the rendered text at role boundaries and tokenizes each piece
alone; it is timed on the same episodes and its ids are compared with the exact ones (drift).

    python benchmarks/data_scale/build_dataset.py [--quick] [--json] [--awm1k_samples DIR --episode FILE]
"""

from __future__ import annotations

import copy
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # common.py
os.environ.setdefault("ECHO_TRL_PROGRESS", "0")

from common import alternate, median, parser, report  # noqa: E402

from echo_trl.data.build import build_awm_dataset  # noqa: E402
from echo_trl.data.schema import row_to_trajectory  # noqa: E402
from echo_trl.demo.tiny import build_tiny_tokenizer  # noqa: E402
from echo_trl.tokens.tokenization import layout, tokenize_batch  # noqa: E402


def spec_tools(samples: Path, scenario: str) -> list[dict] | None:
    """MCP tool objects (name, description, inputSchema) from ``samples/gen_spec.jsonl``, None without the scenario."""
    path = samples / "gen_spec.jsonl"
    for line in path.read_text().splitlines():
        spec = json.loads(line)
        if spec["scenario"] != scenario:
            continue
        tools = []
        for group in spec["api_spec"]["api_groups"]:
            for ep in group["endpoints"]:
                params = ep.get("request_params") or {}
                tools.append(
                    {
                        "name": ep["operation_id"],
                        "description": ep.get("description") or ep.get("summary", ""),
                        "inputSchema": {
                            "type": "object",
                            "required": [k for k, v in params.items() if v.get("required")],
                            "properties": {
                                k: {
                                    "type": {"float": "number"}.get(v["type"], v["type"]),
                                    "description": v.get("description", ""),
                                }
                                for k, v in params.items()
                            },
                        },
                    }
                )
        return tools
    return None


def synthetic_episode(rng: random.Random) -> dict:
    tools = [
        {
            "name": f"tool_{i}",
            "description": f"Operation {i} on the shop's records, with filters and paging. " * 3,
            "inputSchema": {
                "type": "object",
                "required": ["id"],
                "properties": {
                    f"param_{j}": {"type": "string", "description": f"Filter number {j} of tool {i}."}
                    for j in range(6)
                },
            },
        }
        for i in range(39)
    ]
    steps = [
        {
            "action": {"tool_name": f"tool_{rng.randrange(39)}", "arguments": {"id": rng.randrange(100)}},
            "observation": {
                "tool_result": json.dumps(
                    {
                        "items": [
                            {"id": k, "title": f"Item {k}", "price": k * 1.5, "created_at": "2026-06-15T03:51:08"}
                            for k in range(12)
                        ]
                    },
                    indent=2,
                )
            },
        }
        for _ in range(6)
    ]
    return {
        "scenario": "synthetic_1",
        "task": "Find the item and add it to the cart.",
        "task_idx": 0,
        "tools": tools,
        "steps": steps,
        "reward": 1.0,
    }


def base_episode(samples: Path | None, captured: Path | None) -> tuple[dict, str]:
    """The captured episode with its scenario's AWM-1K tool schemas when both are given, else a synthetic one."""
    if samples is None or captured is None:
        return synthetic_episode(random.Random(0)), "synthetic AWM-shaped episode (no --awm1k_samples/--episode)"
    ep = json.loads(captured.read_text())
    tools = spec_tools(samples, ep["scenario"])
    if tools is None:
        raise SystemExit(f"build_dataset.py: error: {samples / 'gen_spec.jsonl'}: no API spec of {ep['scenario']!r}")
    ep["tools"] = tools
    return ep, f"real {ep['scenario']} episode + its AWM-1K tool schemas"


def variants(ep: dict, n: int) -> list[dict]:
    out = []
    for i in range(n):
        e = copy.deepcopy(ep)
        e["task_idx"] = i % 10
        e["reward"] = float(i % 3 == 0)
        for s in e["steps"]:
            obs = s["observation"]
            for key in ("tool_result", "error"):
                if isinstance(obs.get(key), str):
                    obs[key] = obs[key].replace('"id": 1', f'"id": {1000 + i}')
        out.append(e)
    return out


def per_segment_ids(tokenizer, trajectory) -> list[int]:
    """The seeds' way: tokenize each role segment of the rendered text on its own, concatenate."""
    lay = layout(tokenizer, trajectory)
    roles = lay.char_roles
    cuts = [0, *[i for i in range(1, len(roles)) if roles[i] != roles[i - 1]], len(roles)]
    pieces = [lay.text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    enc = tokenizer(pieces, add_special_tokens=False)["input_ids"]
    return [t for ids in enc for t in ids]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--awm1k_samples", type=Path, help="directory of AWM-1K files with gen_spec.jsonl")
    p.add_argument("--episode", type=Path, help="a captured AWM episode (JSON) of a scenario in --awm1k_samples")
    args = p.parse_args()
    if (args.awm1k_samples is None) != (args.episode is None):
        p.error("give --awm1k_samples and --episode together (or neither, for the synthetic episode)")
    if args.awm1k_samples is not None and not (args.awm1k_samples / "gen_spec.jsonl").is_file():
        p.error(f"--awm1k_samples {args.awm1k_samples}: no gen_spec.jsonl there")
    if args.episode is not None and not args.episode.is_file():
        p.error(f"--episode {args.episode}: no such file")
    n = 64 if args.quick else 256
    repeats = 3 if args.quick else 5
    ep, source = base_episode(args.awm1k_samples, args.episode)
    eps = variants(ep, n)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "episodes.jsonl"
        path.write_text("\n".join(json.dumps(e) for e in eps) + "\n")
        corpus = [json.dumps(ep)] * 2
        tokenizer = build_tiny_tokenizer("qwen3", corpus, vocab_size=16384)
        ds = build_awm_dataset([path])
        rows = list(ds)
        trajectories = [row_to_trajectory(r) for r in rows]

        def exact():
            return tokenize_batch(tokenizer, build_awm_dataset([path]).to_list())

        def per_segment():
            data = build_awm_dataset([path])
            return [per_segment_ids(tokenizer, row_to_trajectory(r)) for r in data]

        times = alternate({"exact": exact, "per_segment": per_segment}, repeats)
        exact_out = tokenize_batch(tokenizer, rows)
        seg_out = [per_segment_ids(tokenizer, t) for t in trajectories]
        drift = sum(a.input_ids != b for a, b in zip(exact_out, seg_out, strict=True))
        tokens = sum(len(r) for r in exact_out)
        t0 = time.perf_counter()
        build_awm_dataset([path])
        build_only = time.perf_counter() - t0

    chars = len(exact_out[0].text)
    res = {
        "episodes": n,
        "source": source,
        "chars_per_episode": chars,
        "tokens_per_episode": tokens / n,
        "cores": os.cpu_count(),
        "exact_episodes_per_s": n / median(times["exact"]),
        "exact_tokens_per_s": tokens / median(times["exact"]),
        "per_segment_episodes_per_s": n / median(times["per_segment"]),
        "exact_over_per_segment_time": median(times["exact"]) / median(times["per_segment"]),
        "per_segment_episodes_with_drift": drift,
        "build_only_episodes_per_s": n / build_only,
    }
    print(f"{n} episodes ({source}), {chars} chars / {tokens // n} tokens each, {os.cpu_count()} cores")
    report(
        [
            (
                "exact (whole text, roles by offsets)",
                f"{res['exact_episodes_per_s']:.0f}",
                f"{res['exact_tokens_per_s']:.0f}",
                "0",
            ),
            (
                "per segment (seeds' way)",
                f"{res['per_segment_episodes_per_s']:.0f}",
                f"{tokens / median(times['per_segment']):.0f}",
                str(drift),
            ),
        ],
        ("build + tokenize", "episodes/s", "tokens/s", "episodes with drifted ids"),
        res,
        args,
    )
    print(f"time ratio exact / per-segment: {res['exact_over_per_segment_time']:.2f}")


if __name__ == "__main__":
    main()
