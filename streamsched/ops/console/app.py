"""The console's web server: aiohttp routes rendering Jinja2 templates, the guards around them
(:mod:`.security`), the sampler task and the actions (:mod:`.actions`).

Pages read Kafka when asked (the overview reads the sampler's ring instead). Actions exist only
with ``allow_actions``; each needs the page's CSRF token and a bearer token, and is logged with
the token's label as principal.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from streamsched.errors import StreamschedError
from streamsched.ops.console import actions, charts, security, views, workers
from streamsched.ops.console.errors import safe_error
from streamsched.ops.console.sampler import Sampler
from streamsched.ops.console.state import STATE, ConsoleConfig, State
from streamsched.wire.dead_letter import safe_text

log = logging.getLogger("streamsched.console")

DEAD_LETTERS_SHOWN = 100
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_CSRF: contextvars.ContextVar[str] = contextvars.ContextVar("console_csrf", default="")
"""The CSRF token of the request being handled (the guard sets it, the templates' forms carry it)."""




def _when(ns: int | None) -> str:
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ns / 1e9)) + "Z"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("streamsched.ops.console", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      undefined=StrictUndefined)
    env.filters["when"] = _when
    env.filters["safe_text"] = safe_text
    return env


def render(request: web.Request, template: str, *, status: int = 200, **ctx: Any) -> web.Response:
    state = request.app[STATE]
    html = state.env.get_template(template).render(
        csrf=_CSRF.get(), actions=state.config.allow_actions, path=request.path,
        schedulers=[s.name for s in state.config.schedulers], catalogs=list(state.config.catalogs),
        sampler_error=state.sampler.last_error, **ctx)
    return web.Response(text=html, status=status, content_type="text/html")


# --- middleware -----------------------------------------------------------------------------------

@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = request.app[STATE]
    if not security.host_allowed(request.headers.get("Host"), state.config.host):
        return web.Response(status=421, text="this console answers to its loopback address only")
    cookie = request.cookies.get(security.CSRF_COOKIE)
    csrf = cookie or security.new_csrf()
    _CSRF.set(csrf)  # the handler runs in this task: its forms carry this token
    try:
        response = await handler(request)
    except web.HTTPException as exc:  # a 404 or a refusal: its short text, with our headers
        response = web.Response(status=exc.status, text=exc.text or exc.reason)
    except (StreamschedError, ValueError) as exc:
        response = render(request, "error.html", status=400, error=safe_error(exc))
    except Exception as exc:  # every failure is one safe line on the page
        log.debug("console page %s failed", request.path, exc_info=True)
        response = render(request, "error.html", status=503, error=safe_error(exc))
    for k, v in security.HEADERS.items():
        response.headers.setdefault(k, v)
    if cookie is None:
        response.set_cookie(security.CSRF_COOKIE, csrf, httponly=True, samesite="Strict",
                            path="/")
    return response


# --- pages ----------------------------------------------------------------------------------------

async def overview(request: web.Request) -> web.Response:
    state = request.app[STATE]
    sampler = state.sampler
    names = [s.name for s in state.config.schedulers]
    per_minute = {n: charts.bar_chart(f"{n}: executions and failures per minute", sampler.per_minute(n))
                  for n in names}
    return render(request, "overview.html", latest=sampler.latest, samples=len(sampler.ring),
                  keep=sampler.ring.maxlen, interval=sampler.interval_s,
                  lag_chart=charts.line_chart("lag per scheduler", sampler.lag_series()),
                  legend=charts.legend(names), per_minute=per_minute)


async def _scheduler_sections(state: State) -> list[views.SchedulerSection]:
    sections: list[views.SchedulerSection] = []
    for sched in state.config.schedulers:
        view, pause, control, errors = None, None, True, []
        try:
            view = await views.scheduler_view(state.config.bootstrap, sched)
        except Exception as exc:  # noqa: BLE001 - its pause state and the other schedulers still show
            errors.append(f"group: {safe_error(exc)}")
        try:
            pause = await views.pause_view(state.config.bootstrap, sched)
            control = pause is not None
        except Exception as exc:  # noqa: BLE001 - as above
            errors.append(f"pause state: {safe_error(exc)}")
        sections.append(views.SchedulerSection(sched.name, view, pause, control, tuple(errors)))
    return sections


