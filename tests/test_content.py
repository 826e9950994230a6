"""Images in a message (issue 26, points 2 and 9): one rule for every front door that takes
content (agentik/content.py, checked by LocalAgent.send). The rule alone, then the HTTP send,
the WebSocket ``send``, A2A file parts and the OpenAI route's data URLs against a real server:
a refused image is a 400 (413 for the size) naming the item, nothing is stored and the model
is never asked."""

# ruff: noqa: F811 - pytest fixtures imported from tests.webutil are parameters here

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx2
import pytest
import trio
from trio_websocket import open_websocket_url

from agentik.config import Config
from agentik.content import ImageRules, check_content
from agentik.errors import InvalidInputError, PayloadTooLargeError
from agentik.wire import Image, Text
from tests.scripted_openai import Reply, ScriptedOpenAI
from tests.test_a2a import a2a_server
from tests.webutil import (  # noqa: F401 - fixtures are used by name
    WsClient,
    make_config,
    no_error_logs,
    open_sse,
    openai,
    serve_app,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 24
JPEG = b"\xff\xd8\xff\xe0" + b"\0" * 24
GIF = b"GIF89a" + b"\0" * 24
WEBP = b"RIFF\x10\0\0\0WEBPVP8 " + b"\0" * 16


#: on the suite's engine (``conftest.ENGINE``: CI runs it on SQLite, then on PostgreSQL)
pytestmark = pytest.mark.usefixtures("engine")

def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


RULES = ImageRules()

GOOD = [Image(b64(PNG), "image/png"), Image(b64(JPEG), "image/jpeg"),
        Image(b64(GIF), "image/gif"), Image(b64(b"GIF87a" + b"\0" * 8), "image/gif"),
        Image(b64(WEBP), "image/webp")]

#: (image, a piece of the message that must name what is wrong)
BAD = [
    (Image("not base64!", "image/png"), "not valid base64"),
    (Image(b64(PNG)[:-2], "image/png"), "not valid base64"),  # padding cut
    (Image(b64(PNG) + "\n", "image/png"), "not valid base64"),  # whitespace
    (Image(b64(PNG).replace("+", "-") + "-_", "image/png"), "not valid base64"),  # urlsafe
    (Image("data:image/png;base64," + b64(PNG), "image/png"), "not valid base64"),
    (Image("aGVsbG8é", "image/png"), "not valid base64"),  # not ASCII
    (Image("", "image/png"), "empty"),
    (Image(b64(b"<html><script>alert(1)</script>"), "text/html"), "'text/html' is not accepted"),
    (Image(b64(b"<svg xmlns='http://www.w3.org/2000/svg'/>"), "image/svg+xml"),
     "'image/svg+xml' is not accepted"),
    (Image(b64(PNG), "image/png\r\nX: y"), "is not accepted"),
    (Image(b64(PNG), "javascript:alert(1)//"), "is not accepted"),
    (Image(b64(PNG), "IMAGE/PNG"), "is not accepted"),
    (Image(b64(PNG), "image/png; charset=x"), "is not accepted"),
    (Image(b64(JPEG), "image/png"), "is not image/png"),  # bytes of another type
    (Image(b64(b"<svg/>"), "image/jpeg"), "is not image/jpeg"),
    (Image(b64(b"GIF90a" + b"\0" * 8), "image/gif"), "is not image/gif"),
    (Image(b64(b"RIFF\0\0\0\0WAVEfmt "), "image/webp"), "is not image/webp"),
]


def test_the_rule_accepts_the_four_types_and_refuses_everything_else() -> None:
    check_content([Text("hi"), *GOOD], RULES)
    for image, why in BAD:
        with pytest.raises(InvalidInputError) as caught:
            check_content([Text("look"), image], RULES)
        assert not isinstance(caught.value, PayloadTooLargeError), image
        assert str(caught.value).startswith("content[1]: ") and why in str(caught.value), (
            image, str(caught.value))
    # A narrower allow-list refuses the rest; the size limit is a 413 before and after decoding.
    with pytest.raises(InvalidInputError, match="'image/gif' is not accepted"):
        check_content(GOOD, ImageRules(types=("image/png", "image/jpeg")))
    # A type agentik cannot check is refused even when an embedder's rules allow it.
    with pytest.raises(InvalidInputError, match="'image/bmp' is not accepted"):
        check_content([Image(b64(b"BM" + bytes(20)), "image/bmp")],
                      ImageRules(types=("image/png", "image/bmp")))
    check_content([Image(b64(PNG), "image/png")], ImageRules(max_bytes=len(PNG)))
    for limit in (len(PNG) - 1, 4):
        with pytest.raises(PayloadTooLargeError, match="AGENTIK_MAX_IMAGE_BYTES"):
            check_content([Image(b64(PNG), "image/png")], ImageRules(max_bytes=limit))


# --- the front doors -----------------------------------------------------------------------------


def small_limit_config(tmp_path: Path, openai: ScriptedOpenAI) -> Config:
    return make_config(tmp_path, openai, max_image_bytes=1000)


async def assert_nothing_stored(http: httpx2.AsyncClient, cid: str, openai: ScriptedOpenAI) -> None:
    messages = (await http.get(f"/agentik/conversations/{cid}/messages")).json()
    assert [m["message"]["type"] for m in messages] == []
    assert openai.requests == []


async def test_http_send_refuses_bad_images_and_stores_nothing(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    openai.push(Reply("a png"))
    async with serve_app(small_limit_config(tmp_path, openai)) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
            cid = (await http.post("/agentik/conversations", json={})).json()["id"]
            url = f"/agentik/conversations/{cid}/messages"
            for image, why in BAD:
                response = await http.post(url, json={"content": [
                    {"type": "text", "body": "look"},
                    {"type": "image", "data": image.data, "mime": image.mime}]})
                assert response.status_code == 400, (image, response.text)
                error = response.json()["error"]
                assert error["code"] == "invalid_input" and why in error["message"], error
            big = b64(PNG + b"\0" * 1000)
            response = await http.post(url, json={"content": [
                {"type": "image", "data": big, "mime": "image/png"}]})
            assert response.status_code == 413, response.text
            assert "AGENTIK_MAX_IMAGE_BYTES" in response.json()["error"]["message"]
            await assert_nothing_stored(http, cid, openai)
            # A good image still goes through, to the model.
            async with open_sse(http, f"/agentik/conversations/{cid}/events") as stream:
                response = await http.post(url, json={"content": [
                    {"type": "image", "data": b64(PNG), "mime": "image/png"}]})
                assert response.status_code == 202, response.text
                with trio.fail_after(10):
                    await stream.until("touched")
            assert b64(PNG) in str(openai.requests[0]["messages"])


async def test_websocket_send_refuses_bad_images_and_stores_nothing(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    async with serve_app(small_limit_config(tmp_path, openai)) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
            cid = (await http.post("/agentik/conversations", json={})).json()["id"]
            with trio.fail_after(20):
                async with open_websocket_url(server.ws_url) as raw:
                    ws = WsClient(raw)
                    for image, why in [*BAD, (Image(b64(PNG + b"\0" * 1000)), "too_large")]:
                        frame = await ws.call("send", conversation_id=cid, content=[
                            {"type": "image", "data": image.data, "mime": image.mime}])
                        assert frame["type"] == "error", (image, frame)
                        error: dict[str, Any] = frame["error"]
                        if why == "too_large":
                            assert error["code"] == "too_large", error
                        else:
                            assert error["code"] == "invalid_input", error
                            assert why in error["message"], error
            await assert_nothing_stored(http, cid, openai)


async def test_a2a_file_parts_are_checked_before_the_task_is_stored(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    def part(raw: bytes, media_type: str) -> dict[str, Any]:
        return {"raw": b64(raw), "mediaType": media_type, "filename": "f"}

    refused = [
        (part(b"<svg/>", "image/svg+xml"), "'image/svg+xml' is not accepted"),
        (part(PNG, "image/png\r\nX: y"), "is not accepted"),
        (part(b"<html>", "image/png"), "is not image/png"),
        (part(b"", "image/png"), "empty"),
        (part(PNG + b"\0" * 1000, "image/png"), "AGENTIK_MAX_IMAGE_BYTES"),
    ]
    openai.push(Reply("a png"))
    async with a2a_server(small_limit_config(tmp_path, openai)) as (_, rpc):
        for bad, why in refused:
            for configuration in ({}, {"returnImmediately": True}):
                error = await rpc.error("SendMessage", {
                    "message": {"role": "ROLE_USER", "messageId": "m", "contextId": "images",
                                "parts": [{"text": "look"}, bad]},
                    "configuration": configuration}, -32602)
                assert error["message"].startswith("message.parts[1]: ") and why in error[
                    "message"], error
        listed = await rpc.call("ListTasks", {})
        assert listed["tasks"] == [] and openai.requests == []
        # A good image reaches the model.
        done = await rpc.call("SendMessage", {"message": {
            "role": "ROLE_USER", "messageId": "m", "contextId": "images",
            "parts": [{"text": "look"}, part(PNG, "image/png")]}})
        assert done["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        assert b64(PNG) in str(openai.requests[0]["messages"])


async def test_openai_route_images_follow_the_same_rule(
    tmp_path: Path, openai: ScriptedOpenAI
) -> None:
    def request(url: str) -> dict[str, Any]:
        return {"model": "default", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}]}

    refused = [
        (f"data:image/svg+xml;base64,{b64(b'<svg/>')}", 400, "'image/svg+xml' is not accepted"),
        (f"data:text/html;base64,{b64(b'<html>')}", 400, "'text/html' is not accepted"),
        (f"data:image/png;base64,{b64(JPEG)}", 400, "is not image/png"),
        (f"data:image/png;base64,{b64(PNG + bytes(1000))}", 413, "AGENTIK_MAX_IMAGE_BYTES"),
    ]
    openai.push(Reply("a png"))
    async with serve_app(small_limit_config(tmp_path, openai)) as server:
        async with httpx2.AsyncClient(base_url=server.url, timeout=10) as http:
            for url, status, why in refused:
                response = await http.post("/v1/chat/completions", json=request(url))
                assert response.status_code == status, response.text
                assert why in response.json()["error"]["message"], response.text
            assert openai.requests == []
            listed = (await http.get("/agentik/conversations")).json()["conversations"]
            assert listed == []
            good = await http.post("/v1/chat/completions",
                                   json=request(f"data:image/png;base64,{b64(PNG)}"))
            assert good.status_code == 200, good.text
            assert b64(PNG) in str(openai.requests[0]["messages"])
