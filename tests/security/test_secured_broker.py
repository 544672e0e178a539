"""The secured local broker: every SASL mechanism and TLS mode authenticates for real, a worker runs
end to end over SASL_PLAINTEXT with SCRAM, and no password reaches a log, a status page or an error.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from streamsched.kafka import clients
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.clients import Connection
from streamsched.kafka.reads import read_topic
from streamsched.ops.broker import LocalCluster, free_port
from streamsched.ops.broker_security import ADMIN
from streamsched.ops.cli import main
from streamsched.testing import ROOT, WorkerProcess, make_event, produce_events, wait_for

pytestmark = pytest.mark.kafka


def unsecured_jwt(sub: str) -> str:
    """A token Kafka's unsecured OAUTHBEARER validator accepts (alg none, no signature)."""
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': sub, 'iat': now, 'exp': now + 600})}."


def _connections(secure: LocalCluster) -> dict[str, Connection]:
    sec = secure.security
    assert sec is not None
    cert, key = sec.client_certificate(ADMIN)

    async def token() -> str:
        return unsecured_jwt(ADMIN)

    return {
        "SASL_PLAINTEXT/SCRAM-SHA-256": secure.connection(mechanism="SCRAM-SHA-256"),
        "SASL_PLAINTEXT/SCRAM-SHA-512": secure.connection(mechanism="SCRAM-SHA-512"),
        "SASL_PLAINTEXT/PLAIN": secure.connection(mechanism="PLAIN"),
        "SASL_SSL/SCRAM-SHA-512": secure.connection(tls=True),
        "SSL/client-certificate": Connection(secure.mtls_bootstrap, security_protocol="SSL",
                                             ssl_cafile=str(sec.ca_file), ssl_certfile=str(cert),
                                             ssl_keyfile=str(key)),
        "SASL_PLAINTEXT/OAUTHBEARER": Connection(secure.bootstrap, security_protocol="SASL_PLAINTEXT",
                                                 sasl_mechanism="OAUTHBEARER", oauth_token_provider=token),
    }


@pytest.mark.parametrize("mode", ["SASL_PLAINTEXT/SCRAM-SHA-256", "SASL_PLAINTEXT/SCRAM-SHA-512",
                                  "SASL_PLAINTEXT/PLAIN", "SASL_SSL/SCRAM-SHA-512", "SSL/client-certificate",
                                  "SASL_PLAINTEXT/OAUTHBEARER"])
