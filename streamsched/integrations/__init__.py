"""Integrations with other stream-processing frameworks, so their apps produce valid transitions.

What lives here:

* :mod:`streamsched.integrations.faust` — faust-streaming: a codec registered under the name
  ``"streamsched"`` (transition wire bytes in and out) and :class:`~streamsched.integrations.faust.
  TransitionSender`, which sends from agents with the route key and the explicit murmur2
  partition, exactly as :class:`streamsched.Producer` does.

Layer: integrations import ``model``, ``wire``, ``kafka`` and ``errors`` only (they are a
producer-side concern, like :mod:`streamsched.kafka.producer`); never ``worker``, ``schedules``,
``outbox`` or ``ops``, and nothing imports them. Each framework is optional: its package is
imported lazily, on first use, so ``import streamsched.integrations.faust`` works without Faust
installed (the ``faust`` extra installs it).
"""

from __future__ import annotations
