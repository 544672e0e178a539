"""The Dockerfile, compose.yaml and deploy/kubernetes/, checked without a Docker engine or a
Kubernetes cluster (neither is on the project's machines): the files parse, every streamsched
command in them parses with the real CLI (and its MODULE:ATTR imports), images are pinned, the
entrypoint is exec form, containers run as non-root with readiness checks, and the grace periods
exceed the worker's drain deadline."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamsched.ops import cli
from streamsched.worker.intake import WorkerConfig, worker_config_from_env

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
OUR_IMAGE = re.compile(r"^streamsched:\d+\.\d+\.\d+$")
PINNED = re.compile(r"^[a-z0-9./_-]+:\d+\.\d+\.\d+[A-Za-z0-9._-]*$")
"""An image with a full version tag (never ``latest`` nor a floating ``3.11``)."""
DRAIN_S = WorkerConfig(bootstrap="x").shutdown_deadline_s


def check_command(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """``argv`` as the image's ``streamsched`` entrypoint gets it: it parses, and the apps it
    names import (from the layout the image has: /app with consumers/ and topics/)."""
    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse refused it
        raise AssertionError(f"{argv} does not parse (exit {exc.code})") from None
    monkeypatch.chdir(ROOT)
    app = getattr(args, "app", None)
    refs = [app] if isinstance(app, str) else list(app or [])
    for ref in refs:
        assert cli.load_app(ref).schedulers, ref
    if args.fn is cli.cmd_schedule and args.action == "add":
        assert args.name and args.spec and args.target, argv
    if args.fn is cli.cmd_emit:
        cli.event_from_json(json.loads(args.event))
    return args


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in (ROOT / "Dockerfile").read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def image_store_dir() -> str:
    """Where the image's workers keep their claim stores (its STREAMSCHED_STORE_DIR)."""
    store = re.search(r"STREAMSCHED_STORE_DIR=(\S+)", (ROOT / "Dockerfile").read_text())
    assert store is not None
    return store.group(1)


def k8s_docs() -> list[dict[str, Any]]:
    return [d for path in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(path.read_text()) if d]


# --- Dockerfile -----------------------------------------------------------------------------------

