"""Dataclasses pickled as the tuple of their fields.

The check's caches and its scan workers pickle hundreds of thousands of small
frozen, slotted records (calls, arguments, signatures, file versions). For a
slotted dataclass the standard pickling runs `dataclasses.fields()` and builds
a state dict per object in Python; a reduce to `(cls, (field values))` is one
C-level `attrgetter` call, and loading is the class's own constructor.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, TypeVar

T = TypeVar("T")


def by_fields(cls: type[T]) -> type[T]:
    """Class decorator (under @dataclass): pickle instances as `cls(*field values)`."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    if any(not f.init for f in dataclasses.fields(cls)):  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__}: every field must be an __init__ argument")
    get = operator.attrgetter(*names)

    if len(names) == 1:

        def reduce_one(self: Any) -> tuple[Any, tuple[Any, ...]]:
            return cls, (get(self),)

        cls.__reduce__ = reduce_one  # type: ignore[method-assign]
    else:

        def reduce_many(self: Any) -> tuple[Any, tuple[Any, ...]]:
            return cls, get(self)

        cls.__reduce__ = reduce_many  # type: ignore[method-assign]
    return cls
