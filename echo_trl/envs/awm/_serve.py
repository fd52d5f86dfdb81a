"""Scenario server bootstrap, run inside the sandbox: ``python -I _serve.py APP.py DB SOCKET``.

Never imported by echo_trl. Executes the generated FastAPI code as a module (not as
``__main__``, so its own ``uvicorn.run`` block stays off), points every SQLAlchemy engine at the
episode's database (``create_engine`` is wrapped, so hard-coded URLs and ``DATABASE_PATH``
both work), mounts the MCP server with fastapi-mcp (streamable HTTP at ``/mcp``; tool name =
route ``operation_id``) and serves it on a Unix socket.
"""

import os
import sys
import warnings


def main():
    code_path, db_path, socket_path = sys.argv[1:4]
    url = f"sqlite:///{db_path}"
    os.environ["DATABASE_PATH"] = url
    os.environ["DATABASE_URL"] = url
    warnings.simplefilter("ignore")

    import sqlalchemy
    import sqlalchemy.engine

    original = sqlalchemy.create_engine

    def create_engine(*args, **kwargs):
        connect_args = dict(kwargs.pop("connect_args", None) or {})
        connect_args["check_same_thread"] = False
        return original(url, connect_args=connect_args, **kwargs)

    sqlalchemy.create_engine = create_engine
    sqlalchemy.engine.create_engine = create_engine

    with open(code_path, encoding="utf-8") as fh:
        code = fh.read()
    namespace = {"__name__": "awm_scenario_app", "__file__": code_path}
    exec(compile(code, code_path, "exec"), namespace)

    from fastapi import FastAPI

    app = namespace.get("app")
    if not isinstance(app, FastAPI):
        apps = [v for v in namespace.values() if isinstance(v, FastAPI)]
        if not apps:
            sys.stderr.write("echo-trl: the scenario code defines no FastAPI app\n")
            sys.exit(3)
        app = apps[0]

    from fastapi_mcp import FastApiMCP

    FastApiMCP(app).mount_http()

    import uvicorn

    sys.stderr.write("echo-trl: serving\n")
    uvicorn.run(app, uds=socket_path, log_level="warning", access_log=False, timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
