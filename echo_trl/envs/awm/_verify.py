"""Verifier bootstrap, run inside the sandbox: ``python -I _verify.py SPEC.json RESULT.json``.

Never imported by echo_trl. Compiles the verifier code, calls its entry point with the
arguments its signature accepts (``initial_db_path``, ``final_db_path``, ``final_answer``; or
positionally) and writes ``{"status": "ok", "value": ...}`` or ``{"status": "error", "error_type",
"error_message"}`` to RESULT.json. Anything the verifier prints goes to the log, not the result.
"""

import inspect
import json
import sys
import traceback


def call(func, initial, final, final_answer):
    params = inspect.signature(func).parameters
    names = {"initial_db_path": initial, "final_db_path": final, "final_answer": final_answer or ""}
    kwargs = {k: v for k, v in names.items() if k in params}
    if kwargs:
        return func(**kwargs)
    args = [initial, final, final_answer or ""][: max(2, min(3, len(params)))]
    return func(*args)


def main():
    spec_path, result_path = sys.argv[1:3]
    with open(spec_path, encoding="utf-8") as fh:
        spec = json.load(fh)
    try:
        try:
            code = compile(spec["code"], spec["filename"], "exec")
        except SyntaxError as exc:
            out = {
                "status": "error",
                "error_type": "SyntaxError",
                "error_message": f"line {exc.lineno}: {exc.msg}" + (f": {exc.text.strip()}" if exc.text else ""),
            }
        else:
            import os
            import re
            import sqlite3

            namespace = {"__name__": "awm_verifier", "sqlite3": sqlite3, "json": json, "os": os, "re": re}
            exec(code, namespace)
            func = namespace.get(spec["function"])
            if not callable(func):
                out = {
                    "status": "error",
                    "error_type": "NameError",
                    "error_message": f"the verifier code defines no function {spec['function']!r}",
                }
            else:
                value = call(func, spec["initial_db_path"], spec["final_db_path"], spec.get("final_answer"))
                out = {"status": "ok", "value": json.loads(json.dumps(value, default=str))}
    except Exception as exc:  # the verifier's own bug: report it, do not crash
        tb = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == spec["filename"]), None)
        out = {
            "status": "error",
            "error_type": type(exc).__name__,
            "error_message": (f"line {line}: " if line else "") + str(exc),
        }
    with open(result_path, "w", encoding="utf-8") as fh:
        json.dump(out, fh)


if __name__ == "__main__":
    main()
