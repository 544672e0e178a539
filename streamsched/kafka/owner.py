"""The fenced owner of one partition: the runtime the worker and the ticker share."""

from __future__ import annotations

import asyncio
import contextlib


async def finish_or_cancel(task: asyncio.Task[None], deadline_s: float) -> None:
    """Let ``task`` finish within ``deadline_s`` (it was asked to stop), else cancel it."""
    try:
        await asyncio.wait_for(asyncio.shield(task), deadline_s)
    except Exception:  # noqa: BLE001 - past the deadline or failed: cancel either way
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
