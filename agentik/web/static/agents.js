// The agents of the server (docs/AGENTS.md): the picker for a new conversation and each
// conversation's agent in the list, both shown only when the server has several agents.

const $ = (id) => document.getElementById(id);
/** id -> name of every agent, when there are several (empty: one agent, nothing to show) */
const names = new Map();

/** Read the server's agents (again: after each reconnect) and fill the picker. */
export async function loadAgents(api) {
  let listed;
  try {
    listed = await api.agents();
  } catch {
    return; // an older server, or a passing failure: keep what is shown
  }
  names.clear();
  if (listed.agents.length > 1) {
    for (const agent of listed.agents) names.set(agent.id, agent.name);
  }
  const picker = $("agent-picker");
  const chosen = picker.value;
  picker.replaceChildren(...listed.agents.map((agent) => {
    const option = new Option(agent.name, agent.id);
    option.title = agent.description;
    return option;
  }));
  picker.value = names.has(chosen) ? chosen : listed.default;
  $("agent-pick").hidden = names.size === 0;
}

/** The agent a new conversation is for (null: the server's default). */
export function chosenAgent() {
  return names.size ? $("agent-picker").value || null : null;
}

/** The name to show for a conversation's agent (null: one agent, show none). */
export function agentName(id) {
  return names.size ? (names.get(id) ?? id) : null;
}
