"""The one statement that commits a planned PostgreSQL batch (``pg.plan.Plan``).

A data-modifying CTE: ``c`` bumps the single counter row by the number of offsets the batch uses
(its lock is held only while the server runs this statement, never across a round trip or Python
work, so offsets are dense and in commit order across nodes at full speed, SCALEOUT.md), every
other part inserts or deletes rows at ``base + rel`` and joins ``c``, so when ``c`` updates
nothing (a lease check failed) nothing is stored; the final SELECT returns ``base`` and NOTIFYs
the schema's channel (a wake-up hint carrying the head).

Only the parts a batch needs are in its statement (a batch of user messages has no A2A upsert,
no deletes, ...): fewer parts to plan and run on the server, fewer arrays to dump on the client.
The few shapes that occur are kept, so psycopg converts and prepares each once. Row arrays go as
binary parameters (``%(x)b``): dumping them as text costs several times more.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from agentik.limits import utc_day
from agentik.storage.ops import DELIVERY_LOG_KEEP
from agentik.storage.pg.arrays import Bools, Byteas, Float8s, Int8s, Texts
from agentik.storage.pg.fence import Ownership
from agentik.storage.pg.plan import Plan

#: the lease checks (``pg.fence``): this node's fences still current, no live other owner
_F = """f AS (SELECT x.conversation_id FROM conv_owner x
    JOIN unnest(%(f_cid)b::text[], %(f_fence)b::bigint[]) AS r(cid, fence) ON x.conversation_id = r.cid
    WHERE x.node_id = %(me)s AND x.fence = r.fence FOR SHARE OF x)"""
_G = """g AS (SELECT x.conversation_id FROM conv_owner x JOIN nodes y ON y.node_id = x.node_id
    WHERE x.conversation_id = ANY(%(u_cid)b::text[]) AND x.node_id <> %(me)s
      AND y.heartbeat_at > now() - make_interval(secs => %(ttl)s) FOR SHARE OF x)"""
#: the conversation rows the plan took from the writer's memory (``PgWriter._known``) instead of
#: reading them: each still as it was (its seq and its last working-memory index), else the
#: batch stores nothing and is planned again from a read
_K = """k AS (SELECT 1 FROM unnest(%(k_id)b::text[], %(k_seq)b::bigint[], %(k_max)b::bigint[])
        AS r(id, seq, mx)
    JOIN conversation x ON x.id = r.id AND x.seq = r.seq
    WHERE (SELECT COALESCE(max(order_idx), 0) FROM working_memory w
           WHERE w.conversation_id = r.id) = r.mx)"""
_C = "c AS (UPDATE counter SET v = v + %(n)s WHERE id = 1{checks} RETURNING v - %(n)s AS base)"
_CHECK_F = " AND (SELECT count(*) FROM f) = %(f_n)s"
_CHECK_G = " AND NOT EXISTS (SELECT 1 FROM g)"
_CHECK_K = " AND (SELECT count(*) FROM k) = %(k_n)s"

_OWNER_NEW = """oi AS (INSERT INTO conv_owner (conversation_id, node_id, fence)
    SELECT r.id, %(me)s, 1 FROM c, unnest(%(new)b::text[]) AS r(id)
    ON CONFLICT (conversation_id) DO NOTHING)"""
_OUTBOX = """o AS (INSERT INTO outbox ("offset", conversation_id, kind, created_at, payload)
    SELECT c.base + r.rel, r.cid, r.kind, %(now)s, r.payload FROM c,
    unnest(%(o_rel)b::bigint[], %(o_cid)b::text[], %(o_kind)b::text[], %(o_payload)b::bytea[])
    AS r(rel, cid, kind, payload))"""
_MESSAGE = """m AS (INSERT INTO message (seq, id, conversation_id, type, created_at, payload)
    SELECT c.base + r.rel, r.id, r.cid, r.type, %(now)s, r.payload FROM c,
    unnest(%(m_rel)b::bigint[], %(m_id)b::text[], %(m_cid)b::text[], %(m_type)b::text[],
           %(m_payload)b::bytea[]) AS r(rel, id, cid, type, payload))"""
_CONVERSATION = """cv AS (INSERT INTO conversation (id, title, is_temporal, created_at, updated_at, seq,
                                  agent, instructions)
    SELECT r.id, r.title, r.temp, r.created, r.updated, c.base + r.rel, r.agent, r.instr FROM c,
    unnest(%(c_id)b::text[], %(c_title)b::text[], %(c_temp)b::boolean[],
           %(c_created)b::float8[], %(c_updated)b::float8[], %(c_rel)b::bigint[],
           %(c_agent)b::text[], %(c_instr)b::text[])
    AS r(id, title, temp, created, updated, rel, agent, instr)
    ON CONFLICT (id) DO UPDATE
    SET title = EXCLUDED.title, updated_at = EXCLUDED.updated_at, seq = EXCLUDED.seq)"""
_MEMORY = """w AS (INSERT INTO working_memory (conversation_id, order_idx, source_message_id,
                                   created_at, payload)
    SELECT r.cid, r.idx, r.src, %(now)s, r.payload FROM c,
    unnest(%(w_cid)b::text[], %(w_idx)b::int[], %(w_src)b::text[], %(w_payload)b::bytea[])
    AS r(cid, idx, src, payload))"""
_MEMORY_CUT = """wd AS (DELETE FROM working_memory x USING c,
    unnest(%(wd_cid)b::text[], %(wd_lo)b::int[], %(wd_hi)b::int[]) AS r(cid, lo, hi)
    WHERE x.conversation_id = r.cid AND x.order_idx >= r.lo AND x.order_idx < r.hi)"""
_TURN = """ti AS (INSERT INTO turn (id, conversation_id, state, seq)
    SELECT r.id, r.cid, r.state, c.base + r.rel FROM c,
    unnest(%(t_id)b::text[], %(t_cid)b::text[], %(t_state)b::text[], %(t_rel)b::bigint[])
    AS r(id, cid, state, rel))"""
#: a turn is named by (conversation, id): its primary key
_TURN_RUN = """tr AS (UPDATE turn SET state = r.state FROM c,
    unnest(%(tr_cid)b::text[], %(tr_id)b::text[], %(tr_state)b::text[]) AS r(cid, id, state)
    WHERE turn.conversation_id = r.cid AND turn.id = r.id)"""
_TURN_END = """td AS (DELETE FROM turn USING c
    WHERE (turn.conversation_id, turn.id) IN (SELECT * FROM unnest(%(td_cid)b::text[], %(td_id)b::text[]))
       OR turn.conversation_id = ANY(%(del)b::text[]))"""
#: a deleted conversation's rows and A2A tasks with their push configs and those configs' logs
#: (its outbox rows stay: they are the stream's history; the plan drops task upserts of the
#: batch for it). Each part sees the rows as they were before the statement.
_DELETED = """dm AS (DELETE FROM message USING c WHERE message.conversation_id = ANY(%(del)b::text[])),
da AS (DELETE FROM a2a_task USING c WHERE a2a_task.conversation_id = ANY(%(del)b::text[])),
dh AS (DELETE FROM webhook USING c, a2a_task t
    WHERE webhook.task_id = t.id AND t.conversation_id = ANY(%(del)b::text[])),
