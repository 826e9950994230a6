"""The HTTP + SSE + WebSocket facade (docs/PROTOCOL.md), a Quart-Trio app.

``app`` is what ``hypercorn -k trio agentik.web:app`` serves: it reads its configuration from the
environment when it starts (not at import). Embedding programs and tests build their own with
:func:`create_app`.

Note: the attribute ``agentik.web.app`` is the app, which hides the module of the same name from
``import agentik.web.app as m``; use ``from agentik.web.app import ...`` or
``importlib.import_module("agentik.web.app")`` to reach the module.
"""

from agentik.web.app import AgentikApp, WebState, create_app

app = create_app(tune_gc=True)

__all__ = ["AgentikApp", "WebState", "app", "create_app"]
