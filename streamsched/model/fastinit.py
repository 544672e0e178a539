"""A faster ``__init__`` for the frozen, slotted dataclasses the worker builds per item.

A frozen dataclass's generated ``__init__`` assigns each field with ``object.__setattr__(self,
name, value)``, which looks the attribute up by name every time. The worker builds about a dozen
such values per item (the claim state three times, its context, outcome, execution, the item
and its claim), and those constructors were about a tenth of a Kafka-native worker's CPU
(py-spy). :func:`fast_init` replaces the generated ``__init__`` with one that calls each slot's
descriptor directly (about 40 % faster for seven fields): same signature, same defaults, and the
instance stays frozen (assignment still raises ``FrozenInstanceError``).

A class it cannot reproduce exactly (no ``__slots__``, not frozen, a ``__post_init__``, a field
with ``init=False`` or a ``default_factory``, or an ``InitVar``) keeps its generated
``__init__``: the decorator is an optimisation, never a change of behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Give the frozen slotted dataclass ``cls`` the faster ``__init__`` (module docs)."""
    params = getattr(cls, "__dataclass_params__", None)
    if (params is None or not params.frozen or "__slots__" not in cls.__dict__
            or hasattr(cls, "__post_init__")
            or any(f._field_type is not dataclasses._FIELD  # type: ignore[attr-defined]  # InitVar, ClassVar
                   for f in cls.__dataclass_fields__.values())):  # type: ignore[attr-defined]
        return cls
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if any(not f.init or f.default_factory is not dataclasses.MISSING or f.name.startswith("__fast_")
           or f.name == "self" for f in fields):
        return cls
    namespace: dict[str, Any] = {}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    for i, f in enumerate(fields):
        # Names of the generated code's globals start with "__fast_" (no field is named so).
        namespace[f"__fast_set{i}"] = getattr(cls, f.name).__set__  # the slot's member descriptor
        param = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"__fast_default{i}"] = f.default
            param = f"{f.name}=__fast_default{i}"
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    __fast_set{i}(self, {f.name})")
    params_src = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({params_src}) -> None:\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
