"""deploy/grafana/streamsched.json and deploy/prometheus/streamsched-alerts.yml: importable, checked
by Prometheus' own promtool (rules and their unit tests, and every dashboard query parsed), and
using only metric names that a real worker and ticker serve or that streamsched.metrics declares
(the last one on a real broker)."""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from components import require_program
from prom_text import parse_prometheus

from streamsched.kafka.admin import TopicSpec, apply
from streamsched.metrics import METRICS, Declared, Metrics
from streamsched.ops.status import StatusServer
from streamsched.schedules.catalog import Catalog
from streamsched.schedules.ticker import Ticker, TickerConfig
from streamsched.testing import make_event, produce_events, running, running_worker, wait_drained, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "streamsched.json"
PROM = ROOT / "deploy" / "prometheus"
RULES = PROM / "streamsched-alerts.yml"
RULE_TESTS = PROM / "streamsched-alerts.test.yml"
METRIC = re.compile(r"\bstreamsched_[a-z0-9_]+\b")
SELECTOR = re.compile(r"\b(streamsched_[a-z0-9_]+)(\{[^}]*\})?(\[[^]]*\])?")
SAMPLES: dict[str, Declared] = {s: d for d in METRICS.values() for s in d.samples}
"""Declared sample names (``streamsched_claims_total``, ``..._bucket``) -> their declaration."""


def dashboard() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return doc


def panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in panels(dashboard()) for t in p.get("targets", [])]


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def names(exprs: list[str]) -> set[str]:
    return {m for e in exprs for m in METRIC.findall(e)}


def promtool() -> str:
    return require_program("promtool", "`make promtool` installs it (Debian package `prometheus`)")


def run_promtool(*args: str | Path) -> str:
    proc = subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120,
                          cwd=PROM, check=False)
    assert proc.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


# --- the dashboard --------------------------------------------------------------------------------


def test_dashboard_is_importable_with_datasource_and_scheduler_variables() -> None:
    doc = dashboard()
    assert doc["title"] and doc["uid"] == "streamsched" and "id" not in doc  # import assigns the id
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    source, sched = variables["datasource"], variables["scheduler"]
    assert source["type"] == "datasource" and source["query"] == "prometheus"
    assert sched["type"] == "query" and sched["datasource"]["uid"] == "${datasource}"
    assert sched["query"]["query"].startswith("label_values(streamsched_")
    assert sched["multi"] and sched["includeAll"]
    ids = [p["id"] for p in panels(doc)]
    assert len(ids) == len(set(ids))
    for p in panels(doc):
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"], p["title"]


def test_every_dashboard_query_is_filtered_by_the_scheduler_variable() -> None:
    for expr in dashboard_exprs():
        for name, labels, _ in SELECTOR.findall(expr):
            assert 'scheduler=~"$scheduler"' in labels, f"{name} in {expr!r}"


def test_dashboard_shows_what_an_operator_needs() -> None:
    used = names(dashboard_exprs())
    for sample in ["streamsched_lag", "streamsched_records_total", "streamsched_executions_total",
                   "streamsched_turn_seconds_bucket", "streamsched_end_txn_seconds_bucket",
                   "streamsched_commit_after_planned_seconds_bucket", "streamsched_dead_lettered_total",
                   "streamsched_retries_total", "streamsched_retries_parked_total",
                   "streamsched_fenced_total",
                   "streamsched_stuck_transactions_total", "streamsched_restore_remaining",
                   "streamsched_restore_seconds_bucket", "streamsched_partition_given_up",
                   "streamsched_partition_stopped", "streamsched_occurrences_fired_total",
                   "streamsched_late_plans_total", "streamsched_ready"]:
        assert sample in used, sample
    quantiles = [e for e in dashboard_exprs() if "histogram_quantile(" in e]
    assert quantiles and all("_bucket{" in e and "le)" in e for e in quantiles)


def test_dashboard_and_rules_use_declared_names_with_their_type_suffix() -> None:
    """A counter is queried as ``_total``, a gauge bare, a histogram as ``_bucket``/``_sum``/``_count``."""
    unknown = names(dashboard_exprs()) - set(SAMPLES)
    assert not unknown, f"dashboard uses undeclared or mis-suffixed metrics: {sorted(unknown)}"
    unknown = names([r["expr"] for r in rules()]) - set(SAMPLES)
    assert not unknown, f"alert rules use undeclared or mis-suffixed metrics: {sorted(unknown)}"


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query, with Grafana's variables filled in, as a recording rule promtool parses."""
    exprs = [e.replace("$__rate_interval", "5m").replace("$scheduler", ".+") for e in dashboard_exprs()]
    doc = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"streamsched_dashboard:query{i}", "expr": e} for i, e in enumerate(exprs)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(doc))
    assert f"SUCCESS: {len(exprs)} rules found" in run_promtool("check", "rules", path)


# --- the alert rules ------------------------------------------------------------------------------


