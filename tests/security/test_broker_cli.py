"""``streamsched broker start --security sasl`` as a user runs it: a secured local broker whose
connection files work with ``--config``, whose admin may create topics and whose other SCRAM
users may not (the StandardAuthorizer refuses, not Python), then ``broker stop``.

The other security tests build the same broker through :class:`LocalCluster` directly; this one
proves the command line and the files it writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamsched.ops.broker import free_port
from streamsched.testing import ROOT

pytestmark = pytest.mark.kafka


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMSCHED_")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "streamsched", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


def test_broker_start_security_sasl_writes_working_connection_files(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    started = cli("broker", "start", "--security", "sasl", "--user", "alice", "--data-dir", str(data),
                  "--port", str(free_port()))
    try:
        assert started.returncode == 0, started.stderr
        bootstrap = started.stdout.strip().splitlines()[-1]
        info = json.loads(next(line for line in started.stderr.splitlines() if line.startswith("{")))
        assert info["security"] == "sasl"
        files = info["connection_files"]
        assert set(files) >= {"admin", "alice"}
        admin_toml = Path(files["admin"]).read_text()
        assert bootstrap in admin_toml and "SASL_PLAINTEXT" in admin_toml and "SCRAM-SHA-512" in admin_toml
        assert "password" not in started.stdout + started.stderr.replace("password_file", "")

        defs = tmp_path / "topics"
        defs.mkdir()
        (defs / "t.toml").write_text('[[topic]]\nname = "cli-secured"\npartitions = 1\nkind = "output"\n')
        # The super user creates; a user without ACLs is refused by the broker's authorizer.
        as_admin = cli("topics", "apply", "--dir", str(defs), "--config", files["admin"])
        assert as_admin.returncode == 0, as_admin.stderr
        assert json.loads(as_admin.stdout)["created"] == ["cli-secured"]
        as_alice = cli("topics", "apply", "--dir", str(defs), "--config", files["alice"])
        assert as_alice.returncode == 2, as_alice.stderr
        assert as_alice.stderr.count("\n") == 1 and "TopicAuthorizationFailed" in as_alice.stderr
    finally:
        stopped = cli("broker", "stop", "--data-dir", str(data))
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped.stderr