dl AS (DELETE FROM webhook_delivery USING c, webhook w, a2a_task t
    WHERE webhook_delivery.webhook_id = w.id AND w.task_id = t.id
      AND t.conversation_id = ANY(%(del)b::text[])),
dw AS (DELETE FROM working_memory USING c WHERE working_memory.conversation_id = ANY(%(del)b::text[])),
dc AS (DELETE FROM conversation USING c WHERE conversation.id = ANY(%(del)b::text[])),
od AS (DELETE FROM conv_owner USING c WHERE conv_owner.conversation_id = ANY(%(del)b::text[]))"""
_TASK = """a AS (INSERT INTO a2a_task (id, context_id, conversation_id, state, created_at,
                             updated_at, first_seq, seq, payload)
    SELECT r.id, r.ctx, r.cid, r.state, %(now)s, %(now)s, c.base + r.rel, c.base + r.rel, r.payload
    FROM c, unnest(%(a_id)b::text[], %(a_ctx)b::text[], %(a_cid)b::text[], %(a_state)b::text[],
                   %(a_rel)b::bigint[], %(a_payload)b::bytea[]) AS r(id, ctx, cid, state, rel, payload)
    ON CONFLICT (id) DO UPDATE
    SET conversation_id = EXCLUDED.conversation_id, state = EXCLUDED.state,
        updated_at = EXCLUDED.updated_at, seq = EXCLUDED.seq, payload = EXCLUDED.payload)"""
#: the user of each conversation created for one (docs/USERS.md); the row outlives the
#: conversation (a replay still knows whose its events were)
_USERS = """cu AS (INSERT INTO conversation_user (conversation_id, user_id)
    SELECT r.cid, r.uid FROM c, unnest(%(cu_cid)b::text[], %(cu_uid)b::text[]) AS r(cid, uid)
    ON CONFLICT (conversation_id) DO NOTHING)"""
#: the model tokens of the batch's answers, added to their conversations' users' UTC day (a
#: conversation created in the same statement has no answer yet, so the join sees every user)
_USAGE = """uu AS (INSERT INTO user_usage (user_id, day, tokens)
    SELECT x.user_id, %(day)s, sum(r.tokens) FROM c,
    unnest(%(uu_cid)b::text[], %(uu_tokens)b::bigint[]) AS r(cid, tokens)
    JOIN conversation_user x ON x.conversation_id = r.cid GROUP BY x.user_id
    ON CONFLICT (user_id, day) DO UPDATE SET tokens = user_usage.tokens + EXCLUDED.tokens)"""
#: webhook subscriptions (docs/WEBHOOKS.md): a new one, else its definition, each with the
#: progress the batch stored for it (``prog``: else a new one starts after ``after``, an old one
#: keeps its own); one deleted with its log; progress of others; log lines added, each log cut
#: to its newest lines (as read before the statement: a few more may stay until the next cut)
_HOOK = """hk AS (INSERT INTO webhook (id, url, events, agent, conversation_id, task_id, secret, source,
                           config, created_at, "after", attempts, next_at, failing_since)
    SELECT r.id, r.url, r.ev, r.agent, r.cid, r.task, r.secret, r.src, r.config, %(now)s, r.after,
           r.attempts, %(now)s + r.retry_in, CASE WHEN r.attempts = 0 THEN NULL ELSE %(now)s END
    FROM c, unnest(%(h_id)b::text[], %(h_url)b::text[], %(h_ev)b::text[], %(h_agent)b::text[],
                   %(h_cid)b::text[], %(h_task)b::text[], %(h_secret)b::text[], %(h_src)b::text[],
                   %(h_config)b::bytea[], %(h_after)b::bigint[], %(h_prog)b::boolean[],
                   %(h_attempts)b::int[], %(h_retry)b::float8[])
    AS r(id, url, ev, agent, cid, task, secret, src, config, after, prog, attempts, retry_in)
    ON CONFLICT (id) DO UPDATE SET url = EXCLUDED.url, events = EXCLUDED.events,
        agent = EXCLUDED.agent, conversation_id = EXCLUDED.conversation_id,
        task_id = EXCLUDED.task_id, secret = EXCLUDED.secret, source = EXCLUDED.source,
        config = EXCLUDED.config,
        "after" = CASE WHEN EXCLUDED.id = ANY(%(h_prog_ids)b::text[])
                       THEN EXCLUDED."after" ELSE webhook."after" END,
        attempts = CASE WHEN EXCLUDED.id = ANY(%(h_prog_ids)b::text[])
                        THEN EXCLUDED.attempts ELSE webhook.attempts END,
        next_at = CASE WHEN EXCLUDED.id = ANY(%(h_prog_ids)b::text[])
                       THEN EXCLUDED.next_at ELSE webhook.next_at END,
        failing_since = CASE WHEN EXCLUDED.id <> ALL(%(h_prog_ids)b::text[]) THEN webhook.failing_since
                             WHEN EXCLUDED.attempts = 0 THEN NULL
                             ELSE COALESCE(webhook.failing_since, %(now)s) END)"""
_HOOK_DEL = """hd AS (DELETE FROM webhook USING c WHERE webhook.id = ANY(%(hd_id)b::text[])),
hl AS (DELETE FROM webhook_delivery USING c WHERE webhook_delivery.webhook_id = ANY(%(hd_id)b::text[]))"""
_HOOK_PROGRESS = """hp AS (UPDATE webhook SET "after" = r.after, attempts = r.attempts,
        next_at = %(now)s + r.retry_in,
        failing_since = CASE WHEN r.attempts = 0 THEN NULL ELSE COALESCE(failing_since, %(now)s) END
    FROM c, unnest(%(hp_id)b::text[], %(hp_after)b::bigint[], %(hp_attempts)b::int[],
                   %(hp_retry)b::float8[]) AS r(id, after, attempts, retry_in)
    WHERE webhook.id = r.id)"""
_HOOK_LOG = """hi AS (INSERT INTO webhook_delivery (webhook_id, "offset", type, attempt, outcome, status,
                                     error, at)
    SELECT r.id, r.off, r.type, r.attempt, r.outcome, r.status::int, r.error, %(now)s
    FROM c, unnest(%(hi_id)b::text[], %(hi_off)b::bigint[], %(hi_type)b::text[],
                   %(hi_attempt)b::int[], %(hi_outcome)b::text[], %(hi_status)b::text[],
                   %(hi_error)b::text[])
    WITH ORDINALITY AS r(id, off, type, attempt, outcome, status, error, i)
    ORDER BY r.i),
