"""The pure parts of webhooks (``agentik/webhooks.py``): which event is which webhook type and what
its data says, the filters, the retry rule, secrets, push URLs and the settings file."""

from __future__ import annotations

import msgspec
import pytest

from agentik import webhooks
from agentik.errors import InvalidInputError
from agentik.storage import ops
from agentik.wire import (
    AssistantMessage,
    AssistantMessageEvent,
    CommonEvent,
    ConversationRecord,
    Created,
    Cursor,
    Deleted,
    Error,
    ErrorEvent,
    Interrupted,
    MessageRecord,
    Renamed,
    Text,
    TurnTokens,
)

SECRET = "whsec_" + "QUJD" * 8  # base64 of 24 bytes


def common(event: object, cid: str | None = "c") -> CommonEvent:
    return CommonEvent(cursor=Cursor(epoch="e", offset=7), conversation_id=cid,
                       event=event)  # type: ignore[arg-type]


def record(message: object) -> MessageRecord:
    return MessageRecord(id="m", seq=7, conversation_id="c", created_at=1.5,
                         message=message)  # type: ignore[arg-type]


def test_each_event_type_and_its_data() -> None:
    answer = AssistantMessage(content=[Text(body="hi")], turn_id="t", finish_reason="stop",
                              tokens=TurnTokens(prompt=3, completion=2))
    assert webhooks.webhook_event(common(AssistantMessageEvent(record=record(answer)))) == (
        "turn.completed", {"conversation_id": "c", "turn_id": "t", "message_id": "m",
                           "finish_reason": "stop", "tokens": {"prompt": 3, "completion": 2}})
    # an interrupted answer is said by its ``interrupted`` event
    cut = msgspec.structs.replace(answer, interrupted=True)
    assert webhooks.webhook_event(common(AssistantMessageEvent(record=record(cut)))) is None
    assert webhooks.webhook_event(common(Interrupted(turn_id="t"))) == (
        "turn.interrupted", {"conversation_id": "c", "turn_id": "t"})
    error = Error(message="boom", code="llm", turn_id="t")
    assert webhooks.webhook_event(common(ErrorEvent(record=record(error)))) == (
        "turn.failed", {"conversation_id": "c", "turn_id": "t", "message_id": "m",
                        "error": {"code": "llm", "message": "boom"}})
    conv = ConversationRecord(id="x", title="T", is_temporal=False, created_at=1.0,
                              updated_at=1.0, seq=7, agent="a")
    assert webhooks.webhook_event(common(Created(conversation=conv), None)) == (
        "conversation.created", {"conversation_id": "x", "agent": "a", "title": "T"})
    assert webhooks.webhook_event(common(Deleted(conversation_id="x", agent="a"), None)) == (
        "conversation.deleted", {"conversation_id": "x", "agent": "a"})
    assert webhooks.webhook_event(common(Renamed(conversation_id="x", title=None,
                                                 updated_at=1.0))) is None
    assert set(webhooks.WEBHOOK_TYPES) >= {"turn.completed", "turn.failed", "approval.requested",
                                           "input.requested", "conversation.deleted"}
    assert webhooks.event_time(common(ErrorEvent(record=record(error)))) == 1.5


def test_a_person_in_the_loop() -> None:
    """A person in the loop (issue 30): the fields of the request the event carries."""
    from agentik.wire import ApprovalRequested, InputRequested
    from agentik.wire_pause import ApprovalRequest, InputRequest

    ask = ApprovalRequest(call_id="k", tool="fs__rm", arguments='{"p":1}', deadline=9.0,
                          turn_id="t")
    assert webhooks.webhook_event(common(ApprovalRequested(record=record(ask)))) == (
        "approval.requested", {"conversation_id": "c", "message_id": "m", "call_id": "k",
                               "tool": "fs__rm", "arguments": '{"p":1}', "deadline": 9.0,
                               "turn_id": "t"})
    question = InputRequest(call_id="q", question="Which?", choices=["a", "b"], turn_id="t")
    kind, data = webhooks.webhook_event(common(InputRequested(record=record(question))))  # type: ignore[misc]
    assert kind == "input.requested"
    assert (data["call_id"], data["question"], data["choices"]) == ("q", "Which?", ["a", "b"])


def test_body_and_timestamp() -> None:
    body = msgspec.json.decode(webhooks.body("turn.failed", 0.25, {"conversation_id": "c"}))
    assert body == {"type": "turn.failed", "timestamp": "1970-01-01T00:00:00.250Z",
                    "data": {"conversation_id": "c"}}


def test_filters() -> None:
    spec = ops.WebhookSpec(id="h", url="http://x/", events=("turn.failed",), secret=SECRET)
    assert webhooks.wants(spec, "turn.failed", "c", None)
    assert not webhooks.wants(spec, "turn.completed", "c", None)
    one = msgspec.structs.replace(spec, conversation_id="c", agent="a")
    assert webhooks.wants(one, "turn.failed", "c", "a")
    assert not webhooks.wants(one, "turn.failed", "d", "a")
    assert not webhooks.wants(one, "turn.failed", "c", "b")
    assert not webhooks.wants(one, "turn.failed", "c", None)