def test_dockerfile_is_multi_stage_non_root_exec_form_without_an_image_wide_healthcheck() -> None:
    steps = dockerfile()
    words = [w for w, _ in steps]
    args = {w: [a for x, a in steps if x == w] for w in words}
    default_image = re.search(r"PYTHON_IMAGE=(\S+)", " ".join(args["ARG"]))
    assert default_image and PINNED.match(default_image.group(1)), args["ARG"]
    assert len(args["FROM"]) >= 2 and any(" AS build" in f for f in args["FROM"])
    # The wheel is built in the first stage and installed, offline, in the last.
    assert any(re.search(r"pip wheel .*--wheel-dir /wheels \.", r) for r in args["RUN"])
    offline = r"pip install .*--no-index --find-links /wheels streamsched"
    assert any(re.search(offline, r) for r in args["RUN"])
    last_from = max(i for i, w in enumerate(words) if w == "FROM")
    user = [a for w, a in steps[last_from:] if w == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    entrypoint = json.loads(args["ENTRYPOINT"][-1])  # exec form: a JSON array, no shell
    assert entrypoint == ["streamsched"]
    # A relay or one-shot command from the image serves no /readyz: the check is per service.
    assert "HEALTHCHECK" not in args
    for copy in args["COPY"]:
        if "--from" not in copy:
            for src in copy.split()[:-1]:
                assert (ROOT / src).exists(), src  # everything copied is in the repo
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignored and {"!streamsched/", "!schemas/", "!consumers/", "!topics/"} <= set(ignored)


# --- compose --------------------------------------------------------------------------------------

def test_compose_parses_and_every_command_parses_with_the_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = doc["services"]
    assert {"kafka", "topics", "due_runs", "pipelines", "ticker"} <= set(services)
    ours = {n: s for n, s in services.items() if OUR_IMAGE.match(str(s.get("image", "")))}
    assert set(ours) == {"topics", "due_runs", "pipelines", "ticker"}
    for name, svc in ours.items():
        command = svc["command"]
        assert isinstance(command, list), f"{name}: exec form, no shell"  # PID 1 is streamsched
        args = check_command(command, monkeypatch)
        assert svc["environment"]["STREAMSCHED_BOOTSTRAP"] == "kafka:9092"
        if name != "topics":  # the long-running services: status published, graceful stop
            assert re.fullmatch(r"127\.0\.0\.1:\d+:9464", svc["ports"][0]), name
            assert float(svc["stop_grace_period"].removesuffix("s")) > DRAIN_S
            assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully"
            assert args.fn in (cli.cmd_run, cli.cmd_schedule)
            probe = svc["healthcheck"]["test"]
            assert probe[:3] == ["CMD", "python", "-c"] and "127.0.0.1:9464/readyz" in probe[3], name
        else:  # serves no status: no probe that could only fail
            assert svc["healthcheck"] == {"disable": True}
    assert services["ticker"]["command"][:2] == ["schedule", "tick"]
    assert services["topics"]["depends_on"]["kafka"]["condition"] == "service_healthy"
    kafka = services["kafka"]
    assert "HOST://localhost:29092" in kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert kafka["ports"] == ["127.0.0.1:29092:29092"]
    assert isinstance(kafka["healthcheck"]["test"], list)
    # The data volume is where the broker writes (the image's own default is under /tmp).
    data = [v.split(":")[1] for v in kafka["volumes"] if v.split(":")[0] in doc["volumes"]]
    assert data == [kafka["environment"]["KAFKA_LOG_DIRS"]]
    # The topics job also creates the ticker's catalog: nothing else may create topics.
    catalog = services["ticker"]["command"][services["ticker"]["command"].index("--catalog") + 1]
    topics_cmd = services["topics"]["command"]
    assert topics_cmd[topics_cmd.index("--catalog") + 1] == catalog


def test_the_documented_compose_commands_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.docs.pages import pages

    text = (ROOT / "compose.yaml").read_text() + "".join(pages().values())
    runs = re.findall(r"docker compose run --rm (\w+) (.+)", text)
    assert len(runs) >= 2
    for _service, rest in runs:
        check_command(shlex.split(rest.split("  #")[0]), monkeypatch)


def test_images_are_pinned() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    images = [s["image"] for s in compose["services"].values()]
    for doc in k8s_docs():
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        images += [c["image"] for c in spec.get("containers", [])]
    assert images and all(PINNED.match(i) for i in images), images
    # The version lives in streamsched/__init__.py alone: every image tag of ours follows it.
    import streamsched

    ours = [i for i in images if OUR_IMAGE.match(i)]
    tagged = re.findall(r"streamsched:(\d+\.\d+\.\d+)", (ROOT / "Dockerfile").read_text())
    assert ours and {i.split(":")[1] for i in ours} | set(tagged) == {streamsched.__version__}, ours
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and "\nversion =" not in pyproject.split("[tool.")[0]
    from streamsched.ops import broker

    tested = {broker.KAFKA_VERSION, *getattr(broker, "TESTED_KAFKA_VERSIONS", ())}
    kafka = compose["services"]["kafka"]["image"]
    assert kafka.startswith("apache/kafka:") and kafka.split(":")[1] in tested, kafka


# --- Kubernetes -----------------------------------------------------------------------------------

def test_kubernetes_example_probes_grace_and_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = k8s_docs()
    kustomization = next(d for d in docs if d["kind"] == "Kustomization")
    assert all((K8S / r).exists() for r in kustomization["resources"])
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    jobs = [d for d in docs if d["kind"] == "Job"]
    assert len(workloads) >= 2 and jobs
    for d in workloads:
        pod = d["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] > DRAIN_S + 5, d["metadata"]["name"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        (container,) = pod["containers"]
        args = check_command(container["args"], monkeypatch)
        port = next(p for p in container["ports"] if p["name"] == "status")["containerPort"]
        assert args.status_port == port and args.status_host == "0.0.0.0"
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "status"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "status"}
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        env = {e["name"] for e in container.get("env", [])}
        assert "STREAMSCHED_SASL_PASSWORD" not in env  # secrets come from mounted files
        assert args.no_create_topics, f"{d['metadata']['name']}: least authority, the job creates topics"
        if args.fn is cli.cmd_run:  # claims on disk: the root filesystem is read-only, so a volume
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert image_store_dir() in mounts, d["metadata"]["name"]
    for job in jobs:
        (container,) = job["spec"]["template"]["spec"]["containers"]
        job_args = check_command(container["args"], monkeypatch)
        assert job_args.catalog == ["default"]  # the ticker's catalog: it may not create it


def test_kubernetes_group_members_are_statefulsets_with_static_membership(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every long-running group member (the workers, the ticker) is a StatefulSet whose pod name
    is its instance id, behind the headless Service it names, with a session timeout that
    outlasts a pod's replacement and a budget of one voluntary disruption; a worker's claim
    stores are on a volume claim of its own, so a restarted pod restores warm."""
    docs = k8s_docs()

    def named(kind: str) -> dict[str, dict[str, Any]]:
        return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}

    sets, services, budgets = named("StatefulSet"), named("Service"), named("PodDisruptionBudget")
    assert {"due-runs", "ticker"} <= set(sets) and not named("Deployment")
    for name, workload in sets.items():
        spec = workload["spec"]
        service = services[spec["serviceName"]]["spec"]
        assert service["clusterIP"] == "None" and service["selector"] == spec["selector"]["matchLabels"]
        assert spec["podManagementPolicy"] == "Parallel" and spec["updateStrategy"]["type"] == "RollingUpdate"
        assert budgets[name]["spec"] == {"maxUnavailable": 1, "selector": spec["selector"]}
        (container,) = spec["template"]["spec"]["containers"]
        env = {e["name"]: e for e in container["env"]}
        assert env["STREAMSCHED_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
        # What the process makes of the pod's environment (a pod name is a valid instance id).
        monkeypatch.setenv("STREAMSCHED_INSTANCE_ID", f"{name}-0")
        monkeypatch.setenv("STREAMSCHED_SESSION_TIMEOUT", env["STREAMSCHED_SESSION_TIMEOUT"]["value"])
        config = worker_config_from_env("kafka:9092", store_dir=":memory:")
        assert config.instance_id == f"{name}-0"
        # Above a pod's replacement; within the broker's default group.max.session.timeout.ms.
        assert 30_000 <= config.session_timeout_ms <= 1_800_000, name
        args = cli.build_parser().parse_args(container["args"])
        if args.fn is cli.cmd_run:
            claims = {t["metadata"]["name"] for t in spec["volumeClaimTemplates"]}
            store = next(m for m in container["volumeMounts"] if m["mountPath"] == image_store_dir())
            assert store["name"] in claims, name  # not an emptyDir: it outlives the pod


def test_the_autoscaling_example_is_opt_in_and_bounded_by_the_partitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The HorizontalPodAutoscaler is not applied by default (it needs prometheus-adapter), scales
    a StatefulSet of workers on the declared lag gauge, and never past the partition count."""
    from streamsched.kafka.admin import load_dir
    from streamsched.metrics import METRICS, PREFIX

    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert "autoscaling-example.yaml" not in kustomization["resources"]
    (hpa,) = yaml.safe_load_all((K8S / "autoscaling-example.yaml").read_text())
    assert hpa["kind"] == "HorizontalPodAutoscaler"
    target = hpa["spec"]["scaleTargetRef"]
    workload = next(d for d in k8s_docs() if d["kind"] == target["kind"] == "StatefulSet"
                    and d["metadata"]["name"] == target["name"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == PREFIX + "lag" and METRICS["lag"].type == "gauge"
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    args = check_command(container["args"], monkeypatch)
    partitions = {t.name: t.partitions for t in load_dir(ROOT / "topics")}
    topics = {s.topic for s in cli.load_app(args.app).schedulers.values()}
    assert hpa["spec"]["minReplicas"] >= 1
    assert hpa["spec"]["maxReplicas"] <= min(partitions[t] for t in topics)


def test_the_deployment_page_says_what_was_checked_where() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page[page.index("## What was checked where"):].split("\n## ", 1)[0]
    for needle in ("tests/ops/test_deploy.py", "Docker", "Kubernetes"):
        assert needle in section, needle
    for needle in ("deploy/kubernetes", "docker compose up"):  # what the page says it covers
        assert needle in page, needle
