"""The built-in web chat (docs/PROTOCOL.md §7): ``GET /`` and ``GET /agentik/ui`` serve the page,
``GET /agentik/ui/<name>`` its files, all from ``agentik/web/static/`` inside the package (plain
HTML, CSS and ES modules, no build step).

The routes are public (auth.PUBLIC_ENDPOINTS): the files hold no secrets, and the page asks for a
token itself when the API answers 401. Only the files present when the package was installed are
served (read once, at import), so no path from a request ever reaches the file system. Every
answer carries a Content-Security-Policy that lets the page load and connect only to this server
and run no inline script: nothing the model writes can run even if it reached the DOM as HTML.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources

from quart import Blueprint, Response, request

from agentik.errors import NotFoundError

bp = Blueprint("agentik_ui", __name__)

INDEX = "index.html"

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}

#: a Host header safe to put into the policy (WebSocket sources; older browsers do not let
#: 'self' cover ws:/wss:)
_HOST = re.compile(r"[A-Za-z0-9.\-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?")


@dataclass(frozen=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def _load() -> dict[str, StaticFile]:
    files: dict[str, StaticFile] = {}
    root = resources.files("agentik.web") / "static"
    for entry in root.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if not entry.is_file() or suffix not in _TYPES:
            continue
        body = entry.read_bytes()
        files[entry.name] = StaticFile(
            body, _TYPES[suffix], '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
        )
    return files


FILES = _load()


def security_headers() -> dict[str, str]:
    connect = "'self'"
    host = request.host
    if _HOST.fullmatch(host):
        connect += f" ws://{host} wss://{host}"
    policy = (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        f"connect-src {connect}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return {
        "Content-Security-Policy": policy,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }


def _serve(name: str) -> Response:
    file = FILES.get(name)
    if file is None:
        raise NotFoundError(f"no file {name!r} in the web chat")
    headers = {**security_headers(), "ETag": file.etag}
    if file.etag in request.headers.get("If-None-Match", ""):
        return Response(b"", status=304, headers=headers)
    return Response(file.body, status=200, headers=headers, content_type=file.content_type)


@bp.get("/")
async def index() -> Response:
    return _serve(INDEX)


@bp.get("/agentik/ui")
async def ui() -> Response:
    return _serve(INDEX)


@bp.get("/agentik/ui/<name>")
async def static_file(name: str) -> Response:
    return _serve(name)
