"""The other reference workflows under their own principals (the ``pipelines`` role, and the
broker's refusals, are in test_acl_roles.py): ``due_runs`` (an external command: claim before
effect, a SQLite ledger) and ``reports`` (Kafka-native, a schedule's target) each run end to end
as their own SCRAM user holding exactly the ACLs ``acl plan`` prints, applied with ``acl apply``,
with topic creation off; every event executes once and the broker refused nothing.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from role_support import cli, load_reference, plan_keys

from consumers.harness import claim_history, judge_calls, ledger_calls, timed_claim_history
from consumers.ledger import Ledger
from streamsched.kafka.admin import TopicSpec, apply
from streamsched.kafka.reads import read_topic
from streamsched.ops import acl
from streamsched.ops.broker import LocalCluster
from streamsched.testing import ROOT, WorkerProcess, make_event, produce_events, wait_for

EVENTS = 8


@pytest.mark.parametrize(("workflow", "event_type"), [("due_runs", "due"), ("reports", "report")])
async def test_a_reference_workflow_runs_end_to_end_with_exactly_its_planned_acls(
        secure: LocalCluster, tmp_path: Path, workflow: str, event_type: str) -> None:
    assert secure.security is not None
    ns = f"-acl{uuid.uuid4().hex[:6]}"
    env = {"STREAMSCHED_NAMESPACE": ns, "STREAMSCHED_LEDGER": str(tmp_path / "ledger.sqlite3")}
    module = load_reference(workflow, env)
    (s,) = module.app.schedulers.values()
    principal, app_ref = f"User:{workflow}", f"consumers.{workflow}:app"
    admin = secure.connection()
    # The operator's job: every topic, created beforehand (the role has no CREATE).
    await apply(admin, [TopicSpec(s.topic, 2, 1, "transition"), TopicSpec(s.state_topic, 2, 1, "state"),
                        TopicSpec(s.dead_letter_topic, 2, 1, "dead_letter"),
                        TopicSpec(s.delay_topic, 2, 1, "delay"),
                        *(TopicSpec(t, 1, 1, "output") for t in sorted(s.outputs))])
    admin_file = secure.security.write_client_file(secure.bootstrap, "admin")
    role = ["--app", app_ref, "--principal", principal]
    applied = cli(["acl", "apply", *role, "--config", str(admin_file)], env)
    assert applied.returncode == 0, applied.stderr
    planned = cli(["acl", "plan", *role, "-o", "json"], env)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    held = await acl.describe(admin, principal)
    assert sorted(a.key() for a in held) == plan_keys(plan)  # exactly the plan
    assert not {d["operation"] for d in plan} & {"CREATE", "ALTER", "ALTER_CONFIGS", "DELETE", "ALL"}

    log = tmp_path / "worker.log"
    config = secure.security.write_client_file(secure.bootstrap, workflow)
    worker = WorkerProcess(app_ref, secure.bootstrap, log_path=log, cwd=ROOT,
                           env={**env, "STREAMSCHED_CONFIG": str(config)},
                           command=["run", "--app", app_ref, "--no-create-topics"]).start()
    targets = [f"{workflow}-{i}" for i in range(EVENTS)]
    try:
        await produce_events(admin, s.topic, [make_event(event_type, "t", [t]) for t in targets])

        async def effects() -> list[str]:
            assert worker.alive(), worker.log_tail()
            if workflow == "due_runs":
                ledger = Path(env["STREAMSCHED_LEDGER"])
                if not ledger.exists():
                    return []
                return [run_id for _idem, run_id, _fence in Ledger(ledger).effects()]
            (events_topic,) = s.outputs
            return [json.loads(r.value)["idempotency_key"]
                    for r in await read_topic(admin, events_topic, timeout_s=10)]

        async def done() -> bool:
            return len(await effects()) >= EVENTS

        await wait_for(done, timeout=120, what=f"{workflow} to run every event under its own principal")
        got = await effects()
        assert len(got) == len(set(got)) == EVENTS  # each exactly once
        if workflow == "due_runs":
            assert sorted(got) == sorted(targets)
            # Only accepted calls: the external command never saw a stale fence.
            ledger = Path(env["STREAMSCHED_LEDGER"])
            assert all(accepted for _idem, _fence, accepted in Ledger(ledger).calls())
            # Executed once each: the effects table keeps one row per key, so count the calls,
            # and judge them against the outcomes the state topic stored.
            async def stored() -> bool:  # the outcomes commit just after the ledger's calls
                history = await claim_history(admin, s.state_topic)
                return sum(1 for states in history.values() if states[-1].outcome is not None) >= EVENTS

            await wait_for(stored, timeout=60, what="every outcome stored")
            judged = judge_calls(ledger_calls(ledger), *await timed_claim_history(admin, s.state_topic))
            assert sorted(judged.calls.values()) == [1] * EVENTS, judged
            assert judged.after_outcome == {} and judged.unbacked == [], judged
    finally:
        code = worker.terminate()
    assert code == 0, worker.log_tail()
    assert "AuthorizationFailed" not in log.read_text(errors="replace")