hc AS (DELETE FROM webhook_delivery x USING c, unnest(%(hc_id)b::text[]) AS r(id)
    WHERE x.webhook_id = r.id AND x.n <= (SELECT y.n FROM webhook_delivery y WHERE y.webhook_id = r.id
                                           ORDER BY y.n DESC LIMIT 1 OFFSET %(keep)s))"""
#: expired Idempotency-Keys go with every batch (but not those the batch stores again)
_KEYS_EXPIRED = """ik AS (DELETE FROM idempotency_key USING c WHERE idempotency_key.expires_at <= %(now)s
    AND NOT idempotency_key.key = ANY(%(i_key)b::text[]))"""
_KEYS = """ii AS (INSERT INTO idempotency_key (key, fingerprint, result_id, created_at, expires_at)
    SELECT r.key, r.fp, r.rid, %(now)s, r.exp
    FROM c, unnest(%(i_key)b::text[], %(i_fp)b::text[], %(i_rid)b::text[],
                   %(i_exp)b::float8[]) AS r(key, fp, rid, exp)
    ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
        result_id = EXCLUDED.result_id, created_at = EXCLUDED.created_at,
        expires_at = EXCLUDED.expires_at)"""
#: trimming removes only a prefix of offsets (cap, then TTL), so what is retained stays one
#: contiguous range. The TTL's bound is found in ``outbox_mark`` (one index descent): the newest
#: batch older than the cutoff; everything up to its last offset goes, with the marks it covers.
#: A batch with events leaves its mark (its last offset and its time, which every one of its
#: outbox rows has): one row a batch instead of an index entry an event.
_TRIM = """tc AS (DELETE FROM outbox USING c WHERE outbox."offset" <= c.base + %(n)s - %(cap)s),
tb AS (SELECT "offset" FROM outbox_mark WHERE created_at < %(cutoff)s ORDER BY created_at DESC LIMIT 1),
tt AS (DELETE FROM outbox WHERE "offset" <= (SELECT "offset" FROM tb)),
tm AS (DELETE FROM outbox_mark USING c WHERE outbox_mark."offset"
       <= GREATEST((SELECT "offset" FROM tb), c.base + %(n)s - %(cap)s)),
