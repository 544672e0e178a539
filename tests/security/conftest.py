"""One secured local broker per session for the security tests (SASL, authorizer, TLS).

Started by the tests themselves with :class:`LocalCluster` in SASL mode: SCRAM users created at
format time, the StandardAuthorizer, ``admin`` the only super user, SASL_SSL and client-certificate
SSL listeners with a CA the project made. OAUTHBEARER with Kafka's unsecured validator is on too,
for the token-hook test only (never a default of ``broker start``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from streamsched.ops.broker import LocalCluster
from streamsched.ops.broker_security import BrokerSecurity

USERS = ("pipelines", "due_runs", "reports", "other", "intruder", "ticker", "service", "operator", "mirror")
"""pipelines, due_runs, reports: the reference workflows' roles; other: another scheduler;
intruder: a principal with no ACL at all; ticker: a schedule ticker's role; service: a service
producer's role; operator: who inspects and re-drives a scheduler; mirror: MirrorMaker 2 reading
the primary (tests/security/test_acl_dr.py)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "secure" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)


@pytest.fixture(scope="session")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    data = tmp_path_factory.mktemp("secure-kafka")
    security = BrokerSecurity.create(data / "security", USERS, tls=True, oauth_unsecured=True)
    cluster = LocalCluster(data_dir=data, security=security)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
