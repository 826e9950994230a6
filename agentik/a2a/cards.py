"""The A2A card of each agent of the server (docs/AGENTS.md): its name, description and tools as
skills, from the in-process agent."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentik.a2a.web import CardInfo, skills_of

if TYPE_CHECKING:
    from agentik.agent import LocalAgent


def card_info_for(agent: LocalAgent, agent_id: str | None = None) -> CardInfo:
    """The card of one agent of the server (None: the default one). Raises NotFoundError."""
    entry = agent.get_agent(agent_id)
    return CardInfo(
        name=entry.name, description=entry.description or agent.config.agent_description,
        version=_version(), skills=skills_of(agent.agent_tools(entry.id)),
        bearer_auth=bool(agent.config.tokens), push=True,
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("agentik")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout
        return "0"