mk AS (INSERT INTO outbox_mark ("offset", created_at) SELECT c.base + %(n)s, %(now)s FROM c
       WHERE %(n)s > 0)"""
#: base, the NOTIFY, and what the oldest retained offset is computed from: the lowest offset
#: before this statement and the TTL trim's bound
_RESULT = """SELECT c.base, CASE WHEN %(n)s > 0 THEN pg_notify(%(chan)s, (c.base + %(n)s)::text) END,
    (SELECT min("offset") FROM outbox), (SELECT "offset" FROM tb) FROM c"""


@lru_cache(maxsize=256)
def _sql(parts: tuple[str, ...]) -> str:
    return "WITH " + ",\n".join(parts) + "\n" + _RESULT


_ARRAY_PARAM = re.compile(r"%\((\w+)\)b::(\w+)\[\]")
_TYPED: dict[str, type[list[Any]]] = {"bigint": Int8s, "int": Int8s, "text": Texts,
                                      "bytea": Byteas, "float8": Float8s, "boolean": Bools}


@lru_cache(maxsize=256)
def _array_types(sql: str) -> tuple[tuple[str, type[list[Any]]], ...]:
    """Each array parameter of ``sql`` and the typed list it is sent as (``pg.arrays``)."""
    return tuple((m.group(1), _TYPED[m.group(2)]) for m in _ARRAY_PARAM.finditer(sql))


def _typed(sql: str, args: dict[str, Any]) -> None:
    for name, cls in _array_types(sql):
        value = args.get(name)
        if isinstance(value, list) and type(value) is not cls:
            args[name] = cls(value)


def commit_statement(
    p: Plan, own: Ownership, *, channel: str, outbox_cap: int, outbox_ttl: float,
    known: list[tuple[str, int, int]] = [],  # noqa: B006 - never mutated
) -> tuple[str, dict[str, Any]]:
    """The statement committing ``p`` and its parameters (only those its parts use); ``known``:
    (id, seq, last working-memory index) of each conversation planned from memory, checked."""
    parts: list[str] = []
    args: dict[str, Any] = {"n": p.n, "now": p.now, "chan": channel, "cap": outbox_cap,
                            "cutoff": p.now - outbox_ttl}
    checks = ""
    if own.fenced or own.unfenced or p.created:
        args["me"] = own.node_id
    if own.fenced:
        parts.append(_F)
        checks += _CHECK_F
        args.update(f_cid=own.fenced, f_fence=own.fences, f_n=len(own.fenced))
    if own.unfenced:
        parts.append(_G)
        checks += _CHECK_G
        args.update(u_cid=own.unfenced, ttl=own.ttl)
    if known:
        parts.append(_K)
        checks += _CHECK_K
        args.update(k_id=[k[0] for k in known], k_seq=[k[1] for k in known],
                    k_max=[k[2] for k in known], k_n=len(known))
    parts.append(_C.format(checks=checks))
    if p.created:
        parts.append(_OWNER_NEW)
        args["new"] = p.created
    _state_rows(p, parts, args)
    parts.append(_KEYS_EXPIRED)
    i = p.idem_rows
    args["i_key"] = [r[0] for r in i]
    if i:
        parts.append(_KEYS)
        args.update(i_fp=[r[1] for r in i], i_rid=[r[2] for r in i], i_exp=[r[3] for r in i])
    parts.append(_TRIM)
    sql = _sql(tuple(parts))
    _typed(sql, args)
    return sql, args


def _state_rows(p: Plan, parts: list[str], args: dict[str, Any]) -> None:
    """The parts (and their row arrays) for the batch's outbox and state rows."""
    if p.o_rel:
        parts.append(_OUTBOX)
        args.update(o_rel=p.o_rel, o_cid=p.o_cid, o_kind=p.o_kind, o_payload=p.o_payload)
    if p.m_rel:
        parts.append(_MESSAGE)
        args.update(m_rel=p.m_rel, m_id=p.m_id, m_cid=p.m_cid, m_type=p.m_type,
                    m_payload=p.m_payload)
    dirty = [c for c in p.conv.values() if c is not None and c.rel is not None]
    if dirty:
        parts.append(_CONVERSATION)
        args.update(c_id=[c.id for c in dirty], c_title=[c.title for c in dirty],
                    c_temp=[c.is_temporal for c in dirty],
                    c_created=[c.created_at for c in dirty],
                    c_updated=[c.updated_at for c in dirty], c_rel=[c.rel for c in dirty],
                    c_agent=[c.agent for c in dirty], c_instr=[c.instructions for c in dirty])
    if p.memory:
        parts.append(_MEMORY)
        w = p.memory
        args.update(w_cid=[r[0] for r in w], w_idx=[r[1] for r in w], w_src=[r[2] for r in w],
                    w_payload=[r[3] for r in w])
    if p.memory_cut:
        parts.append(_MEMORY_CUT)
        cut = p.memory_cut
        args.update(wd_cid=[r[0] for r in cut], wd_lo=[r[1] for r in cut],
                    wd_hi=[r[2] for r in cut])
    if p.turns:
        parts.append(_TURN)
        t = list(p.turns.items())
        args.update(t_id=[r[0] for r in t], t_cid=[r[1][0] for r in t],
                    t_state=[r[1][1] for r in t], t_rel=[r[1][2] for r in t])
    if p.turns_running:
        parts.append(_TURN_RUN)
        args.update(tr_cid=[r[0] for r in p.turns_running], tr_id=[r[1] for r in p.turns_running],
                    tr_state=[r[2] for r in p.turns_running])
    if p.turns_deleted or p.deleted:
        parts.append(_TURN_END)
        args.update(td_cid=[r[0] for r in p.turns_deleted], td_id=[r[1] for r in p.turns_deleted],
                    **{"del": p.deleted})
    if p.deleted:
        parts.append(_DELETED)
    if p.users:
        parts.append(_USERS)
        args.update(cu_cid=[r[0] for r in p.users], cu_uid=[r[1] for r in p.users])
    if p.usage:
        parts.append(_USAGE)
        args.update(uu_cid=[r[0] for r in p.usage], uu_tokens=[r[1] for r in p.usage],
                    day=utc_day(p.now))
    if p.hook_rows or p.hooks_deleted or p.hook_progress or p.hook_log:
        _hook_rows(p, parts, args)
    if p.task_rows:
        parts.append(_TASK)
        a = p.task_rows
        args.update(a_id=[r[0] for r in a], a_ctx=[r[1] for r in a], a_cid=[r[2] for r in a],
                    a_state=[r[3] for r in a], a_rel=[r[4] for r in a],
                    a_payload=[r[5] for r in a])


