"""Log configuration and context (streamsched/logs.py): JSON and text lines carry the context of
the work they are about, bad settings are one-line errors, context never leaks between tasks."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest

from streamsched.errors import ConfigError
from streamsched.logs import JsonFormatter, TextFormatter, current_context, log_context, parse_level
from streamsched.testing import ROOT


def record(message: str, *args: object, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord("streamsched.worker.turn", logging.WARNING, __file__, 1, message, args, exc_info)


def test_a_json_line_carries_the_context_and_only_the_exception_type() -> None:
    with log_context(scheduler="charges", partition=3), log_context(identity="sched_ab", fence=7, offset=42):
        line = JsonFormatter().format(record("turn failed: %s", "x", exc=ValueError("payload secret")))
    doc = json.loads(line)
    assert doc["message"] == "turn failed: x" and doc["level"] == "WARNING"
    assert (doc["scheduler"], doc["partition"], doc["identity"], doc["fence"], doc["offset"]) == (
        "charges", 3, "sched_ab", 7, 42)
    assert doc["exc_type"] == "ValueError" and "payload secret" not in line and doc["time"].endswith("Z")
    assert current_context() == {}


def test_a_text_line_ends_with_its_context() -> None:
    with log_context(scheduler="charges", partition=0, trace_id=None):
        line = TextFormatter().format(record("restored"))
    assert line.endswith("streamsched.worker.turn restored scheduler=charges partition=0")


async def test_context_follows_a_task_and_the_tasks_it_starts_but_never_leaks() -> None:
    seen: dict[str, dict[str, object]] = {}

    async def partition(p: int) -> None:
        with log_context(scheduler="s", partition=p):
            await asyncio.sleep(0)
            child = asyncio.ensure_future(asyncio.sleep(0, result=current_context()))
            seen[f"p{p}"] = await child

    await asyncio.gather(partition(0), partition(1))
    assert seen == {"p0": {"scheduler": "s", "partition": 0}, "p1": {"scheduler": "s", "partition": 1}}
    with pytest.raises(ValueError, match="not a log context field"), log_context(payload="no"):
        pass


def test_levels_are_any_case_and_bad_settings_are_config_errors() -> None:
    assert parse_level("info") == logging.INFO and parse_level(None) == logging.WARNING
    with pytest.raises(ConfigError, match="STREAMSCHED_LOG must be one of"):
        parse_level("loud")


BAD_SETTINGS = [({"STREAMSCHED_LOG": "loud"}, "STREAMSCHED_LOG must be one of"),
                ({"STREAMSCHED_LOG_FORMAT": "xml"}, "STREAMSCHED_LOG_FORMAT must be")]


@pytest.mark.parametrize(("env", "says"), BAD_SETTINGS)
def test_a_worker_with_a_bad_log_setting_exits_2_in_one_line(env: dict[str, str], says: str) -> None:
    command = [sys.executable, "-m", "streamsched", "run", "--app", "consumers.due_runs:app",
               "--bootstrap", "127.0.0.1:1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, **env})
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_safe_traceback_shows_frames_and_types_never_messages() -> None:
    from streamsched.logs import safe_traceback

    secret = "SECRET"  # what a record held at run time (the source lines shown are code)

    def inner() -> None:
        raise KeyError(f"sched-plaintext-{secret}")

    try:
        try:
            inner()
        except KeyError:
            raise ValueError(f"payload {secret}") from None
    except ValueError as suppressed:
        assert safe_traceback(suppressed).splitlines()[-1] == "ValueError"
        assert "KeyError" not in safe_traceback(suppressed)  # ``from None``: as Python prints it
    try:
        try:
            inner()
        except KeyError as exc:
            raise ValueError(f"payload {secret}") from exc
    except ValueError as chained:
        text = safe_traceback(chained)
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "in inner" in text
    assert "KeyError" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1] == "ValueError" and "SECRET" not in text
