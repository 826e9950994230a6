"""Third-party errors converted once, where a backend calls its library (like httpx's
``map_httpcore_exceptions``): each boundary names a table from exception class to conversion,
and :func:`map_exceptions` applies it to whatever the block raises."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from agentik.errors import LlmError

__all__ = ["ErrorTable", "map_exceptions"]

#: exception class -> the LlmError it becomes (the most specific class of an exception wins)
ErrorTable = Mapping[type[Exception], Callable[[Exception], LlmError]]


@contextmanager
def map_exceptions(table: ErrorTable) -> Iterator[None]:
    """Raise the table's LlmError for an exception of the block, ``from`` the original. The
    conversion of the first class in the exception's MRO that the table names is used, so a
    subclass entry overrides its base's. LlmError itself, classes the table does not name and
    BaseExceptions (Cancelled, GeneratorExit) pass through untouched."""
    try:
        yield
    except LlmError:
        raise
    except Exception as exc:
        for cls in type(exc).__mro__:
            convert = table.get(cls)
            if convert is not None:
                raise convert(exc) from exc
        raise