async def test_each_security_mode_authenticates_as_its_principal(secure: LocalCluster, mode: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    conn = _connections(secure)[mode]
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    # Only the super user may create topics: success proves the broker saw User:admin (from the
    # SCRAM/PLAIN user, the certificate's CN or the token's subject).
    report = await apply(conn, [TopicSpec(topic, 1, 1, "output")])
    assert report.created == [topic]
    assert secure.security is not None
    assert secure.security.password(ADMIN).reveal() not in caplog.text


async def test_a_wrong_password_is_refused_and_never_shown(secure: LocalCluster,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Wr0ng-Hunter2-password"
    conn = Connection(secure.bootstrap, {"request_timeout_ms": 5000}, security_protocol="SASL_PLAINTEXT",
                      sasl_mechanism="SCRAM-SHA-512", sasl_username=ADMIN,
                      sasl_password=wrong)
    admin = clients.admin(conn)
    with pytest.raises(Exception) as info:
        await admin.start()
    await admin.close()
    assert "SaslAuthenticationFailed" in caplog.text  # the broker refused the credentials
    assert wrong not in str(info.value) and wrong not in repr(info.value) and wrong not in caplog.text


async def test_tls_refuses_a_broker_not_signed_by_the_configured_ca(secure: LocalCluster, tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    other_ca = tmp_path / "other-ca.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(tmp_path / "k"), "-out", str(other_ca), "-days", "1",
                    "-subj", "/CN=another CA"], check=True, capture_output=True)
    good = secure.connection(tls=True)
    bad = Connection(good.bootstrap, {"request_timeout_ms": 5000}, security_protocol="SASL_SSL",
                     sasl_mechanism="SCRAM-SHA-512", sasl_username=ADMIN, sasl_password=good.sasl_password,
                     ssl_cafile=str(other_ca))
    admin = clients.admin(bad)
    with pytest.raises(Exception, match="bootstrap"):
        await admin.start()
    await admin.close()
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


async def test_a_worker_runs_end_to_end_over_sasl_scram_and_leaks_no_password(
        secure: LocalCluster, tmp_path: Path) -> None:
    assert secure.security is not None
    password = secure.security.password(ADMIN).reveal()
    admin = secure.connection()
    ns = f"-sasl{uuid.uuid4().hex[:6]}"
    topic, events = f"pipelines.transitions{ns}", f"pipelines.events{ns}"
    await apply(admin, [TopicSpec(topic, 2, 1, "transition"),
                        TopicSpec(events, 1, 1, "output")])
    port, log = free_port(), tmp_path / "worker.log"
    # Security through STREAMSCHED_* variables only (the password too): what a container gets.
    env = {"STREAMSCHED_NAMESPACE": ns, "STREAMSCHED_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "STREAMSCHED_SASL_MECHANISM": "SCRAM-SHA-512", "STREAMSCHED_SASL_USERNAME": ADMIN,
           "STREAMSCHED_SASL_PASSWORD": password, "STREAMSCHED_LOG": "DEBUG",
           "STREAMSCHED_STATUS_PORT": str(port)}
    worker = WorkerProcess("consumers.pipelines:app", secure.bootstrap, env=env, log_path=log,
                           cwd=ROOT).start()
    try:
        n = 6
        await produce_events(admin, topic, [make_event("queued", "t", [f"p{i}"]) for i in range(n)])

        async def all_started() -> bool:
            return len(await read_topic(admin, events, timeout_s=10)) >= n

        await wait_for(all_started, timeout=90, what="pipeline.started events over SASL")
        started = [json.loads(r.value) for r in await read_topic(admin, events)]
        assert sorted(e["pipeline"] for e in started) == [f"p{i}" for i in range(n)]
        pages = [await asyncio.to_thread(_get, f"http://127.0.0.1:{port}{path}")
                 for path in ("/status", "/metrics", "/readyz")]
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_tail()
    text = log.read_text(errors="replace")
    assert "DEBUG" in text  # the worker logged at DEBUG, aiokafka included
    for shown in [text, *pages]:
        assert password not in shown


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:  # /readyz answers 503 while not ready: its body counts
        return str(exc.read().decode())


def test_cli_errors_never_show_the_password(secure: LocalCluster, tmp_path: Path) -> None:
    wrong = "Wr0ng-Hunter2-cli"
    env = {"STREAMSCHED_BOOTSTRAP": secure.bootstrap, "STREAMSCHED_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
           "STREAMSCHED_SASL_MECHANISM": "SCRAM-SHA-512", "STREAMSCHED_SASL_USERNAME": ADMIN,
           "STREAMSCHED_SASL_PASSWORD": wrong, "STREAMSCHED_CLIENT_OPTIONS": "request_timeout_ms=5000",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "streamsched", "emit", "some-topic", "--event",
                           '{"type":"due","tenant":"t","target":["x"]}'],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "Kafka is unreachable or refused the request" in proc.stderr
    assert wrong not in proc.stderr and wrong not in proc.stdout


async def test_the_admin_connection_file_works_from_the_cli(secure: LocalCluster,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert secure.security is not None
    admin_file = secure.security.write_client_file(secure.bootstrap, ADMIN)
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    await apply(secure.connection(), [TopicSpec(topic, 1, 1, "transition")])
    doc = '{"type":"due","tenant":"t","target":["x"]}'
    assert await asyncio.to_thread(main, ["emit", topic, "--event", doc, "--config", str(admin_file)]) == 0
    assert json.loads(capsys.readouterr().out)["offset"] == 0
    assert oct(admin_file.stat().st_mode & 0o777) == "0o600"


def test_tls_and_users_need_a_secured_broker(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag in (["--tls"], ["--user", "x"]):
        assert main(["broker", "start", "--data-dir", str(tmp_path), *flag]) == 2
        assert "need --security sasl" in capsys.readouterr().err
    assert not (tmp_path / "cluster.json").exists()  # nothing was started
