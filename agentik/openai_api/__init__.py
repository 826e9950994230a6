"""The OpenAI-compatible front door (docs/OPENAI.md): ``/v1/models`` and ``/v1/chat/completions``
as a projection of agentik's conversations and events, next to the A2A facade: the routes
(``web``), the pure request decisions (``chat``), a turn followed to its end (``follow``), the
answers (``stream``), the running part (``service``) and the wire (``types``)."""
