"""One safe line for a failure shown on a console page: no traceback, no payload, no secret.

Our own typed errors say what is wrong in words written for an operator (the CLI prints them
too); Kafka's and anything else are named by type only, as the CLI's failure report does:
their messages can carry broker-side detail or record fragments nobody vouched for.
"""

from __future__ import annotations

import socket

from streamsched.errors import StreamschedError
from streamsched.wire.dead_letter import safe_text


def safe_error(exc: BaseException) -> str:
    from aiokafka.errors import KafkaError

    if isinstance(exc, BaseExceptionGroup):
        return safe_error(exc.exceptions[0])
    if isinstance(exc, StreamschedError):
        return safe_text(f"{type(exc).__name__}: {exc}", 300)
    if isinstance(exc, KafkaError | ConnectionError | TimeoutError | socket.gaierror):
        return f"Kafka is unreachable or refused the request ({type(exc).__name__})"
    return f"unexpected error ({type(exc).__name__}); STREAMSCHED_LOG=DEBUG logs the traceback"