async def schedulers_page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    # Kafka and the workers at once: a worker that does not answer costs its deadline, no more.
    sections, reports = await asyncio.gather(_scheduler_sections(state),
                                             workers.fetch_reports(state.config.targets))
    tables = {s.name: workers.table_for(s.name, reports) for s in state.config.schedulers}
    return render(request, "schedulers.html", sections=sections, max_reason=actions.MAX_REASON,
                  workers=tables, worker_count=len(reports))


async def schedules_page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    catalogs: list[views.CatalogView] = []
    errors: list[str] = []
    for name in state.config.catalogs:
        try:
            catalogs.append(await views.catalog_view(state.config.bootstrap, name))
        except Exception as exc:  # noqa: BLE001 - the other catalogs still show
            errors.append(f"catalog {name}: {safe_error(exc)}")
    return render(request, "schedules.html", views=catalogs, errors=errors, cap=views.MAX_SCHEDULES,
                  max_reason=actions.MAX_REASON)


async def history_page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    catalog, name = request.match_info["catalog"], request.match_info["name"]
    if catalog not in state.config.catalogs:
        raise web.HTTPNotFound(text="not a catalog of this console")
    view = await views.history_view(state.config.bootstrap, catalog, name)
    return render(request, "history.html", view=view, cap=views.MAX_HISTORY)


async def dlq_page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    kind = request.query.get("kind") or None
    sections: list[tuple[str, views.DeadLetterTally, list[views.DeadLetterRow]]] = []
    errors: list[str] = []
    for sched in state.config.schedulers:
        tally = state.tallies[sched.name]
        try:
            await tally.refresh()
        except Exception as exc:  # noqa: BLE001 - what was read before still shows
            errors.append(f"{sched.name}: {safe_error(exc)}")
        sections.append((sched.name, tally, tally.rows(kind)[:DEAD_LETTERS_SHOWN]))
    return render(request, "dlq.html", sections=sections, errors=errors, kind=kind,
                  shown=DEAD_LETTERS_SHOWN, kept=views.NEWEST_DEAD_LETTERS)


async def identity_page(request: web.Request) -> web.Response:
    state = request.app[STATE]
    scheduler = request.query.get("scheduler", "")
    identity = request.query.get("identity", "").strip()
    view = None
    if identity:
        sched = views.pick(state.config.schedulers, scheduler)
        view = await views.identity_view(state.config.bootstrap, sched, identity)
    return render(request, "identity.html", view=view, scheduler=scheduler, identity=identity)


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def build_app(config: ConsoleConfig, sampler: Sampler | None = None) -> web.Application:
    """The aiohttp application (the sampler is started by :class:`Console`, not here)."""
    tallies = {s.name: views.DeadLetterTally(config.bootstrap, s.dead_letter_topic, s)
               for s in config.schedulers}
    sampler = sampler or Sampler(config.bootstrap, config.schedulers, tallies,
                                 interval_s=config.sample_interval_s)
    app = web.Application(middlewares=[guard], client_max_size=64 * 1024)
    app[STATE] = State(config, _environment(), tallies, sampler)
    app.router.add_get("/", overview)
    app.router.add_get("/schedulers", schedulers_page)
    app.router.add_get("/schedules", schedules_page)
    app.router.add_get("/schedules/{catalog}/{name}", history_page)
    app.router.add_get("/dlq", dlq_page)
    app.router.add_get("/identity", identity_page)
    app.router.add_get("/healthz", healthz)
    actions.add_routes(app, render)

    async def close_tallies(_app: web.Application) -> None:
        for tally in tallies.values():
            with contextlib.suppress(Exception):
                await tally.close()

    app.on_cleanup.append(close_tallies)
    return app


class Console:
    """The console serving on ``config.host:config.port`` (port 0: a free one) with its sampler
    running, for the block's duration."""

    def __init__(self, config: ConsoleConfig) -> None:
        self.config = config
        self.app = build_app(config)
        self._runner = web.AppRunner(self.app, access_log=None)
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def __aenter__(self) -> Console:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        state = self.app[STATE]
        self._task = asyncio.create_task(state.sampler.run(state.stop), name="console-sampler")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.app[STATE].stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._runner.cleanup()
