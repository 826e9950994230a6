"""The chat-completions request of :mod:`agentik.llm.openai`, sent through the openai SDK's own
HTTP client but not its request machinery (issue 13).

The SDK's ``chat.completions.create`` costs about 0.7 ms of CPU per request on top of the HTTP
exchange (its parameter transform, two pydantic option copies, header building, its retry and
auth-retry wrappers, the response wrapper), and its ``iter_lines`` four more async-generator
layers per chunk. agentik makes its own retries (``max_retries=0``) and builds plain JSON
already, so :class:`ChatEndpoint` sends the body itself with the SDK client's ``httpx2`` client
(its connection pool and timeouts), the SDK's default and auth headers (``Authorization``,
``User-Agent``, organization and project, ``X-Stainless-*``) taken once, to the URL the SDK would
use (each request copied from one ``build_request`` made once: :meth:`ChatEndpoint.request`);
only in the SDK's plain API-key mode (what agentik configures): a client with another auth
(workload identity, a provider, a key provider) still goes through ``create``. Failures
come out as the SDK's own exceptions, as ``create`` raises them (so ``openai_errors`` maps them
unchanged): a timeout is ``APITimeoutError``, another transport failure ``APIConnectionError``,
an HTTP error status the SDK's ``APIStatusError`` subclass, made by the SDK from the response.

:func:`data_lines` splits a body into SSE ``data:`` payloads at byte level.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import Any

import anyio
import httpx2
import msgspec
import openai

from agentik import tracing

__all__ = ["ChatEndpoint", "data_lines"]

#: the SDK client's other ways to authenticate (each None in plain API-key mode)
_AUTH_MODES = ("_provider_runtime", "_workload_identity_auth", "_api_key_provider")
#: the SDK client's private parts the direct path uses
_INTERNALS = ("_client", "_prepare_url", "_make_status_error_from_response", "auth_headers")
#: what the SDK counts as a failed request (``openai._base_client.request_exceptions``)
_REQUEST_ERRORS = (httpx2.RequestError, ssl.SSLError, anyio.EndOfStream)


class ChatEndpoint:
    """``POST {base_url}chat/completions`` for one ``openai.AsyncOpenAI`` client."""

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self._client = client
        self._headers: dict[str, str] | None = None
        #: sent directly only in the SDK's plain API-key mode (no workload identity, provider or
        #: key provider: their auth is the SDK's business); otherwise, or with an SDK whose
        #: internals are not the ones this module uses (a later release may rename them),
        #: through ``create``
        self.direct = all(getattr(client, name, "unknown") is None for name in _AUTH_MODES) and all(
            hasattr(client, name) for name in _INTERNALS)
        self.url = client._prepare_url("chat/completions") if self.direct else ""
        self._template: httpx2.Request | None = None

    def headers(self) -> dict[str, str]:
        """The SDK's default and auth headers (computed once: the key is fixed; a header the
        SDK omits is left out)."""
        if self._headers is None:
            client = self._client
            self._headers = _plain({**client.default_headers, **client.auth_headers})
        return self._headers

    def request(self, content: bytes) -> httpx2.Request:
        """The request for one body: what ``build_request`` makes (the HTTP client's own headers
        merged with :meth:`headers`, ``Host``, ``Content-Length``, the SDK client's timeouts),
        copied from a template built by ``build_request`` once, so that its URL parse, header
        merge and normalisation (three passes over 15 headers) are not made per request. While
        the HTTP client holds cookies, every request is built by ``build_request`` (it adds
        their ``Cookie`` header)."""
        http = self._client._client
        if http.cookies:
            return http.build_request("POST", self.url, content=content, headers=self.headers(),
                                      timeout=self._client.timeout)
        template = self._template
        if template is None:
            # a body, so that Content-Length takes its place (an empty one gets it after Host)
            template = http.build_request("POST", self.url, content=b"{}", headers=self.headers(),
                                          timeout=self._client.timeout)
            self._template = template
        request = httpx2.Request("POST", template.url, headers=template.headers,
                                 stream=httpx2.ByteStream(content), extensions=template.extensions)
        request.headers["Content-Length"] = str(len(content))  # in place of the template's
        request.read()  # as for content=: the body is there for a retry or an error's request
        return request

    async def open(self, stack: AsyncExitStack, body: dict[str, Any]) -> httpx2.Response:
        """Send ``body`` and return the streamed response once its headers are in (closed by
        ``stack``). Raises the SDK's errors, like ``create`` (module docstring)."""
        if not self.direct:
            extra = {name: value for name, value in body.items() if name not in ("model", "stream")}
            create = self._client.chat.completions.with_streaming_response.create
            trace: dict[str, str] = {}
            tracing.inject(trace)  # the round's span as the model server's parent
            sdk = await stack.enter_async_context(
                create(model=body["model"], messages=[], stream=True, extra_body=extra,
                       extra_headers=trace or None))
            return sdk.http_response
        http = self._client._client
        request = self.request(msgspec.json.encode(body))
        if tracing.enabled():
            tracing.inject(request.headers)  # the round's span as the model server's parent
        try:
            response = await http.send(request, stream=True)
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc
        except _REQUEST_ERRORS as exc:
            raise openai.APIConnectionError(request=request) from exc
        stack.push_async_callback(response.aclose)
        if response.status_code >= 400:
            await response.aread()
            raise self._client._make_status_error_from_response(response)
        return response


def _plain(headers: Mapping[str, Any]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if isinstance(value, str)}


def data_lines(rest: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The stripped payloads of the complete ``data:`` lines in ``rest + chunk`` (CR, LF or CRLF
    ends a line), and the unfinished rest to prepend to the next chunk."""
    text = rest + chunk if rest else chunk
    if b"\r" in text:
        text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    *lines, rest = text.split(b"\n")
    datas = []
    for line in lines:  # (a loop, not a comprehension: no function call per chunk)
        if line.startswith(b"data:"):
            datas.append(line[5:].strip())
    return datas, rest
