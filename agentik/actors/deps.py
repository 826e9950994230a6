"""``Deps``: what every actor needs, built once by ``agentik.runtime.open_runtime``.

Plain data: the actors take from it, nobody patches into it. The registry's part of an actor's
life (passivation, forgetting) reaches the actor through ``ConversationHandle.keeper`` instead.
Each agent of the server (``agentik.profiles``) is an :class:`AgentDeps`: its profile, its
backend (shared by its conversations, and by agents with the same backend settings) and the
tools it may use.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from agentik.config import Config
from agentik.llm.base import LiteLlm, ModelHealth
from agentik.profiles import Profile, Profiles
from agentik.storage.actor import Storage
from agentik.tools.base import ToolRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentDeps:
    profile: Profile
    llm: LiteLlm
    tools: ToolRegistry


@dataclass(frozen=True)
class Deps:
    config: Config
    storage: Storage
    profiles: Profiles
    #: agent id -> its part
    agents: Mapping[str, AgentDeps]
    #: every tool of the server (each agent has its allowed part): the MCP servers' status
    tools: ToolRegistry
    #: agent id -> whether its model's server answers (the runtime asks each now and then:
    #: /readyz); none: nobody asks
    models: Mapping[str, ModelHealth] = field(default_factory=dict)
    #: agent ids no longer configured that conversations were found to belong to (said once)
    unknown_agents: set[str] = field(default_factory=set)

    @property
    def default(self) -> AgentDeps:
        return self.agents[self.profiles.default]

    @property
    def llm(self) -> LiteLlm:
        """The default agent's backend."""
        return self.default.llm

    def agent_of(self, agent_id: str, conversation_id: str) -> AgentDeps:
        """The agent a stored conversation belongs to; one no longer in the agents file is
        served by the default agent (its instructions are in its working memory already)."""
        agent = self.agents.get(agent_id)
        if agent is None:
            if agent_id not in self.unknown_agents:  # once: every old conversation has it
                self.unknown_agents.add(agent_id)
                log.warning("conversation %s belongs to agent %r, which is not configured: the "
                            "default agent %r answers its conversations", conversation_id,
                            agent_id, self.profiles.default)
            return self.default
        return agent
