"""What a message's content may hold, checked once for every front door that takes content (the
HTTP send, the WebSocket ``send``, A2A's file parts, the in-process agent): they all reach
:meth:`agentik.agent.LocalAgent.send`, which calls :func:`check_content` before anything is
queued or stored.

An image is accepted only when
- its ``mime`` is one of the allowed types (``AGENTIK_IMAGE_TYPES``; agentik can only vouch for
  the types whose bytes it knows, :data:`SIGNATURES`), compared exactly, so a type with
  parameters, spaces or line breaks is refused;
- its ``data`` is non-empty, strict base64 (the standard alphabet with its padding, no
  whitespace, no ``data:`` prefix);
- its bytes start as that type's files do (PNG, JPEG, GIF and WebP signatures), so what reaches
  the model is what the message says it is;
- it decodes to at most ``AGENTIK_MAX_IMAGE_BYTES`` (:class:`PayloadTooLargeError`, a 413).

Pure: the caller passes the limits (:class:`ImageRules`)."""

from __future__ import annotations

import binascii
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agentik.errors import InvalidInputError, PayloadTooLargeError
from agentik.wire import Content, Image


def _is_webp(head: bytes) -> bool:
    return head[:4] == b"RIFF" and head[8:12] == b"WEBP"


#: the image types agentik can check, each with the test of its files' first bytes
SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda head: head.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda head: head.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda head: head.startswith((b"GIF87a", b"GIF89a")),
    "image/webp": _is_webp,
}

DEFAULT_IMAGE_TYPES: tuple[str, ...] = tuple(SIGNATURES)
DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024


@dataclass(frozen=True)
class ImageRules:
    """The limits an image is checked against (from the settings)."""

    types: tuple[str, ...] = DEFAULT_IMAGE_TYPES
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES


def check_content(content: Sequence[Content], rules: ImageRules) -> None:
    """Raise InvalidInputError (400) for the first item that breaks a rule, naming it
    (``content[i]``), or PayloadTooLargeError (413) for an image over the size limit."""
    for i, item in enumerate(content):
        if isinstance(item, Image):
            check_image(item, rules, f"content[{i}]")


def check_image(image: Image, rules: ImageRules, where: str = "image") -> None:
    """See :func:`check_content`."""
    signature = SIGNATURES.get(image.mime)
    if image.mime not in rules.types or signature is None:
        raise InvalidInputError(
            f"{where}: image type {image.mime[:100]!r} is not accepted "
            f"(accepted: {', '.join(rules.types)})")
    if not image.data:
        raise InvalidInputError(f"{where}: image data is empty")
    # Refused before decoding: base64 takes 4 characters for every 3 bytes.
    least = len(image.data) // 4 * 3 - 2
    if least > rules.max_bytes:
        raise PayloadTooLargeError(
            f"{where}: an image of about {least} bytes is over the limit of {rules.max_bytes} "
            "bytes (AGENTIK_MAX_IMAGE_BYTES)")
    try:
        raw = binascii.a2b_base64(image.data, strict_mode=True)
    except (binascii.Error, ValueError) as exc:  # ValueError: a character outside ASCII
        raise InvalidInputError(f"{where}: image data is not valid base64 ({exc})") from None
    if len(raw) > rules.max_bytes:
        raise PayloadTooLargeError(
            f"{where}: an image of {len(raw)} bytes is over the limit of {rules.max_bytes} "
            "bytes (AGENTIK_MAX_IMAGE_BYTES)")
    if not signature(raw[:16]):
        raise InvalidInputError(
            f"{where}: image data is not {image.mime} (its bytes do not start as such a "
            "file's do)")
