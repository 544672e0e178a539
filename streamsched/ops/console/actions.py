"""The console's actions: re-drive an identity, enable, disable, pause or resume a schedule, replay a
scheduler's dead letters, pause or resume a scheduler. Each is a POST form that must carry the
page's CSRF token and a bearer token (the form's token field or an ``Authorization: Bearer``
header); without ``--allow-actions`` every one is refused (403) and the pages show no buttons.

Each action is logged, refused or done, with its principal (the token's label) and never the
token; a re-drive's audit entry and a pause record name the same principal.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from streamsched.errors import ConfigError
from streamsched.model.names import validate_name
from streamsched.ops.console import security, views
from streamsched.ops.console.state import STATE, State
from streamsched.ops.inspect import check_identity

log = logging.getLogger("streamsched.console")

MAX_REASON = 200
MAX_REPLAY = 10_000
Render = Callable[..., web.Response]
Form = Any


async def authorize(request: web.Request, state: State, action: str) -> tuple[str, Form]:
    """The principal and the form of an allowed action; raises 403 otherwise."""
    if not state.config.allow_actions:
        log.warning("console action %s refused: actions are off", action)
        raise web.HTTPForbidden(text="actions are off: the console was started without --allow-actions")
    form = await request.post()
    if not security.csrf_ok(request.cookies.get(security.CSRF_COOKIE), str(form.get("csrf", ""))):
        log.warning("console action %s refused: no matching CSRF token", action)
        raise web.HTTPForbidden(text="this form is not from this console's page (CSRF): reload the page")
    presented = security.bearer(request.headers.get("Authorization")) or str(form.get("token", ""))
    who = security.principal(state.config.tokens, presented) if presented else None
    if who is None:
        log.warning("console action %s refused: no valid token", action)
        raise web.HTTPForbidden(text="a valid console token is needed for actions")
    return who, form


def _field(form: Form, name: str, limit: int = 300) -> str:
    value = form.get(name, "")
    if not isinstance(value, str):
        raise ConfigError(f"form field {name} must be text")
    if len(value) > limit:
        raise ConfigError(f"form field {name} is longer than {limit} characters")
    return value.strip()


def add_routes(app: web.Application, render: Render) -> None:
    async def redrive_action(request: web.Request) -> web.Response:
        from streamsched.ops import redrive

        state = request.app[STATE]
        who, form = await authorize(request, state, "redrive")
        sched = views.pick(state.config.schedulers, _field(form, "scheduler"))
        identity = check_identity(_field(form, "identity"))
        reason = _field(form, "reason", MAX_REASON)
        report = await redrive.redrive(state.config.bootstrap, sched, [redrive.Target(identity)],
                                       reason=reason, principal=who, progress=False)
        result = "requested" if report.requested else f"refused ({', '.join(sorted(report.refused))})"
        log.info("console action redrive scheduler=%s identity=%s by %s: %s", sched.name, identity, who,
                 result)
        return render(request, "result.html", title="Re-drive", principal=who,
                      lines=[f"scheduler {sched.name}", f"identity {identity}", f"re-drive {result}",
                             "the owner applies the request; the identity page shows its audit entry"])

    async def schedule_action(request: web.Request) -> web.Response:
        state = request.app[STATE]
        who, form = await authorize(request, state, "schedule")
        catalog_name, name, op = _field(form, "catalog"), _field(form, "name"), _field(form, "op")
        if catalog_name not in state.config.catalogs:
            raise ConfigError("not a catalog of this console")
        if op not in ("enable", "disable", "pause", "resume"):
            raise ConfigError("op must be enable, disable, pause or resume")
        validate_name(name, "schedule")
        catalog = await views.catalog_of(state.config.bootstrap, catalog_name)
        if catalog is None:
            raise ConfigError(f"catalog {catalog_name} has no topics on this cluster")
        if op in ("pause", "resume"):
            # A schedule that is not there, disabled or ended is a ConfigError: one line, 400.
            receipt = await (catalog.pause(name, reason=_field(form, "reason", MAX_REASON)) if op == "pause"
                             else catalog.resume(name))
            found = True
            done = receipt.request_id
            result = f"{op} requested (request {done})" if done else f"{op}d already"
        else:
            found = await (catalog.enable(name) if op == "enable" else catalog.disable(name))
            result = f"{op}d" if found else "no such schedule"
        log.info("console action schedule %s catalog=%s name=%s by %s: %s", op, catalog_name, name, who,
                 result)
        return render(request, "result.html", status=200 if found else 404, title=f"Schedule {op}",
                      principal=who, lines=[f"catalog {catalog_name}", f"schedule {name}: {result}"])

    async def replay_action(request: web.Request) -> web.Response:
        from streamsched.ops.dlq import replay

        state = request.app[STATE]
        who, form = await authorize(request, state, "dlq-replay")
        sched = views.pick(state.config.schedulers, _field(form, "scheduler"))
        kind = _field(form, "kind", 64) or None
        try:
            limit = int(_field(form, "limit", 8) or "1000")
        except ValueError:
            raise ConfigError("limit must be a number") from None
        if not 1 <= limit <= MAX_REPLAY:
            raise ConfigError(f"limit must be 1..{MAX_REPLAY}")
        dry_run = _field(form, "dry_run", 8) == "on"
        report = await replay(state.config.bootstrap, sched.dead_letter_topic,
                              kinds={kind} if kind else None, limit=limit, dry_run=dry_run)
        doc = report.to_dict()
        log.info("console action dlq-replay scheduler=%s kind=%s limit=%d dry_run=%s by %s: replayed %d",
                 sched.name, kind or "any", limit, dry_run, who, report.replayed)
        lines = [f"scheduler {sched.name}", f"dead-letter topic {report.dlq_topic}",
                 f"{'would replay' if dry_run else 'replayed'} {report.replayed}",
                 f"skipped {doc['skipped'] or 'none'}", f"already replayed {report.already_replayed}",
                 f"unreplayable {doc['unreplayable'] or 'none'}", f"scanned {report.scanned}"]
        if report.limited:
            lines.append("stopped at the limit: replay again to go on")
        return render(request, "result.html", title="Dead-letter replay", principal=who, lines=lines)

    async def pause_action(request: web.Request) -> web.Response:
        from streamsched.ops.pause import request_pause

        state = request.app[STATE]
        who, form = await authorize(request, state, "pause")
        sched = views.pick(state.config.schedulers, _field(form, "scheduler"))
        op = _field(form, "op")
        if op not in ("pause", "resume"):
            raise ConfigError("op must be pause or resume")
        reason = _field(form, "reason", MAX_REASON)
        if op == "pause" and not reason:  # as the CLI's --reason: the audit trail says why
            raise ConfigError("a pause needs a reason")
        record = await request_pause(state.config.bootstrap, sched.name, paused=op == "pause",
                                     reason=reason, principal=who)
        log.info("console action %s scheduler=%s request=%s by %s: requested", op, sched.name,
                 record.request, who)
        return render(request, "result.html", title=f"Scheduler {op}", principal=who,
                      lines=[f"scheduler {sched.name}", f"{op} requested (request {record.request})",
                             "every worker of the scheduler follows it once it reads it: "
                             + ("no new claims; claimed items finish" if record.paused
                                else "it takes new work again"),
                             "the schedulers page shows the state"])

    app.router.add_post("/actions/redrive", redrive_action)
    app.router.add_post("/actions/pause", pause_action)
    app.router.add_post("/actions/schedule", schedule_action)
    app.router.add_post("/actions/dlq-replay", replay_action)
