"""Scenario server bootstrap, run inside the sandbox: ``python -I _serve.py APP.py DB SOCKET [READY]``.

Never imported by echo_trl. Executes the generated FastAPI code as a module (not as
``__main__``, so its own ``uvicorn.run`` block stays off), points every SQLAlchemy engine at the
episode's database (``create_engine`` is wrapped, so hard-coded URLs and ``DATABASE_PATH``
both work), mounts the MCP server with fastapi-mcp (streamable HTTP at ``/mcp``; tool name =
route ``operation_id``) and serves it on a Unix socket. Once uvicorn listens, it writes the
socket file's inode to READY (atomically): the parent treats the server as up only when the
socket at the path is that inode, so a stale file or a foreign listener there never passes
for this server.
"""

import os
import sys
import warnings


def main():
    code_path, db_path, socket_path = sys.argv[1:4]
    ready_path = sys.argv[4] if len(sys.argv) > 4 else None
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

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets)
            if ready_path and self.started:
                tmp = ready_path + ".tmp"
                with open(tmp, "w") as fh:
                    fh.write(str(os.stat(socket_path).st_ino))
                os.replace(tmp, ready_path)

    sys.stderr.write("echo-trl: serving\n")
    config = uvicorn.Config(app, uds=socket_path, log_level="warning", access_log=False, timeout_graceful_shutdown=1)
    Server(config).run()


if __name__ == "__main__":
    main()