def test_backoff_doubles_to_its_cap_and_gives_up_after_the_retry_time() -> None:
    assert [webhooks.backoff(n, 60.0) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert webhooks.backoff(10_000, 60.0) == 60.0
    assert webhooks.backoff(3, 0.5) == 0.5
    assert not webhooks.give_up(100.0, 100.0 + 86399.9, 86400.0)
    assert webhooks.give_up(100.0, 100.0 + 86400.0, 86400.0)
    assert webhooks.delivered(200) and webhooks.delivered(299)
    assert not any(webhooks.delivered(s) for s in (199, 300, 410, 503))


def test_secrets() -> None:
    made = webhooks.new_secret()
    assert webhooks.check_secret(made) == made and made != webhooks.new_secret()
    for bad in ("QUJD" * 8, "whsec_", "whsec_not base64!", "whsec_QUJD", "whsec_" + "QUJD" * 30):
        with pytest.raises(ValueError):
            webhooks.check_secret(bad)


@pytest.mark.parametrize(("address", "private"), [
    ("127.0.0.1", True), ("10.1.2.3", True), ("192.168.0.9", True), ("172.16.0.1", True),
    ("169.254.169.254", True), ("::1", True), ("fe80::1", True), ("fc00::1", True),
    ("::ffff:127.0.0.1", True), ("0.0.0.0", True), ("100.64.0.1", True), ("224.0.0.1", True),
    ("8.8.8.8", False), ("2001:4860:4860::8888", False), ("93.184.216.34", False),
])
def test_private_addresses(address: str, private: bool) -> None:
    assert webhooks.private_address(address) is private


def test_urls() -> None:
    assert webhooks.literal_host("http://127.0.0.1:9/x") == "127.0.0.1"
    assert webhooks.literal_host("http://[::1]/") == "::1"
    assert webhooks.literal_host("http://localhost:8/") == "127.0.0.1"
    assert webhooks.literal_host("http://api.localhost/") == "127.0.0.1"
    assert webhooks.literal_host("https://example.com/") is None
    for bad in ("ftp://x/", "http:///x", "x", "http://" + "a" * 3000, "http://exa mple.com/",
                "http://h:99999/", "http://h\n/", "http://hôst/", "http://[::1/"):
        with pytest.raises(InvalidInputError):
            webhooks.check_url(bad)


def test_the_settings_file() -> None:
    text = f"""
[[webhook]]
id = "billing"
url = "https://billing.example/in"
events = ["turn.completed", "turn.completed"]
secret = "{SECRET}"
agent = "support"

[[webhook]]
id = "all"
url = "http://127.0.0.1:9/"
events = ["conversation.deleted"]
secret = "{SECRET}"
conversation = "c1"
"""
    specs = webhooks.parse_file(text, {"support": None})
    assert specs == [
        ops.WebhookSpec(id="billing", url="https://billing.example/in",
                        events=("turn.completed",), agent="support", secret=SECRET,
                        source="file"),
        ops.WebhookSpec(id="all", url="http://127.0.0.1:9/", events=("conversation.deleted",),
                        conversation_id="c1", secret=SECRET, source="file")]
    assert webhooks.parse_file("") == []


@pytest.mark.parametrize(("text", "says"), [
    ("[[webhook]\n", "not TOML"),
    ("[hooks]\n", "unknown table 'hooks'"),
    ('[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.failed"]\n', "secret is required"),
    (f'[[webhook]]\nid = "a b"\nurl = "http://x/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"',
     "id is 1 to 64"),
    (f'[[webhook]]\nid = "a"\nurl = "ftp://x/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"',
     "url must be"),
    (f'[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.nope"]\nsecret = "{SECRET}"',
     "unknown event type 'turn.nope'"),
    ('[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.failed"]\nsecret = "pw"',
     "webhook 'a': a secret is whsec_"),
    (f'[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"\n'
     'agent = "ghost"', "agent 'ghost' is not one"),
    (f'[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"\n'
     'colour = "red"', "unknown field 'colour'"),
    (f'[[webhook]]\nid = "a"\nurl = "http://x/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"\n'
     f'[[webhook]]\nid = "a"\nurl = "http://y/"\nevents = ["turn.failed"]\nsecret = "{SECRET}"',
     "webhook 'a': the id is used twice"),
])
def test_the_settings_file_names_each_mistake(text: str, says: str) -> None:
    with pytest.raises(webhooks.WebhooksFileError, match=says.replace("(", r"\(")):
        webhooks.parse_file(text, {"support": None})


def test_push_config_round_trip() -> None:
    push = webhooks.Push(token="t", scheme="Bearer", credentials="c")
    stored = webhooks.join_push(push, b'{"id":"p","url":"http://x/"}')
    assert webhooks.split_push(stored) == (push, b'{"id":"p","url":"http://x/"}')
    assert webhooks.split_push(None) == (webhooks.Push(), b"")
