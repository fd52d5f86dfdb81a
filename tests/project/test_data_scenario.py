"""The project's own AWM-format scenario in data/awm_scenarios (issue 4, deliverable 5).

Runs the scenario's FastAPI app in-process (fastapi.testclient), on a SQLite database built from
gen_db + gen_sample, replays every line of solutions.jsonl the way fastapi-mcp 0.4.0 maps MCP tool
arguments onto HTTP requests, and checks the task verifiers: references complete, failures do not.
Only the AWM-1K key comparison reads ../shared (the conftest fixture skips it when absent).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sqlalchemy")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data" / "awm_scenarios"
SCENARIO = "library_1"
AWM_FILES = [
    "gen_scenario.jsonl",
    "gen_tasks.jsonl",
    "gen_db.jsonl",
    "gen_sample.jsonl",
    "gen_spec.jsonl",
    "gen_envs.jsonl",
    "gen_verifier.pure_code.jsonl",
]
EXPECTED_TOOLS = {
    "list_branches",
    "search_books",
    "get_book",
    "search_members",
    "get_member",
    "update_member",
    "renew_membership",
    "list_member_loans",
    "checkout_copy",
    "return_copy",
    "renew_loan",
    "list_overdue_loans",
    "place_hold",
    "list_member_holds",
    "cancel_hold",
    "list_member_fines",
    "pay_fine",
    "waive_fine",
    "create_reading_list",
    "add_book_to_reading_list",
    "list_member_reading_lists",
}
FAILURE_LABELS = {"wrong_args", "unknown_tool", "stop_early", "invalid_id"}


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def scenario_row(fname: str, key: str = "scenario") -> dict:
    rows = [r for r in read_jsonl(DATA / fname) if r[key] == SCENARIO]
    assert len(rows) == 1, f"{fname}: expected one line for {SCENARIO}, got {len(rows)}"
    return rows[0]


def build_db(path: Path) -> None:
    """Create the initial database from the gen_db schema and gen_sample inserts."""
    schema = scenario_row("gen_db.jsonl")["db_schema"]
    samples = scenario_row("gen_sample.jsonl")["sample_data"]
    conn = sqlite3.connect(path)
    try:
        for table in schema["tables"]:
            conn.execute(table["ddl"])
            for index in table["indexes"]:
                conn.execute(index)
        for table in samples["tables"]:
            for statement in table["insert_statements"]:
                conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def copy_db(src: Path, dst: Path) -> None:
    """Copy a SQLite database page by page (the backup API works while the app holds connections)."""
    source, target = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        source.backup(target)
    finally:
        source.close()
        target.close()


class Env:
    """The scenario app in-process, with tool calls mapped onto HTTP requests like fastapi-mcp 0.4.0."""

    def __init__(self, workdir: Path):
        self.initial = workdir / "initial.db"
        self.live = workdir / "live.db"
        build_db(self.initial)
        shutil.copyfile(self.initial, self.live)
        code = scenario_row("gen_envs.jsonl")["full_code"]
        previous = os.environ.get("DATABASE_PATH")
        os.environ["DATABASE_PATH"] = f"sqlite:///{self.live}"
        try:
            self.namespace: dict = {"__name__": f"awm_{SCENARIO}_app"}
            exec(compile(code, f"{SCENARIO}_app.py", "exec", dont_inherit=True), self.namespace)
        finally:
            if previous is None:
                os.environ.pop("DATABASE_PATH", None)
            else:
                os.environ["DATABASE_PATH"] = previous
        self.app = self.namespace["app"]
        self.client = TestClient(self.app)
        self.operations: dict[str, dict] = {}
        for path, methods in self.app.openapi()["paths"].items():
            for method, op in methods.items():
                self.operations[op["operationId"]] = {
                    "path": path,
                    "method": method,
                    "parameters": op.get("parameters", []),
                }

    def reset(self) -> None:
        self.namespace["engine"].dispose()
        copy_db(self.initial, self.live)

    def call(self, tool_name: str, arguments: dict) -> tuple[int, object]:
        """(HTTP status, JSON body); status 0 for an unknown tool (fastapi-mcp raises 'Unknown tool')."""
        op = self.operations.get(tool_name)
        if op is None:
            return 0, {"error": f"Unknown tool: {tool_name}"}
        args = dict(arguments)
        path = op["path"]
        for param in op["parameters"]:
            if param["in"] == "path" and param["name"] in args:
                path = path.replace("{" + param["name"] + "}", str(args.pop(param["name"])))
        query = {p["name"]: args.pop(p["name"]) for p in op["parameters"] if p["in"] == "query" and p["name"] in args}
        body = args or None
        if op["method"] in ("get", "delete"):
            response = self.client.request(op["method"].upper(), path, params=query)
        else:
            response = self.client.request(op["method"].upper(), path, params=query, json=body)
        return response.status_code, response.json()

    def snapshot(self, dst: Path) -> Path:
        copy_db(self.live, dst)
        return dst


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Env:
    environment = Env(tmp_path_factory.mktemp("library_1"))
    yield environment
    environment.client.close()
    environment.namespace["engine"].dispose()


def run_verifier(task_idx: int, initial: Path, final: Path, final_answer: str | None = None) -> dict:
    rows = [r for r in read_jsonl(DATA / "gen_verifier.pure_code.jsonl") if r["scenario"] == SCENARIO]
    row = next(r for r in rows if r["task_idx"] == task_idx)
    namespace: dict = {}
    exec(compile(row["verification"]["code"], f"verifier_{task_idx}.py", "exec", dont_inherit=True), namespace)
    return namespace["verify_task_completion"](str(initial.resolve()), str(final.resolve()), final_answer)


def play(env: Env, steps: list[dict]) -> list[tuple[str, int, object]]:
    env.reset()
    return [(s["tool_name"], *env.call(s["tool_name"], s["arguments"])) for s in steps]


SOLUTIONS = [r for r in read_jsonl(DATA / "solutions.jsonl") if r["scenario"] == SCENARIO]


# --------------------------------------------------------------------------- format


def test_files_parse_as_awm_format():
    scenario = scenario_row("gen_scenario.jsonl", key="name")
    assert set(scenario) == {"name", "description"} and len(scenario["description"]) > 200
    tasks = scenario_row("gen_tasks.jsonl")["tasks"]
    assert len(tasks) >= 10 and all(isinstance(t, str) and t for t in tasks)
    db = scenario_row("gen_db.jsonl")
    assert set(db) == {"scenario", "db_schema", "db_path"}
    assert all(set(t) == {"name", "ddl", "indexes"} for t in db["db_schema"]["tables"])
    sample = scenario_row("gen_sample.jsonl")
    tables = sample["sample_data"]["tables"]
    assert sample["tables_count"] == len(tables)
    assert sample["inserts_count"] == sum(len(t["insert_statements"]) for t in tables)
    assert all(set(t) == {"table_name", "reasoning", "insert_statements"} for t in tables)
    envs = scenario_row("gen_envs.jsonl")
    assert set(envs) == {"scenario", "db_path", "full_code"} and envs["db_path"] == db["db_path"]
    assert 'os.getenv("DATABASE_PATH"' in envs["full_code"]
    verifiers = [r for r in read_jsonl(DATA / "gen_verifier.pure_code.jsonl") if r["scenario"] == SCENARIO]
    assert sorted(r["task_idx"] for r in verifiers) == list(range(len(tasks)))
    for row in verifiers:
        assert row["task"] == tasks[row["task_idx"]]
        assert set(row["verification"]) == {"code", "raw_response"}
        assert "def verify_task_completion(initial_db_path: str, final_db_path: str" in row["verification"]["code"]
    spec = scenario_row("gen_spec.jsonl")["api_spec"]
    ops = [e["operation_id"] for g in spec["api_groups"] for e in g["endpoints"]]
    assert sorted(ops) == sorted(EXPECTED_TOOLS)


def _key_shape(value, depth: int = 0) -> set[str]:
    """Dotted key paths of a JSON value (lists: union over items), to compare file shapes."""
    keys: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            keys.add(k)
            keys |= {f"{k}.{sub}" for sub in _key_shape(v, depth + 1)}
    elif isinstance(value, list):
        for item in value:
            keys |= _key_shape(item, depth + 1)
    return keys


# Free-form maps whose keys are names (parameters, response fields, tables), not format keys.
_NAME_MAPS = ("request_params", "response", "required_fields")


def _format_keys(fname: str, row: dict) -> set[str]:
    keys = _key_shape(row)
    if fname == "gen_spec.jsonl":
        endpoints = [e for g in row["api_spec"]["api_groups"] for e in g["endpoints"]]
        keys = {k for k in keys if not any(f".{m}." in k for m in _NAME_MAPS)}
        params = set().union(*(set(p) for e in endpoints for p in e["request_params"].values()))
        keys |= {f"param.{k}" for k in params}
    return keys


def test_keys_match_the_awm1k_samples(awm1k_samples):
    """Same keys as the real AWM-1K sample files (the conftest fixture skips when ../shared is absent)."""
    for fname in AWM_FILES:
        theirs = read_jsonl(awm1k_samples / fname)
        ours = read_jsonl(DATA / fname)
        their_keys = set().union(*(_format_keys(fname, r) for r in theirs))
        our_keys = set().union(*(_format_keys(fname, r) for r in ours))
        if fname == "gen_spec.jsonl":
            # every key of ours is one AWM uses; optional ones (e.g. a parameter's example) may be absent
            assert our_keys <= their_keys, f"{fname}: keys AWM-1K does not use: {sorted(our_keys - their_keys)}"
            assert {k for k in their_keys if k.count(".") <= 3} <= our_keys | {"param.example"}
        else:
            assert our_keys == their_keys, f"{fname}: {sorted(our_keys ^ their_keys)}"
        for row in ours:
            for key in ("scenario", "task_idx", "tables_count", "inserts_count"):
                if key in row and key in theirs[0]:
                    assert type(row[key]) is type(theirs[0][key]), (fname, key)


def test_generated_files_match_their_sources():
    spec = importlib.util.spec_from_file_location("awm_scenarios_build", DATA / "src" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    for fname, text in build.render().items():
        assert (DATA / fname).read_text() == text, f"{fname} is stale: run python data/awm_scenarios/src/build.py"


def official_server_rewrite(code: str, db: str) -> str:
    """What the official AWM server (``awm env start``) and OpenEnv's ``agent_world_model_env`` do to
    ``full_code`` before running it: every line holding ``create_engine(`` becomes a one-line call to
    their database (the rest of the line dropped). Re-stated here from their documented behaviour."""
    call = f"create_engine('sqlite:///{db}', connect_args={{'check_same_thread': False}})"
    return "\n".join(
        line.split("create_engine(")[0] + call if "create_engine(" in line else line for line in code.split("\n")
    )


def test_the_app_survives_the_official_servers_rewrite():
    """Both official servers start the app after that rewrite: a ``create_engine(`` call spread over
    lines leaves its continuation lines behind, an IndentationError."""
    code = scenario_row("gen_envs.jsonl")["full_code"]
    calls = [line for line in code.split("\n") if "create_engine(" in line]
    assert len(calls) == 1 and calls[0].startswith("engine = create_engine(") and calls[0].endswith(")")
    rewritten = official_server_rewrite(code, "/tmp/library_1.db")
    compile(rewritten, "library_1 full_code, rewritten", "exec")
    assert "engine = create_engine('sqlite:////tmp/library_1.db'" in rewritten
    with pytest.raises(SyntaxError):  # the property matters: the spread-out form does not survive it
        compile(official_server_rewrite("engine = create_engine(\n    url, echo=False\n)\n", "x"), "spread", "exec")


def test_samples_are_deterministic_and_consistent(tmp_path):
    samples = scenario_row("gen_sample.jsonl")["sample_data"]["tables"]
    statements = [s for t in samples for s in t["insert_statements"]]
    assert not [s for s in statements if re.search(r"datetime\(|date\(|CURRENT_|random\(", s, re.I)]
    build_db(tmp_path / "a.db")
    build_db(tmp_path / "b.db")
    dump = [list(sqlite3.connect(tmp_path / n).iterdump()) for n in ("a.db", "b.db")]
    assert dump[0] == dump[1]
    conn = sqlite3.connect(tmp_path / "a.db")
    # every copy on loan has exactly one active loan, and no other copy has one
    rows = conn.execute(
        "SELECT c.id, c.status, (SELECT COUNT(*) FROM loans l WHERE l.copy_id = c.id AND l.status = 'active') "
        "FROM copies c"
    ).fetchall()
    assert all((status == "on_loan") == (n == 1) and n <= 1 for _, status, n in rows)
    # ready holds point at a copy on the hold shelf
    for (copy_id,) in conn.execute("SELECT ready_copy_id FROM holds WHERE status = 'ready'"):
        assert conn.execute("SELECT status FROM copies WHERE id = ?", (copy_id,)).fetchone() == ("on_hold_shelf",)
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()


# --------------------------------------------------------------------------- tools

VALID_CALLS = {
    "list_branches": {},
    "search_books": {"query": "Andy Weir", "format": "print", "available_only": True},
    "get_book": {"book_id": 4},
    "search_members": {"query": "2119000"},
    "get_member": {"member_id": 2},
    "update_member": {"member_id": 7, "phone": "(555) 318-5507"},
    "renew_membership": {"member_id": 5},
    "list_member_loans": {"member_id": 2, "status": "all"},
    "checkout_copy": {"member_id": 1, "barcode": "31994002104259"},
    "return_copy": {"barcode": "31994002104283"},
    "renew_loan": {"loan_id": 1},
    "list_overdue_loans": {"branch_id": 2},
    "place_hold": {"member_id": 1, "book_id": 3, "pickup_branch_id": 1},
    "list_member_holds": {"member_id": 10},
    "cancel_hold": {"hold_id": 3},
    "list_member_fines": {"member_id": 2},
    "pay_fine": {"fine_id": 3, "amount": 2.0, "method": "card"},
    "waive_fine": {"fine_id": 4, "reason": "Item found and returned"},
    "create_reading_list": {"member_id": 7, "name": "Picture books"},
    "add_book_to_reading_list": {"reading_list_id": 2, "book_id": 6, "note": "For later"},
    "list_member_reading_lists": {"member_id": 1},
}

INVALID_CALLS = [
    ("get_book", {"book_id": 999}, 404),
    ("get_member", {"member_id": 0}, 404),
    ("search_books", {"query": "Circe", "format": "vinyl"}, 422),
    ("search_members", {"query": ""}, 422),
    ("checkout_copy", {"member_id": 1, "barcode": "00000000000000"}, 404),
    ("checkout_copy", {"member_id": 2, "barcode": "31994002104259"}, 403),  # fines over the limit
    ("checkout_copy", {"member_id": 5, "barcode": "31994002104259"}, 403),  # expired card
    ("checkout_copy", {"member_id": 1, "barcode": "31994002104101"}, 409),  # on loan
    ("checkout_copy", {"member_id": 1, "barcode": "31994002104382"}, 409),  # on the hold shelf for Kwame
    ("checkout_copy", {"member_id": "Priya"}, 422),
    ("return_copy", {"barcode": "31994002104119"}, 409),  # not checked out
    ("renew_loan", {"loan_id": 5}, 409),  # two renewals already
    ("renew_loan", {"loan_id": 6}, 409),  # hold queue
    ("renew_loan", {"loan_id": 13}, 409),  # returned
    ("place_hold", {"member_id": 3, "book_id": 3, "pickup_branch_id": 2}, 409),  # duplicate
    ("place_hold", {"member_id": 9, "book_id": 4, "pickup_branch_id": 2}, 403),  # suspended
    ("cancel_hold", {"hold_id": 4}, 409),  # already fulfilled
    ("pay_fine", {"fine_id": 1, "amount": 5.0, "method": "cash"}, 400),  # over the balance
    ("pay_fine", {"fine_id": 1, "amount": 1.0, "method": "bitcoin"}, 422),
    ("pay_fine", {"fine_id": 1, "amount": -1.0, "method": "cash"}, 422),
    ("pay_fine", {"fine_id": 5, "amount": 1.0, "method": "cash"}, 409),  # already paid
    ("waive_fine", {"fine_id": 6, "reason": "again"}, 409),
    ("update_member", {"member_id": 6, "email": "not-an-email"}, 422),
    ("update_member", {"member_id": 6, "email": "grace.liu@example.com"}, 409),
    ("update_member", {"member_id": 6, "home_branch_id": 9}, 404),
    ("update_member", {"member_id": 6}, 422),  # fastapi-mcp sends no body when only path args are given
    ("renew_membership", {"member_id": 9}, 403),
    ("create_reading_list", {"member_id": 1, "name": "Favorites"}, 409),
    ("add_book_to_reading_list", {"reading_list_id": 1, "book_id": 13}, 409),
]


def test_every_tool_is_reachable_with_its_operation_id(env):
    assert set(env.operations) == EXPECTED_TOOLS
    spec = scenario_row("gen_spec.jsonl")["api_spec"]
    for endpoint in (e for g in spec["api_groups"] for e in g["endpoints"]):
        op = env.operations[endpoint["operation_id"]]
        assert (op["path"], op["method"].upper()) == (endpoint["path"], endpoint["method"])
    for route in env.app.routes:
        if getattr(route, "operation_id", None):
            assert route.operation_id == route.endpoint.__name__, "operation_id must equal the tool's function name"
            assert route.description and route.summary, route.operation_id
    assert set(VALID_CALLS) == EXPECTED_TOOLS
    for tool, args in VALID_CALLS.items():
        env.reset()
        status, body = env.call(tool, args)
        assert status == 200, (tool, body)
        assert isinstance(body, dict) and body, tool


@pytest.mark.parametrize(("tool", "args", "status"), INVALID_CALLS, ids=[f"{t}-{s}" for t, _, s in INVALID_CALLS])
def test_invalid_arguments_get_4xx_with_a_reason(env, tool, args, status):
    env.reset()
    got, body = env.call(tool, args)
    assert got == status, body
    assert body.get("detail"), body


# --------------------------------------------------------------------------- replay + verifiers


def test_solutions_cover_every_task_with_references_and_failures():
    tasks = scenario_row("gen_tasks.jsonl")["tasks"]
    splits = json.loads((DATA / "splits.json").read_text())[SCENARIO]
    assert sorted(splits["train"] + splits["held_out"]) == list(range(len(tasks)))
    assert splits["held_out"] and len(splits["train"]) >= 8
    for idx in range(len(tasks)):
        lines = [s for s in SOLUTIONS if s["task_idx"] == idx]
        labels = [s["label"] for s in lines]
        assert len(labels) == len(set(labels)), (idx, labels)
        assert "reference" in labels and set(labels) >= FAILURE_LABELS, (idx, labels)
        for s in lines:
            assert set(s) == {"scenario", "task_idx", "label", "split", "expected", "steps", "final_answer"}
            assert s["expected"] == ("complete" if s["label"].startswith("reference") else "others")
            assert s["split"] == ("held_out" if idx in splits["held_out"] else "train")
            assert all(set(step) == {"tool_name", "arguments"} for step in s["steps"])


@pytest.mark.parametrize("solution", SOLUTIONS, ids=[f"task{s['task_idx']}-{s['label']}" for s in SOLUTIONS])
def test_replay_policy_reaches_the_expected_verdict(env, tmp_path, solution):
    trace = play(env, solution["steps"])
    final = env.snapshot(tmp_path / "final.db")
    verdict = run_verifier(solution["task_idx"], env.initial, final, solution["final_answer"])
    assert verdict == {"result": solution["expected"]}, trace
    statuses = [status for _, status, _ in trace]
    if solution["label"] == "reference":
        assert all(s == 200 for s in statuses), trace
    if solution["label"] == "unknown_tool":
        assert 0 in statuses
    if solution["label"] == "invalid_id":
        assert 404 in statuses, trace


@pytest.mark.parametrize("task_idx", range(10))
def test_verifiers_reject_an_untouched_database(env, task_idx):
    assert run_verifier(task_idx, env.initial, env.initial) == {"result": "others"}


def test_episodes_are_reproducible(env):
    reference = next(s for s in SOLUTIONS if s["task_idx"] == 1 and s["label"] == "reference")
    assert play(env, reference["steps"]) == play(env, reference["steps"])


def test_held_out_observations_use_the_training_vocabulary(env):
    """A world model trained on the train tasks has seen every JSON key the held-out tasks return."""

    def keys(value) -> set[str]:
        if isinstance(value, dict):
            return set(value) | set().union(*(keys(v) for v in value.values()))
        if isinstance(value, list):
            return set().union(*(keys(v) for v in value)) if value else set()
        return set()

    seen = {"train": set(), "held_out": set()}
    for solution in SOLUTIONS:
        for _, status, body in play(env, solution["steps"]):
            if status == 200:
                seen[solution["split"]] |= keys(body)
    assert seen["held_out"] and seen["held_out"] <= seen["train"], seen["held_out"] - seen["train"]


def test_replay_arguments_fit_the_mcp_tool_schemas(env):
    """The tools fastapi-mcp 0.4.0 builds from the app accept every replay step's arguments as they are."""
    fastapi_mcp = pytest.importorskip("fastapi_mcp")
    tools = {tool.name: tool for tool in fastapi_mcp.FastApiMCP(env.app, name=SCENARIO).tools}
    assert set(tools) == EXPECTED_TOOLS
    for solution in SOLUTIONS:
        for step in solution["steps"]:
            tool = tools.get(step["tool_name"])
            if tool is None:
                assert solution["label"] == "unknown_tool", step
                continue
            schema = tool.inputSchema
            assert set(step["arguments"]) <= set(schema.get("properties", {})), step
            assert set(schema.get("required", [])) <= set(step["arguments"]), step
