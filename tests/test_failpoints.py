"""Crash-test failpoints: the spec's grammar, and what reaching one does (os.kill recorded)."""

from __future__ import annotations

import signal

import pytest

from streamsched import failpoints
from streamsched.errors import ConfigError


def test_a_spec_names_the_point_its_nth_pass_and_its_action() -> None:
    assert failpoints.parse("after_claim") == {"after_claim": (1, signal.SIGKILL)}
    assert failpoints.parse("after_claim:3, tick_before_commit:2:stop") == {
        "after_claim": (3, signal.SIGKILL), "tick_before_commit": (2, signal.SIGSTOP)}


@pytest.mark.parametrize("spec", ["nowhere", "after_claim:0", "after_claim:x", "after_claim:2:pause"])
def test_a_bad_spec_is_one_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="STREAMSCHED_FAILPOINT must be"):
        failpoints.parse(spec)


def test_the_nth_pass_signals_the_process_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr(failpoints.os, "kill", lambda _pid, sig: sent.append(sig))
    failpoints.arm("tick_before_commit:2:stop")
    try:
        failpoints.hit("tick_before_commit")
        assert sent == []
        failpoints.hit("after_claim")  # not armed
        failpoints.hit("tick_before_commit")
        assert sent == [signal.SIGSTOP]
        failpoints.hit("tick_before_commit")  # resumed: it goes on past the point
        assert sent == [signal.SIGSTOP]
    finally:
        failpoints.arm(None)