def test_alert_rules_check() -> None:
    assert f"SUCCESS: {len(rules())} rules found" in run_promtool("check", "rules", RULES)


def test_alert_rules_unit_tests() -> None:
    out = run_promtool("test", "rules", RULE_TESTS)
    assert "SUCCESS" in out
    tested = {t["alertname"] for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert tested == {r["alert"] for r in rules()}, "every alert has a unit test that fires it"


def test_alert_rules_cover_the_failures_and_tell_what_to_run() -> None:
    all_rules = rules()
    by_metric = names([r["expr"] for r in all_rules])
    for sample in ["streamsched_lag", "streamsched_partition_stopped", "streamsched_dead_lettered_total",
                   "streamsched_stuck_transactions_total", "streamsched_restore_remaining",
                   "streamsched_late_plans_total", "streamsched_commit_after_planned_seconds_bucket",
                   "streamsched_ready", "streamsched_partition_given_up"]:
        assert sample in by_metric, sample
    for r in all_rules:
        assert r["alert"].startswith("Streamsched") and r["labels"]["severity"] in {"warning", "critical"}
        notes = r["annotations"]
        assert {"summary", "description", "runbook"} <= set(notes), r["alert"]
        assert "streamsched " in notes["runbook"], f"{r['alert']}: the runbook names a command to run"


# --- against a real worker and ticker -------------------------------------------------------------


async def test_dashboard_and_rules_use_only_served_or_declared_metrics(
        bootstrap: str, make_topic: Any, recording_scheduler: Any) -> None:
    topic = await make_topic("dash", partitions=2)
    rec = recording_scheduler(topic)
    events = [make_event("due", "t", [f"r{i}"]) for i in range(8)]
    await produce_events(bootstrap, topic, events, raw=[(b"k", b"\x00not avro")])  # one dead letter
    catalog = Catalog(bootstrap, f"dash-{uuid.uuid4().hex[:8]}", partitions=1)
    await catalog.ensure_topics()
    target = f"occ-{uuid.uuid4().hex[:8]}"
    await apply(bootstrap, [TopicSpec(target, 1)])
    await catalog.schedule("every-second", "@every 1s", target)
    ticker = Ticker(catalog, TickerConfig(bootstrap=bootstrap, session_timeout_ms=6000))
    async with running_worker(rec.sched, bootstrap) as worker, running(ticker):
        server = StatusServer([worker.metrics, ticker.metrics], port=0,
                              ready=lambda: worker.ready and ticker.ready)
        async with server:
            await wait_drained(bootstrap, rec.sched.group, topic, timeout=90)

            async def fired() -> bool:
                return ticker.metrics.counters.get("occurrences_fired", 0) >= 2

            await wait_for(fired, timeout=60, what="the ticker to fire twice")
            async with (aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s,
                        s.get(server.url + "/metrics") as resp):
                assert resp.status == 200
                text = await resp.text()
    families = parse_prometheus(text)
    served = {s[0] for fam in families.values() for s in fam["samples"]}
    # What a worker serves is declared, with the type it is declared with (a counter's family is
    # named with its _total in the text format).
    for family, fam in families.items():
        name = family.removeprefix("streamsched_")
        d = METRICS.get(name.removesuffix("_total") if fam["type"] == "counter" else name)
        assert d is not None, f"{family} is served but not declared in streamsched.metrics"
        assert fam["type"] == d.type, family
    for sample in ["streamsched_executions_total", "streamsched_lag", "streamsched_turn_seconds_bucket",
                   "streamsched_dead_lettered_total", "streamsched_ready", "streamsched_restore_remaining",
                   "streamsched_occurrences_fired_total", "streamsched_commit_after_planned_seconds_bucket"]:
        assert sample in served, sample
    assert {s[1]["scheduler"]: float(s[2]) for s in families["streamsched_ready"]["samples"]} == {
        rec.sched.name: 1.0, ticker.metrics.scheduler: 1.0}
    for what, used in [("dashboard", names(dashboard_exprs())),
                       ("alert rules", names([r["expr"] for r in rules()]))]:
        unknown = used - served - set(SAMPLES)
        assert not unknown, f"the {what} use metrics neither served nor declared: {sorted(unknown)}"


async def test_metrics_page_serves_readiness_as_the_ready_gauge() -> None:
    """What /readyz answers, as a gauge an alert can watch: set on every scrape, per scheduler."""
    ready = False
    a, b = Metrics("a"), Metrics("b")
    async with (StatusServer([a, b], port=0, ready=lambda: ready) as server,
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s):

        async def scrape() -> dict[str, float]:
            async with s.get(server.url + "/metrics") as resp:
                fam = parse_prometheus(await resp.text())["streamsched_ready"]
            assert fam["type"] == "gauge"
            return {x[1]["scheduler"]: float(x[2]) for x in fam["samples"]}

        assert await scrape() == {"a": 0.0, "b": 0.0}
        ready = True
        assert await scrape() == {"a": 1.0, "b": 1.0}
