"""What an OpenAI-compatible server says about itself (issue 25): whether it answers at all
(``/readyz``'s model reason) and, where its model listing says, the model's context window, so an
output budget applies from the first round instead of after the first overflow refusal.

Where each server says its window (the first that answers wins, in this order):

- ``GET {base}/models``, the model's entry: vLLM ``max_model_len``; llama.cpp ``meta.n_ctx`` (the
  window it allocated); LM Studio ``loaded_context_length`` / ``max_context_length``; others
  ``context_length`` / ``context_window``;
- llama.cpp ``GET /props``: ``default_generation_settings.n_ctx``; else the listing's
  ``meta.n_ctx_train`` (what the model was trained for: an upper bound);
- LM Studio ``GET /api/v0/models/{model}``: ``loaded_context_length``, else ``max_context_length``;
- Ollama ``GET /api/ps``: the loaded model's ``context_length`` (its ``num_ctx``); else
  ``POST /api/show``: ``num_ctx`` in its parameters, else ``model_info["<arch>.context_length"]``.

The server-root routes are asked only when the listing names no window; a route a server does not
have answers 404 at once. The parsing is pure (the ``*_window`` functions); :func:`survey` is
the I/O around it, with its own short-lived HTTP client, bounded in time as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx2
import trio

__all__ = ["Survey", "entry_window", "ollama_ps_window", "ollama_show_window", "survey"]

#: fields of a listing entry that name the window, best first
_ENTRY_FIELDS = ("max_model_len", "loaded_context_length", "context_length", "context_window",
                 "max_context_length")


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def entry_window(entry: Mapping[str, Any]) -> int | None:
    """The window a ``/models`` entry names (llama.cpp's trained size excluded: see
    :func:`trained_window`)."""
    meta = entry.get("meta")
    if isinstance(meta, Mapping) and (n := _positive(meta.get("n_ctx"))):
        return n
    for name in _ENTRY_FIELDS:
        if n := _positive(entry.get(name)):
            return n
    return None


def trained_window(entry: Mapping[str, Any]) -> int | None:
    """llama.cpp's ``meta.n_ctx_train``: the window the model was trained for."""
    meta = entry.get("meta")
    return _positive(meta.get("n_ctx_train")) if isinstance(meta, Mapping) else None


def props_window(body: Mapping[str, Any]) -> int | None:
    """llama.cpp ``/props``: the window of a slot."""
    settings = body.get("default_generation_settings")
    if isinstance(settings, Mapping) and (n := _positive(settings.get("n_ctx"))):
        return n
    return _positive(body.get("n_ctx"))


def lmstudio_window(body: Mapping[str, Any]) -> int | None:
    return _positive(body.get("loaded_context_length")) or _positive(body.get("max_context_length"))


def ollama_ps_window(body: Mapping[str, Any], model: str) -> int | None:
    """Ollama ``/api/ps``: the window ``model`` is loaded with (absent when it is not loaded)."""
    models = body.get("models")
    for entry in models if isinstance(models, list) else ():
        if isinstance(entry, Mapping) and model in (entry.get("name"), entry.get("model")):
            return _positive(entry.get("context_length"))
    return None


def ollama_show_window(body: Mapping[str, Any]) -> int | None:
    """Ollama ``/api/show``: ``num_ctx`` set for the model, else its architecture's window."""
    params = body.get("parameters")
    if isinstance(params, str) and (found := re.search(r"^num_ctx\s+(\d+)\s*$", params, re.M)):
        return _positive(int(found.group(1)))
    info = body.get("model_info")
    if isinstance(info, Mapping):
        for key, value in info.items():
            if key.endswith(".context_length") and (n := _positive(value)):
                return n
    return None


@dataclass(frozen=True)
class Survey:
    """What :func:`survey` found: ``error`` is None when the server answered (why not, else);
    ``window`` and ``source`` (where it was read) when a route named it."""

    error: str | None
    window: int | None = None
    source: str | None = None


#: the longest a survey may take, all its requests together
SURVEY_TIMEOUT = 5.0


async def survey(
    base_url: str, api_key: str | None, model: str, *, want_window: bool
) -> Survey:
    """Ask the server at ``base_url`` (the API's base, e.g. ``http://host:8000/v1/``) whether it
    answers and, with ``want_window``, the window of ``model``."""
    timeout = SURVEY_TIMEOUT
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = base_url.rstrip("/") + "/"
    try:
        async with httpx2.AsyncClient(headers=headers, timeout=timeout) as http:
            with trio.fail_after(timeout):
                return await _survey(http, base, model, want_window)
    except trio.TooSlowError:
        return Survey(f"the LLM endpoint {base} did not answer within {timeout:g} s")
    except Exception as exc:  # whatever the server or the transport did: an answer, not a crash
        # (the runtime asks in its root nursery: an escaping error would end the server)
        return Survey(f"cannot reach the LLM endpoint {base}: {type(exc).__name__}: {exc}")


async def _survey(http: httpx2.AsyncClient, base: str, model: str, want_window: bool) -> Survey:
    listing = await http.get(base + "models")
    if listing.status_code in (401, 403):
        return Survey(f"the LLM endpoint {base} refused our credentials (HTTP "
                      f"{listing.status_code}): set OPENAI_API_KEY")
    if listing.status_code >= 500:
        return Survey(f"the LLM endpoint {base} answers HTTP {listing.status_code}")
    if not want_window:
        return Survey(None)
    entry = _entry(_json(listing), model)
    if n := entry_window(entry):
        return Survey(None, n, "its model listing")
    root = re.sub(r"/v1/?$", "", base.rstrip("/")) + "/"
    asks: list[tuple[str, Callable[[], Awaitable[httpx2.Response]], Callable[[Any], int | None]]] = [
        ("/props", lambda: http.get(root + "props"), props_window),
        ("its listing's trained size", _answer(listing), lambda _: trained_window(entry)),
        ("/api/v0/models", lambda: http.get(f"{root}api/v0/models/{model}"), lmstudio_window),
        ("/api/ps", lambda: http.get(root + "api/ps"), lambda b: ollama_ps_window(b, model)),
        ("/api/show", lambda: http.post(root + "api/show", json={"model": model}),
         ollama_show_window),
    ]
    for source, ask, read in asks:
        answer = await ask()
        if answer.status_code == 200 and (n := read(_json(answer))):
            return Survey(None, n, source)
    return Survey(None)


def _answer(response: httpx2.Response) -> Callable[[], Awaitable[httpx2.Response]]:
    async def same() -> httpx2.Response:
        return response

    return same


def _json(response: httpx2.Response) -> Mapping[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, Mapping) and response.status_code == 200 else {}


def _entry(listing: Mapping[str, Any], model: str) -> Mapping[str, Any]:
    """The listing's entry of ``model``; the only entry when there is one (llama.cpp lists its
    one model under its file name, whatever name the request uses)."""
    listed = listing.get("data")
    data = [e for e in listed if isinstance(e, Mapping)] if isinstance(listed, list) else []
    named = [e for e in data if e.get("id") == model]
    return named[0] if named else data[0] if len(data) == 1 else {}
