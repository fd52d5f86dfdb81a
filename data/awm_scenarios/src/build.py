"""Build the AWM-1K-format files of the project's own scenarios from their sources.

    python data/awm_scenarios/src/build.py            # rewrite data/awm_scenarios/*.jsonl
    python data/awm_scenarios/src/build.py --check    # exit 1 if the files are out of date

Sources live in ``data/awm_scenarios/src/<scenario>/``: ``scenario.py`` (description, tasks, splits),
``db.py`` (schema + sample rows), ``app.py`` (the FastAPI app, ``gen_envs.full_code``),
``verifiers/task_<k>.py`` (code verifiers) and ``solutions.py`` (replay policies). ``gen_spec`` is
derived from the app's OpenAPI schema. Authored for echo_trl (Apache-2.0); the file layout follows
the AgentWorldModel-1K format (CC-BY-4.0, arXiv 2602.10090).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent
OUT = SRC.parent
SCENARIOS = ["library_1"]

# Tables each operation reads or writes (gen_spec required_tables).
REQUIRED_TABLES: dict[str, dict[str, list[str]]] = {
    "library_1": {
        "list_branches": ["branches"],
        "search_books": ["books", "copies", "branches", "holds"],
        "get_book": ["books", "copies", "branches", "loans", "holds"],
        "search_members": ["members", "branches"],
        "get_member": ["members", "branches", "loans", "holds", "fines"],
        "update_member": ["members", "branches"],
        "renew_membership": ["members", "branches"],
        "list_member_loans": ["loans", "copies", "books", "branches", "holds"],
        "checkout_copy": ["members", "copies", "books", "loans", "holds", "fines"],
        "return_copy": ["copies", "loans", "fines", "holds", "books"],
        "renew_loan": ["loans", "copies", "books", "holds"],
        "list_overdue_loans": ["loans", "copies", "books", "branches"],
        "place_hold": ["holds", "members", "books", "branches"],
        "list_member_holds": ["holds", "books", "members", "branches", "copies"],
        "cancel_hold": ["holds", "copies"],
        "list_member_fines": ["fines", "loans", "copies", "books"],
        "pay_fine": ["fines", "payments"],
        "waive_fine": ["fines"],
        "create_reading_list": ["reading_lists", "members"],
        "add_book_to_reading_list": ["reading_lists", "reading_list_items", "books"],
        "list_member_reading_lists": ["reading_lists", "reading_list_items", "books"],
    }
}

JSON_TYPES = {
    "integer": "integer",
    "number": "float",
    "string": "string",
    "boolean": "boolean",
    "array": "array",
    "object": "object",
}


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_app(code: str, database_url: str = "sqlite://"):
    """Exec the app code against ``database_url`` (in-memory by default) and return the FastAPI app."""
    previous = os.environ.get("DATABASE_PATH")
    os.environ["DATABASE_PATH"] = database_url
    try:
        namespace: dict = {"__name__": "awm_scenario_app"}
        exec(compile(code, "app.py", "exec", dont_inherit=True), namespace)
        return namespace["app"]
    finally:
        if previous is None:
            os.environ.pop("DATABASE_PATH", None)
        else:
            os.environ["DATABASE_PATH"] = previous


def table_columns(ddl: str) -> list[str]:
    cols = []
    for line in ddl.splitlines()[1:]:
        m = re.match(r"\s+([a-z_][a-z0-9_]*)\s+[A-Z]", line)
        if m and m.group(1) not in ("foreign", "unique", "primary", "check"):
            cols.append(m.group(1))
    return cols


def _resolve(schema: dict, components: dict) -> dict:
    while "$ref" in schema:
        schema = components[schema["$ref"].split("/")[-1]]
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        merged = {k: v for k, v in schema.items() if k != "anyOf"}
        if options:
            return {**_resolve(options[0], components), **merged}
    return schema


def _describe(schema: dict, components: dict) -> dict:
    resolved = _resolve(schema, components)
    kind = resolved.get("type", "object" if "properties" in resolved else "string")
    out: dict = {"type": JSON_TYPES.get(kind, kind)}
    if resolved.get("description") or schema.get("description"):
        out["description"] = schema.get("description") or resolved.get("description")
    if kind == "object":
        for name, prop in resolved.get("properties", {}).items():
            out[name] = _describe(prop, components)
    elif kind == "array":
        item = _resolve(resolved.get("items", {}), components)
        if item.get("type", "object") == "object" and "properties" in item:
            out["items"] = {name: _describe(p, components) for name, p in item["properties"].items()}
        else:
            out["items"] = {"type": JSON_TYPES.get(item.get("type", "string"), "string")}
    else:
        examples = schema.get("examples") or resolved.get("examples")
        if examples:
            out["example"] = examples[0]
    return out


def build_spec(app, scenario: str, tables: dict[str, list[str]]) -> dict:
    openapi = app.openapi()
    components = openapi.get("components", {}).get("schemas", {})
    groups: dict[str, list[dict]] = {}
    for path, methods in openapi["paths"].items():
        for method, op in methods.items():
            params: dict = {}
            for p in op.get("parameters", []):
                schema = _resolve(p.get("schema", {}), components)
                entry = {
                    "type": JSON_TYPES.get(schema.get("type", "string"), "string"),
                    "param_type": p["in"],
                    "required": bool(p.get("required", False)),
                    "description": p.get("description", ""),
                }
                examples = p.get("examples") or schema.get("examples")
                if isinstance(examples, dict):
                    examples = [v.get("value") for v in examples.values()]
                if examples:
                    entry["example"] = examples[0]
                elif "default" in schema:
                    entry["example"] = schema["default"]
                params[p["name"]] = entry
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                body = _resolve(body, components)
                for name, prop in body.get("properties", {}).items():
                    prop_r = _resolve(prop, components)
                    entry = {
                        "type": JSON_TYPES.get(prop_r.get("type", "string"), "string"),
                        "param_type": "body",
                        "required": name in body.get("required", []),
                        "description": prop.get("description") or prop_r.get("description", ""),
                    }
                    examples = prop.get("examples") or prop_r.get("examples")
                    if examples:
                        entry["example"] = examples[0]
                    params[name] = entry
            response_schema = op["responses"]["200"]["content"]["application/json"]["schema"]
            response_schema = _resolve(response_schema, components)
            response = {
                name: _describe(p, components) for name, p in response_schema.get("properties", {}).items()
            }
            used = tables.get(op["operationId"], [])
            tag = op.get("tags", ["default"])[0]
            groups.setdefault(tag, []).append(
                {
                    "path": path,
                    "method": method.upper(),
                    "summary": op.get("summary", ""),
                    "description": op.get("description", ""),
                    "operation_id": op["operationId"],
                    "tags": op.get("tags", []),
                    "request_params": params,
                    "response": response,
                    "required_tables": used,
                    "required_fields": {t: TABLE_COLUMNS[scenario][t] for t in used},
                }
            )
    return {
        "api_groups": [
            {"group_name": "".join(w.capitalize() for w in tag.split("_")), "endpoints": endpoints}
            for tag, endpoints in groups.items()
        ]
    }


TABLE_COLUMNS: dict[str, dict[str, list[str]]] = {}


def build_scenario(name: str) -> dict[str, list[dict]]:
    """Return {file name: [rows for this scenario]} for one scenario."""
    base = SRC / name
    scenario = load_module(base / "scenario.py", f"_{name}_scenario")
    db = load_module(base / "db.py", f"_{name}_db")
    solutions = load_module(base / "solutions.py", f"_{name}_solutions")
    code = (base / "app.py").read_text()
    TABLE_COLUMNS[name] = {t["name"]: table_columns(t["ddl"]) for t in db.TABLES}
    app = load_app(code)
    verifiers = []
    for idx, task in enumerate(scenario.TASKS):
        verifier_code = (base / "verifiers" / f"task_{idx}.py").read_text()
        verifiers.append(
            {
                "scenario": name,
                "task_idx": idx,
                "task": task,
                "verification": {"code": verifier_code, "raw_response": ""},
            }
        )
    replay = []
    for idx in range(len(scenario.TASKS)):
        split = next(s for s, ids in scenario.SPLITS.items() if idx in ids)
        for entry in solutions.SOLUTIONS[idx]:
            replay.append(
                {
                    "scenario": name,
                    "task_idx": idx,
                    "label": entry["label"],
                    "split": split,
                    "expected": entry["expected"],
                    "steps": entry["steps"],
                    "final_answer": entry["final_answer"],
                }
            )
    return {
        "gen_scenario.jsonl": [{"name": name, "description": scenario.DESCRIPTION}],
        "gen_tasks.jsonl": [{"scenario": name, "tasks": list(scenario.TASKS)}],
        "gen_db.jsonl": [{"scenario": name, "db_schema": {"tables": db.TABLES}, "db_path": scenario.DB_PATH}],
        "gen_sample.jsonl": [
            {
                "scenario": name,
                "tables_count": len(db.SAMPLES),
                "inserts_count": sum(len(t["insert_statements"]) for t in db.SAMPLES),
                "sample_data": {"tables": db.SAMPLES},
            }
        ],
        "gen_spec.jsonl": [{"scenario": name, "api_spec": build_spec(app, name, REQUIRED_TABLES[name])}],
        "gen_envs.jsonl": [{"scenario": name, "db_path": scenario.DB_PATH, "full_code": code}],
        "gen_verifier.pure_code.jsonl": verifiers,
        "solutions.jsonl": replay,
        "splits.json": [{"scenario": name, **scenario.SPLITS}],
    }


def render() -> dict[str, str]:
    """The text of every generated file."""
    files: dict[str, list[dict]] = {}
    for name in SCENARIOS:
        for fname, rows in build_scenario(name).items():
            files.setdefault(fname, []).extend(rows)
    out = {}
    for fname, rows in files.items():
        if fname == "splits.json":
            data = {row["scenario"]: {k: v for k, v in row.items() if k != "scenario"} for row in rows}
            out[fname] = json.dumps(data, indent=2) + "\n"
        else:
            out[fname] = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the files are up to date")
    args = parser.parse_args(argv)
    stale = []
    for fname, text in render().items():
        path = OUT / fname
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(fname)
        else:
            path.write_text(text)
            print(f"wrote {path.relative_to(OUT.parent.parent)}")
    if stale:
        print(
            "out of date: " + ", ".join(stale) + " (run python data/awm_scenarios/src/build.py)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
