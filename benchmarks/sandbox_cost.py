"""What the bubblewrap sandbox costs: scenario-server start, MCP tool-call latency, verifier run.

Today's containment (before bubblewrap: ``unshare`` namespaces + a Python launcher, the
``sandbox.py``/``_launch.py`` at commit ``OLD_REF`` or ``--old-ref``, loaded with ``git show``) against
the bwrap sandbox of this checkout, on the bundled ``library_1`` scenario, in one run: each
repetition starts one server under each (alternating which goes first), times the start
(spawn -> socket ready), then ``--calls`` ``get_member`` calls over one MCP session, then one
task-0 verifier run. Ratios are bwrap / old of the medians (goal: within 10 %, <= 1.10).

    python benchmarks/sandbox_cost.py [--quick] [--json] [--old-ref REF]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL = 1.10
OLD_REF = "44839d0d92bfca390c3faa48a3626f2d6541a3b7"  # main before bubblewrap (the namespace launcher)


def old_sandbox(ref: str, where: Path):
    """The pre-bubblewrap sandbox module, from git (it is self-contained: stdlib + its launcher)."""
    for name in ("sandbox.py", "_launch.py"):
        text = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:echo_trl/envs/awm/{name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (where / name).write_text(text)
    spec = importlib.util.spec_from_file_location("old_sandbox", where / "sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_sandbox"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class OldShim:
    """server.py / verifier.py call ``sandbox.spawn(..., readonly=...)``: the old spawn has no readonly."""

    def __init__(self, module):
        self.m = module
        self.containment = module.detect_containment()
        self.SERVER_LIMITS, self.VERIFIER_LIMITS = module.SERVER_LIMITS, module.VERIFIER_LIMITS

    def spawn(self, argv, *, readonly=(), limits=None, containment=None, **kw):
        limits = self.m.Limits(
            address_space=limits.address_space,
            cpu_seconds=limits.cpu_seconds,
            file_size=limits.file_size,
            open_files=limits.open_files,
        )
        return self.m.spawn(argv, limits=limits, containment=self.containment, **kw)

    def kill_tree(self, proc, **kw):
        self.m.kill_tree(proc, **kw)


def measure(label, shim, scenario, calls: int, tmp: Path) -> dict:
    from echo_trl.envs.awm import server as server_mod
    from echo_trl.envs.awm import verifier as verifier_mod
    from echo_trl.envs.awm.database import build_database, copy_database
    from echo_trl.envs.awm.mcp_client import MCPSession

    root = Path(tempfile.mkdtemp(prefix=f"bench_{label}_", dir=tmp))
    os.chmod(root, 0o755)
    (root / "server").mkdir()
    db = root / "server" / "live.db"
    build_database(scenario, db)
    copy_database(db, root / "initial.db")
    saved = server_mod.sandbox, verifier_mod.sandbox
    server_mod.sandbox = verifier_mod.sandbox = shim
    srv = server_mod.ScenarioServer(
        scenario, root / "server", db, root / "server.log", containment=getattr(shim, "containment", None)
    )
    try:
        start = srv.start()
        with MCPSession(srv.socket_path, timeout=30, alive=srv.alive).open() as session:
            session.call_tool("get_member", {"member_id": 1})  # warm
            lat = []
            for i in range(calls):
                t0 = time.perf_counter()
                out = session.call_tool("get_member", {"member_id": 1 + i % 5})
                lat.append(time.perf_counter() - t0)
                assert not out.is_error, out.text
        work = root / "verify"
        work.mkdir()
        os.chmod(work, 0o755)
        v = verifier_mod.run_verifier(
            scenario.verifier(0, "code"), root / "initial.db", db, work, containment=getattr(shim, "containment", None)
        )
        assert v.verify_result.get("execution_status") == "success", v.verify_result
    finally:
        srv.stop()
        server_mod.sandbox, verifier_mod.sandbox = saved
        shutil.rmtree(root, ignore_errors=True)
    return {"start": start, "call": statistics.median(lat), "verify": v.seconds}


def run(args) -> dict:
    from echo_trl.envs.awm import sandbox
    from echo_trl.envs.awm.scenario import ScenarioSource

    scenario = ScenarioSource.from_dir(REPO / "data" / "awm_scenarios").load("library_1")
    repeats = args.repeats or (3 if args.quick else 7)
    calls = args.calls or (20 if args.quick else 100)
    with tempfile.TemporaryDirectory(prefix="sandbox_cost_") as tmp:
        os.chmod(tmp, 0o755)
        old = OldShim(old_sandbox(args.old_ref, Path(tmp)))
        new = sandbox
        print(f"old ({args.old_ref}): {'; '.join(old.containment.applied())}", file=sys.stderr)
        print(f"new (bwrap): {'; '.join(sandbox.require_containment().applied())}", file=sys.stderr)
        results: dict[str, list[dict]] = {"old": [], "bwrap": []}
        for r in range(repeats):
            order = [("old", old), ("bwrap", new)] if r % 2 == 0 else [("bwrap", new), ("old", old)]
            for label, shim in order:
                results[label].append(measure(label, shim, scenario, calls, Path(tmp)))
    med = {
        label: {k: statistics.median(x[k] for x in rows) for k in ("start", "call", "verify")}
        for label, rows in results.items()
    }
    ratios = {k: med["bwrap"][k] / med["old"][k] for k in ("start", "call", "verify")}
    print(f"{'':22}{'old':>10}{'bwrap':>10}{'bwrap/old':>11}")
    for k, name in (("start", "server start (s)"), ("call", "tool call (ms)"), ("verify", "verifier run (s)")):
        scale = 1000 if k == "call" else 1
        print(f"{name:22}{med['old'][k] * scale:10.3f}{med['bwrap'][k] * scale:10.3f}{ratios[k]:11.3f}")
    print(f"medians of {repeats} repetitions, {calls} calls each; goal bwrap/old <= {GOAL}")
    out = {
        "repeats": repeats,
        "calls": calls,
        "old_ref": args.old_ref,
        "medians": med,
        "ratios": ratios,
        "within_goal": {k: v <= GOAL for k, v in ratios.items()},
    }
    if args.json:
        print(json.dumps(out))
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repetitions x 20 calls (default 7 x 100)")
    p.add_argument("--json", action="store_true", help="end with one JSON line")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--calls", type=int, default=None)
    p.add_argument("--old-ref", default=OLD_REF, help="git ref with the pre-bubblewrap sandbox")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    main()
