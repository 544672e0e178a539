"""Outbox fixtures: a real PostgreSQL 15 server for the session, and one backend per test case.

The server is started by the tests themselves (initdb + pg_ctl from the PostgreSQL 15 binaries)
in a fresh temporary directory, on a free loopback port, with trust authentication and its unix
socket in that directory; it is stopped on teardown. PostgreSQL refuses to run as root, so when
the tests run as root the server runs as ``nobody`` (``runuser``) over a directory it owns. No
mock and no shared system server. The binaries are looked up in ``STREAMSCHED_PG_BIN``, then
Debian's /usr/lib/postgresql/15/bin, then on PATH; where none has them (or psycopg is not
installed) the PostgreSQL cases skip, and fail under ``CI=true`` (tests/components.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from components import require, require_module, require_program
from outbox_support import Backend

PG_DIRS = [d for d in (os.environ.get("STREAMSCHED_PG_BIN"), "/usr/lib/postgresql/15/bin") if d]
"""Where the PostgreSQL server binaries are looked for before PATH."""


def pg_bin() -> Path:
    """The directory holding both ``initdb`` and ``pg_ctl`` (see :data:`PG_DIRS`), or
    :func:`~components.require`."""
    on_path = shutil.which("initdb")
    for d in [*map(Path, PG_DIRS), *([Path(on_path).parent] if on_path else [])]:
        if all((d / tool).is_file() and os.access(d / tool, os.X_OK) for tool in ("initdb", "pg_ctl")):
            return d
    require("PostgreSQL server binaries", f"initdb and pg_ctl are in none of {PG_DIRS} nor on PATH "
            "(Debian: apt-get install postgresql-15; or set STREAMSCHED_PG_BIN)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    runuser = require_program("runuser", "running as root, PostgreSQL must be started as an "
                              "unprivileged user (util-linux's runuser)")
    return [runuser, "-u", "nobody", "--", *cmd]


def _run(cmd: list[str], log: Path) -> None:
    with log.open("ab") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[-1]).name if cmd else cmd}: exit {proc.returncode}; "
                           f"see {log}:\n{log.read_text()[-2000:]}")


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """``postgresql://postgres@127.0.0.1:<port>/postgres`` of a server started for this session."""
    pg = pg_bin()
    require_module("psycopg", "psycopg 3 is not installed (pip install 'streamsched[postgres]')")
    # Under /tmp (world-traversable), not pytest's tmp dir (mode 0700, owned by root), because
    # the server may run as nobody.
    base = Path(tempfile.mkdtemp(prefix="streamsched-pg-"))
    data, log = base / "data", base / "server.log"
    if os.geteuid() == 0:
        shutil.chown(base, "nobody", "nogroup" if _group_exists("nogroup") else "nobody")
    try:
        _run(_as_server_user([str(pg / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres",
                              "-E", "UTF8", "--locale=C", "--no-sync"]), base / "initdb.log")
        port = _free_port()
        opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
        _run(_as_server_user([str(pg / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60",
                              "-o", opts, "start"]), base / "pg_ctl.log")
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        with contextlib.suppress(Exception):
            _run(_as_server_user([str(pg / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w",
                                  "-t", "60", "stop"]), base / "pg_ctl.log")
        shutil.rmtree(base, ignore_errors=True)


def _group_exists(name: str) -> bool:
    import grp

    try:
        grp.getgrnam(name)
    except KeyError:
        return False
    return True


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "sqlite":
        path = tmp_path / "service.db"
        return Backend("sqlite", f"sqlite:///{path}", lambda: sqlite3.connect(path, timeout=30))
    dsn: str = request.getfixturevalue("postgres_dsn")  # skips (fails under CI) without psycopg
    import psycopg

    return Backend("postgresql", dsn, lambda: psycopg.connect(dsn))


@pytest.fixture
def table() -> str:
    """A fresh outbox table name, so tests never share intents (the PostgreSQL server is shared)."""
    return f"outbox_{uuid.uuid4().hex[:12]}"
