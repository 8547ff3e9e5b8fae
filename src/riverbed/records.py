"""Frozen, slotted dataclasses built at the cost of plain ones (`quick_init`).

A frozen dataclass refuses `__setattr__`, so the `__init__` that `dataclass`
writes sets each field through `object.__setattr__`: about twice what setting
a slot costs. The broker builds some records once per message or per stream
(a `Message` per PUBLISH, a `Deliver` per delivery, a `Follow` and a `Fetch`
per stream of a resuming session); their `__init__` was a few per cent of its
CPU. `quick_init` gives such a class an `__init__` with the same signature that
sets the slots through their descriptors' setters, as the codec's `Publish`
does by hand. Everything else (frozen, equality, hash, repr, `replace`) is the
dataclass's own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of a frozen, slotted dataclass (`cls`) with one that
    sets its fields through its slots' setters, then calls `__post_init__` if
    it has one. Fields must be plain ones (positional, no default factory, no
    `InitVar`): a class with anything else is refused with `TypeError`."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    declared = cls.__dict__["__dataclass_fields__"]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if len(fields) != len(declared):
        raise TypeError(f"{cls.__name__} has an InitVar or ClassVar field")
    namespace: dict[str, Any] = {}
    arguments: list[str] = []
    body: list[str] = []
    for i, field in enumerate(fields):
        if not field.init or field.kw_only or field.default_factory is not dataclasses.MISSING:
            raise TypeError(
                f"{cls.__name__}.{field.name} is not a plain field"
                " (init=False, keyword-only or with a default factory)"
            )
        if field.default is dataclasses.MISSING:
            arguments.append(field.name)
        else:
            namespace[f"_default_{i}"] = field.default
            arguments.append(f"{field.name}=_default_{i}")
        namespace[f"_set_{i}"] = cls.__dict__[field.name].__set__
        body.append(f"    _set_{i}(self, {field.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(arguments)}):\n" + "\n".join(body or ["    pass"])
    exec(source, namespace)  # as `dataclass` makes its own: a function of these fields
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
