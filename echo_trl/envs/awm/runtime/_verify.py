"""Verifier bootstrap, run inside the sandbox: ``python -I _verify.py SPEC INITIAL FINAL RESULT``.

Never imported by echo_trl. Every argument is a descriptor the host passed: SPEC (the verifier's
code and arguments, JSON), INITIAL and FINAL (database images) are sealed memfds; RESULT is where
the verdict goes. The images are copied into the sandbox's own tmpfs first (``initial.db``,
``final.db`` in the working directory: the verifier may open them read-write, as it would any
database), then the verifier code is compiled and its entry point called with the arguments its
signature accepts (``initial_db_path``, ``final_db_path``, ``final_answer``; or positionally). RESULT
gets ``{"status": "ok", "value": ...}`` or ``{"status": "error", "error_type", "error_message"}``.
Anything the verifier prints goes to the log, not the result. The host reads RESULT bounded and
parses it defensively: the verifier's code runs in this process and can write anything there.
"""

import inspect
import json
import os
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


def read_all(fd):
    return os.pread(fd, os.fstat(fd).st_size, 0)


def copy_image(fd, path):
    with open(path, "wb") as fh:
        fh.write(read_all(fd))
    os.close(fd)


def main():
    spec_fd, initial_fd, final_fd, result_fd = (int(a) for a in sys.argv[1:5])
    spec = json.loads(read_all(spec_fd))
    os.close(spec_fd)
    initial, final = os.path.join(os.getcwd(), "initial.db"), os.path.join(os.getcwd(), "final.db")
    copy_image(initial_fd, initial)
    copy_image(final_fd, final)
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
                value = call(func, initial, final, spec.get("final_answer"))
                out = {"status": "ok", "value": json.loads(json.dumps(value, default=str))}
    except Exception as exc:  # the verifier's own bug: report it, do not crash
        tb = traceback.extract_tb(exc.__traceback__)
        line = next((f.lineno for f in reversed(tb) if f.filename == spec["filename"]), None)
        out = {
            "status": "error",
            "error_type": type(exc).__name__,
            "error_message": (f"line {line}: " if line else "") + str(exc),
        }
    data = json.dumps(out).encode("utf-8", "surrogatepass")
    while data:
        data = data[os.write(result_fd, data) :]


if __name__ == "__main__":
    main()
