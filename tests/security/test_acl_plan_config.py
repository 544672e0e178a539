"""``acl plan --config FILE`` reads the cluster that file connects to: each planned binding says
whether the cluster holds it already, so the plan shows what ``acl apply --config FILE`` adds."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from streamsched.ops import acl
from streamsched.ops.broker import LocalCluster
from streamsched.ops.cli import main


async def test_acl_plan_with_a_config_file_says_which_bindings_the_cluster_holds(
        secure: LocalCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert secure.security is not None
    granted, missing = f"granted-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    # A principal of its own: other tests on this cluster judge User:service's exact ACLs.
    principal = f"User:planner-{uuid.uuid4().hex[:8]}"
    await acl.apply(secure.connection(), acl.plan_producer([granted], principal))
    admin_file = secure.security.write_client_file(secure.bootstrap, "admin")
    argv = ["acl", "plan", "--role", "producer", "--topic", granted, "--topic", missing,
            "--principal", principal, "--config", str(admin_file)]

    assert await _main([*argv, "-o", "json"]) == 0
    held = {(d["resource_name"], d["operation"]): d["held"] for d in json.loads(capsys.readouterr().out)}
    assert held == {(granted, "WRITE"): True, (granted, "DESCRIBE"): True,
                    (missing, "WRITE"): False, (missing, "DESCRIBE"): False}

    assert await _main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["PRINCIPAL", "RESOURCE", "PATTERN", "NAME", "OPERATION", "HELD", "WHY"]
    assert sorted(line.split()[3:6] for line in table[1:]) == sorted(
        [[granted, "DESCRIBE", "yes"], [granted, "WRITE", "yes"],
         [missing, "DESCRIBE", "no"], [missing, "WRITE", "no"]])


async def _main(argv: list[str]) -> int:
    return await asyncio.to_thread(main, argv)  # main() runs its own event loop
