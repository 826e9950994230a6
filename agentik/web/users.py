"""The web's part of users (docs/USERS.md): ``GET /agentik/usage`` (the caller's model tokens
this UTC day, their daily limit and when the count starts again; an admin reads any user's with
``?user=``) and the A2A caller of a request."""

from __future__ import annotations

from datetime import UTC, datetime

from quart import Blueprint, Response, request

from agentik.a2a.executor import Caller
from agentik.errors import InvalidInputError
from agentik.users import Limits
from agentik.web import auth
from agentik.web._state import WebState, json_response, principal, state
from agentik.web.types import Usage

bp = Blueprint("agentik_usage", __name__)


@bp.get("/agentik/usage")
async def usage() -> Response:
    st = state()
    agent = st.require_agent()
    who = principal()
    user = request.args.get("user")
    limits = who.limits
    if user is not None and user != who.user:
        auth.require_admin(who, "another user's usage")
        if not user or len(user) > 200:
            raise InvalidInputError("query parameter `user` must be 1..200 characters")
        users = st.authenticator.users if st.authenticator is not None else None
        limits = users.limits_of(user) if users is not None else Limits()
    user = who.user if user is None else user
    tokens, reset = await agent.users.tokens_today(user)
    return json_response(Usage(
        user=user, tokens_today=tokens, tokens_per_day=limits.tokens_per_day,
        reset_at=datetime.fromtimestamp(reset, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")))


def a2a_caller(st: WebState) -> Caller:
    """The A2A caller of the current request: its principal, whose limits are checked before
    each message (sends a minute, turns, tokens) and before a new context's conversation is
    created (conversations kept)."""
    who = principal()
    agent = st.require_agent()

    async def admit() -> None:
        await agent.users.before_send(who.user, who.limits)

    return Caller(user=None if who.is_admin else who.user, owner=who.user, admit=admit,
                  limits=who.limits)
