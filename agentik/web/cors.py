"""CORS (docs/PROTOCOL.md §2): only for the origins in ``AGENTIK_CORS_ORIGINS``; without the setting no
``Access-Control-*`` header is ever sent.

- A preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) from an allowed
  origin is answered 204 here, before auth (browsers send no token on a preflight); from another
  origin it gets no CORS header, so the browser refuses the real request.
- Every other answer to an allowed origin (errors too, so a page can read a 401) carries
  ``Access-Control-Allow-Origin`` and the exposed headers.
- ``*`` allows every origin without credentials (no ``Access-Control-Allow-Credentials``); a
  listed origin is echoed with ``Vary: Origin`` and credentials allowed.

Pure: maps request headers to the headers to add.
"""

from __future__ import annotations

from collections.abc import Sequence

ALLOW_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
ALLOW_HEADERS = "Authorization, Content-Type, Last-Event-ID, Idempotency-Key, X-Client-Id"
EXPOSE_HEADERS = "Retry-After, X-Agentik-Cursor, Location"
#: seconds a browser may cache a preflight answer
MAX_AGE = "600"


def _allow_origin(origins: Sequence[str], origin: str | None) -> dict[str, str] | None:
    if not origins or not origin:
        return None
    if "*" in origins:
        return {"Access-Control-Allow-Origin": "*"}
    if origin in origins:
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Credentials": "true",
            "Vary": "Origin",
        }
    return None


def is_preflight(method: str, origin: str | None, request_method: str | None) -> bool:
    return method == "OPTIONS" and bool(origin) and bool(request_method)


def preflight_headers(origins: Sequence[str], origin: str | None) -> dict[str, str] | None:
    """The headers of a preflight answer, None when the origin is not allowed."""
    headers = _allow_origin(origins, origin)
    if headers is None:
        return None
    return {
        **headers,
        "Access-Control-Allow-Methods": ALLOW_METHODS,
        "Access-Control-Allow-Headers": ALLOW_HEADERS,
        "Access-Control-Max-Age": MAX_AGE,
    }


def response_headers(origins: Sequence[str], origin: str | None) -> dict[str, str] | None:
    """The headers added to an ordinary answer, None when the origin is not allowed."""
    headers = _allow_origin(origins, origin)
    if headers is None:
        return None
    return {**headers, "Access-Control-Expose-Headers": EXPOSE_HEADERS}
