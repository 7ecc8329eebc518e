-- Waits-for edges on PostgreSQL, under the team lock: ask, wait for an output, expire, release.
-- The SQLite implementation of the same transitions is store/waits.py.

-- End a wait without an answer: the synthetic tool result `p_result` (cancelled, expired),
-- then the waiter woken or continued.
CREATE OR REPLACE FUNCTION ar__release(
    INOUT a ar_agents, INOUT o jsonb, q ar_questions, p_result text, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    r := ar__end_wait(a, o, q, p_result, 'question_cancelled', ar__waiter_turn(a.id, q.asker_epoch),
                      NULL, jsonb_build_object('synthetic', split_part(p_result, ':', 1),
                                               'question_id', q.id),
                      jsonb_build_object('result', p_result), p_now);
    a := r.a;
    o := r.o;
END $$;

-- The waits-for path target -> ... -> asker, if the new edge asker -> target closes one (the
-- agents' names); empty otherwise.
CREATE OR REPLACE FUNCTION ar__cycle_through(p_team bigint, p_asker bigint, p_target bigint)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    v_path bigint[] := ARRAY[p_asker, p_target];
    v_current bigint := p_target;
    v_agents integer;
    v_names text[];
BEGIN
    SELECT count(*) INTO v_agents FROM ar_agents WHERE team_id = p_team;
    LOOP
        SELECT target_agent_id INTO v_current FROM ar_questions
        WHERE team_id = p_team AND waiting AND asker_agent_id = v_current
        ORDER BY id DESC LIMIT 1;
        EXIT WHEN NOT FOUND;
        v_path := v_path || v_current;
        IF v_current = p_asker THEN
            SELECT array_agg(ag.display_name ORDER BY p.n) INTO v_names
            FROM unnest(v_path) WITH ORDINALITY AS p(id, n) JOIN ar_agents ag ON ag.id = p.id;
            RETURN v_names;
        END IF;
        EXIT WHEN cardinality(v_path) > v_agents + 1;  -- a cycle that does not go through asker
    END LOOP;
    RETURN '{}';
END $$;

-- A refused wait edge: its code (an AskRefusedError) with the target and the cycle (and
-- `p_fields`), and its `ask_refused` event (with the wait's kind when it is not an ask).
CREATE OR REPLACE FUNCTION ar__wait_refused(
    INOUT o jsonb, p_team bigint, p_agent bigint, p_turn bigint, p_epoch integer,
    p_target text, p_reason text, p_code text, p_kind ar_question_kind,
    p_cycle text[] DEFAULT '{}', p_fields jsonb DEFAULT '{}')
LANGUAGE plpgsql AS $$
BEGIN
    o := jsonb_set(
        ar__refused(o, p_code, jsonb_build_object('target', p_target, 'cycle', p_cycle)
                               || p_fields),
        '{refused,event}', jsonb_build_object(
            'action', 'ask_refused', 'team_id', p_team, 'agent_id', p_agent, 'turn_id', p_turn,
            'epoch', p_epoch,
            'detail', jsonb_build_object('reason', p_reason, 'target', p_target,
                                         'cycle', to_jsonb(p_cycle))
                || CASE WHEN p_kind = 'ask' THEN '{}'::jsonb
                        ELSE jsonb_build_object('kind', p_kind) END));
END $$;

-- Refuse a wait (an ask, a wait for output, a question to the user) whose tool call `p_call` is
-- not an open call of the waiter's last assistant message: an `ask_refused` event.
CREATE OR REPLACE FUNCTION ar__refuse_closed_call(
    INOUT o jsonb, a ar_agents, p_turn bigint, p_call text)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT p_call = ANY (ar__open_tool_calls(a.id)) THEN
        o := ar__refused(o, 'not_open_tool_call', jsonb_build_object('call', p_call));
        o := jsonb_set(o, '{refused,event}', jsonb_build_object(
            'action', 'ask_refused', 'team_id', a.team_id, 'agent_id', a.id, 'turn_id', p_turn,
            'detail', jsonb_build_object('reason', 'bad_tool_call_id')));
    END IF;
END $$;

-- The checks before a new waits-for edge (an ask, or a wait for an output), under the team lock
-- that serializes edge creation, then both agents' locks by id: refused for an unknown,
-- terminated or same target, a tool call that is not open, or an edge that would close a
-- cycle. The waiter's row in `a`, the target's in `t`.
CREATE OR REPLACE FUNCTION ar__open_wait_edge(
    INOUT a ar_agents, INOUT o jsonb, INOUT t ar_agents, p_turn bigint, p_agent bigint,
    p_epoch integer, p_target text, p_call text, p_kind ar_question_kind)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_team bigint;
    v_verb text := CASE p_kind WHEN 'ask' THEN 'ask' ELSE 'wait' END;
    v_cycle text[];
BEGIN
    SELECT team_id INTO v_team FROM ar_agents WHERE id = p_agent;
    IF NOT FOUND THEN
        o := ar__refused(o, 'no_agent_id', jsonb_build_object('agent_id', p_agent));
        RETURN;
    END IF;
    PERFORM 1 FROM ar_teams WHERE id = v_team FOR NO KEY UPDATE;
    SELECT * INTO t FROM ar_agents WHERE team_id = v_team AND display_name = p_target;
    IF NOT FOUND THEN
        o := ar__wait_refused(o, v_team, p_agent, p_turn, p_epoch, p_target, 'unknown_target',
                              'ask_unknown_target', p_kind);
        RETURN;
    END IF;
    PERFORM 1 FROM ar_agents WHERE id IN (p_agent, t.id) ORDER BY id FOR NO KEY UPDATE;
    SELECT * INTO t FROM ar_agents WHERE id = t.id;
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch,
                    CASE p_kind WHEN 'ask' THEN 'ask' ELSE 'wait_output' END);
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN;
    END IF;
    IF t.id = a.id THEN
        o := ar__wait_refused(o, v_team, p_agent, p_turn, p_epoch, p_target, 'self',
                              CASE p_kind WHEN 'ask' THEN 'ask_self' ELSE 'wait_self' END,
                              p_kind);
        RETURN;
    END IF;
    IF t.state = 'terminated' THEN
        o := ar__wait_refused(o, v_team, p_agent, p_turn, p_epoch, p_target, 'terminated',
                              'ask_terminated', p_kind);
        RETURN;
    END IF;
    o := ar__refuse_closed_call(o, a, p_turn, p_call);
    IF o ? 'refused' THEN
        RETURN;
    END IF;
    v_cycle := ar__cycle_through(v_team, a.id, t.id);
    IF cardinality(v_cycle) > 0 THEN
        o := ar__wait_refused(o, v_team, p_agent, p_turn, p_epoch, p_target, 'cycle',
                              'cycle', p_kind, v_cycle, jsonb_build_object('verb', v_verb));
    END IF;
END $$;

-- The new waits-for edge: an open question with its deadline, and the waiter waiting, blocking
-- in its worker (a question to the user's asker is suspended by its caller); ledgered as an
-- `ask` (of an agent or of the user) or a `wait_output` with `p_detail`.
CREATE OR REPLACE FUNCTION ar__open_question(
    INOUT a ar_agents, INOUT o jsonb, INOUT q ar_questions, p_turn bigint, p_target bigint,
    p_target_name text, p_call text, p_kind ar_question_kind, p_timeout float8,
    p_detail jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ar_questions (team_id, asker_agent_id, target_agent_id, tool_call_id,
                              asker_epoch, status, kind, waiting, deadline, created_at)
    VALUES (a.team_id, a.id, p_target, p_call, a.epoch, 'open', p_kind, true,
            p_now + make_interval(secs => p_timeout), p_now)
    RETURNING * INTO q;
    a := ar__move(a, 'waiting');
    a.suspended := false;
    o := ar__agent_event(o, CASE p_kind WHEN 'output' THEN 'wait_output' ELSE 'ask'
                            END::ar_ledger_action, a, p_now,
        jsonb_build_object('question_id', q.id, 'target', p_target_name) || p_detail,
        p_turn => p_turn, p_epoch => a.epoch);
END $$;

-- Open a question from the turn's agent to `p_target` and put the asker in waiting; the
-- question is routed to the target as an `ask` message. The result's "question" and
-- "delivery".
CREATE OR REPLACE FUNCTION ar_ask(
    p_turn bigint, p_agent bigint, p_epoch integer, p_target text, p_content text,
    p_body text, p_call text, p_subtype ar_message_subtype, p_timeout float8)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    t ar_agents;
    q ar_questions;
    r record;
    v_now timestamp;
BEGIN
    r := ar__open_wait_edge(a, o, t, p_turn, p_agent, p_epoch, p_target, p_call, 'ask');
    a := r.a;
    o := r.o;
    t := r.t;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    v_now := ar__now();
    r := ar__open_question(a, o, q, p_turn, t.id, p_target, p_call, 'ask', p_timeout, '{}',
                           v_now);
    a := r.a;
    o := r.o;
    q := r.q;
    PERFORM ar__save_agent(a);
    r := ar__route(o, p_target, false, ar__message(
        a.team_id, a.display_name, 'ask', p_subtype, p_content, p_body, q.id, true, NULL));
    IF r.o ? 'refused' THEN  -- the checks above leave nothing to refuse: a bug, rolled back
        RAISE EXCEPTION 'ask % refused after its checks: %', q.id, r.o -> 'refused';
    END IF;
    RETURN r.o || jsonb_build_object('question', to_jsonb(q), 'delivery', r.d);
END $$;

-- The lead waits for `p_target`'s next output (a waits-for edge lead -> target, checked for
-- cycles like an ask). An output of the target already in the lead's mailbox is consumed at
-- once; otherwise the lead is waiting until one arrives. Refused when there is none and the
-- target rests with nothing to work on. The result's "question".
CREATE OR REPLACE FUNCTION ar_wait_output(
    p_turn bigint, p_agent bigint, p_epoch integer, p_target text, p_call text,
    p_timeout float8)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    t ar_agents;
    q ar_questions;
    m ar_messages;
    r record;
    v_now timestamp;
BEGIN
    r := ar__open_wait_edge(a, o, t, p_turn, p_agent, p_epoch, p_target, p_call, 'output');
    a := r.a;
    o := r.o;
    t := r.t;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    -- A report ends the wait; progress narration does not.
    SELECT * INTO m FROM ar_messages
    WHERE target_agent_id = a.id AND source_agent_id = t.id AND type = 'output'
      AND subtype IS DISTINCT FROM 'progress_output' AND status = 'pending'
    ORDER BY seq LIMIT 1;
    IF m.id IS NULL AND t.state IN ('idle', 'completed')
       AND NOT EXISTS (SELECT 1 FROM ar_messages
                       WHERE target_agent_id = t.id AND status = 'pending' AND wake) THEN
        o := ar__wait_refused(o, a.team_id, p_agent, p_turn, p_epoch, p_target, 'not_working',
                              'not_working', 'output', p_fields => jsonb_build_object(
                                  'state', t.state));
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    v_now := ar__now();
    r := ar__open_question(a, o, q, p_turn, t.id, p_target, p_call, 'output', p_timeout,
                           jsonb_build_object('ready', m.id IS NOT NULL), v_now);
    a := r.a;
    o := r.o;
    q := r.q;
    IF m.id IS NOT NULL THEN
        q := ar__close_question(q, 'answered', v_now, m.id);
        -- The blocking path: state back to running, the wake signal unneeded but harmless.
        r := ar__resolve_waiter(a, o, q, m, v_now);
        a := r.a;
        o := r.o;
        SELECT * INTO q FROM ar_questions WHERE id = q.id;
    END IF;
    PERFORM ar__save_agent(a);
    RETURN o || jsonb_build_object('question', to_jsonb(q));
END $$;

-- Expire one open question past its deadline: closed `expired`, and its asker, if it still
-- waits on it, resolved with `p_result` (woken if blocked, a continuation turn if suspended).
-- The result's "expired": whether it was.
CREATE OR REPLACE FUNCTION ar_expire_question(p_question bigint, p_result text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    q ar_questions;
    r record;
    v_now timestamp;
BEGIN
    SELECT * INTO a FROM ar_agents
    WHERE id = (SELECT asker_agent_id FROM ar_questions WHERE id = p_question)
    FOR NO KEY UPDATE;
    SELECT * INTO q FROM ar_questions WHERE id = p_question FOR NO KEY UPDATE;
    v_now := ar__now();
    IF q.id IS NULL OR q.status <> 'open' OR q.deadline > v_now THEN
        RETURN o || '{"expired": false}';
    END IF;
    q := ar__close_question(q, 'expired', v_now);
    o := ar__agent_event(o, 'question_expired', a, v_now,
                         jsonb_build_object('question_id', q.id, 'waiting', q.waiting));
    IF q.waiting THEN
        r := ar__release(a, o, q, p_result, v_now);
        a := r.a;
        o := r.o;
        PERFORM ar__save_agent(a);
    END IF;
    RETURN o || '{"expired": true}';
END $$;
