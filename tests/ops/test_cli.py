"""The CLI refuses bad input with typed, one-line errors, before or without a cluster."""

from __future__ import annotations

import pytest

from streamsched.ops.broker import free_port
from streamsched.ops.cli import main


def test_invalid_spec_is_refused_before_connecting(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "add", "x", "@every 1mo", "--target", "t", "--bootstrap", "127.0.0.1:1"]) == 2
    assert "InvalidSpec" in capsys.readouterr().err


def test_reserved_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schedule", "add", "__streamsched.x", "@every 1m", "--target", "t",
                 "--bootstrap", "127.0.0.1:1"]) == 2
    assert "ReservedName" in capsys.readouterr().err


def test_unreachable_cluster_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "add", "x", "@every 1m", "--target", "t",
                 "--bootstrap", f"127.0.0.1:{free_port()}"])
    err = capsys.readouterr().err
    assert code == 3 and "unreachable" in err and "Traceback" not in err


def test_emit_refuses_unknown_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emit", "t", "--event", '{"type": "due", "secret_field": 1}', "--bootstrap", "x:1"]) == 2
    assert "unknown event fields" in capsys.readouterr().err


def test_schedule_add_needs_its_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["schedule", "add", "x"])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1
    assert "the following arguments are required: SPEC, --target" in err
