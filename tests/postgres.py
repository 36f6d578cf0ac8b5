"""A real PostgreSQL server for the ledger's tests, from Debian's package (``scripts/install.sh --test``).

One server per test session on 127.0.0.1 and a free port, in a temporary folder; every test gets
a database of its own. initdb refuses to run as root, so as root the server runs as the
``postgres`` user. Tests that need it are skipped, saying why, only where the binaries are absent.

    from tests.postgres import pg_server, pg_url  # noqa: F401  (fixtures)
"""

from __future__ import annotations

import getpass
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

# A password the server ignores (trust authentication) but orch must never print or store.
PASSWORD = "pg-" + secrets.token_hex(8)


def binaries() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    return Path(found[-1]).parent if found else None


class PostgresServer:
    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="orch-pg-"))
        self.port = 0
        self.user = "postgres" if os.geteuid() == 0 else getpass.getuser()

    def _run(self, *argv: str) -> None:
        cmd = [str(self.bindir / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=self.root)
        if proc.returncode:
            raise RuntimeError(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")

    def start(self) -> "PostgresServer":
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self.root.chmod(0o700)
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "-A", "trust", "-U", self.user, "-E", "UTF8", "--no-sync")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        opts = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run("pg_ctl", "-D", str(data), "-l", str(self.root / "server.log"), "-o", opts, "-w", "-t", "60", "start")
        return self

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        import psycopg

        name = "orch_" + secrets.token_hex(6)
        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@pytest.fixture(scope="session")
def pg_server():
    bindir = binaries()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin "
                    "(`scripts/install.sh --test` installs them)")
    pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")
    server = PostgresServer(bindir).start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server, monkeypatch):
    """A fresh database on the session's server; ``orch`` (in this process and its children) uses it."""
    url = pg_server.new_database()
    monkeypatch.setenv("ORCH_DATABASE_URL", url)
    return url