def _hook_rows(p: Plan, parts: list[str], args: dict[str, Any]) -> None:
    """The parts (and their row arrays) for the batch's webhook rows."""
    if p.hook_rows:
        parts.append(_HOOK)
        rows = list(p.hook_rows.values())
        specs = [op.spec for op, _ in rows]
        args.update(h_id=[h.id for h in specs], h_url=[h.url for h in specs],
                    h_ev=[",".join(h.events) for h in specs], h_agent=[h.agent for h in specs],
                    h_cid=[h.conversation_id for h in specs], h_task=[h.task_id for h in specs],
                    h_secret=[h.secret for h in specs], h_src=[h.source for h in specs],
                    h_config=[h.config for h in specs],
                    h_after=[op.after if g is None else g.after for op, g in rows],
                    h_prog=[g is not None for _, g in rows],
                    h_attempts=[0 if g is None else g.attempts for _, g in rows],
                    h_retry=[0.0 if g is None else g.retry_in for _, g in rows],
                    h_prog_ids=[op.spec.id for op, g in rows if g is not None])
    if p.hooks_deleted:
        parts.append(_HOOK_DEL)
        args["hd_id"] = p.hooks_deleted
    if p.hook_progress:
        parts.append(_HOOK_PROGRESS)
        g = p.hook_progress
        args.update(hp_id=[op.webhook_id for op in g], hp_after=[op.after for op in g],
                    hp_attempts=[op.attempts for op in g], hp_retry=[op.retry_in for op in g])
    if p.hook_log:
        parts.append(_HOOK_LOG)
        lines = p.hook_log
        args.update(hi_id=[h for h, _ in lines], hi_off=[a.offset for _, a in lines],
                    hi_type=[a.type for _, a in lines], hi_attempt=[a.attempt for _, a in lines],
                    hi_outcome=[a.outcome for _, a in lines],
                    hi_status=[None if a.status is None else str(a.status) for _, a in lines],
                    hi_error=[a.error for _, a in lines],
                    hc_id=list(dict.fromkeys(h for h, _ in lines)), keep=DELIVERY_LOG_KEEP)
