"""Mounting the /v1 routes on agentik's app: the blueprints, and the service they run on."""

from __future__ import annotations

import time
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from agentik.openai_api import conversations_web, responses_web, web
from agentik.openai_api.service import OpenAiMount, run_service

if TYPE_CHECKING:
    from quart import Quart

    from agentik.web._state import WebState


def mount_agentik(app: Quart, st: WebState, *, heartbeat: float = 15.0) -> OpenAiMount:
    """Mount the /v1 routes on agentik's app, served on the runtime's agent while it runs."""
    mount = OpenAiMount(created=int(time.time()), heartbeat=heartbeat)
    cast(Any, app).agentik_openai = mount
    app.register_blueprint(web.bp)
    app.register_blueprint(responses_web.bp)
    app.register_blueprint(conversations_web.bp)
    st.services.append(partial(run_service, mount))
    return mount
