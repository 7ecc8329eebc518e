-- The pieces every transition is built of, on PostgreSQL.
--
-- Each transition of the store is one function (routing.sql, turns.sql, ...), called in one
-- statement: sent alone it is its own transaction (autocommit), one round trip, whichever
-- branch it takes. Functions named ar__* are the pieces those functions share; the store never
-- calls them itself.
--
-- A transition works on an agent as a row variable (ar_agents%ROWTYPE) locked FOR NO KEY UPDATE
-- and changed in memory, written back once (ar__save_agent), as the SQLite implementation's
-- unit of work writes its changed row once. What it decided is collected in one jsonb value
-- (`o`): the ledger events it wrote ("events", for the log), the outbox rows to publish after
-- the commit ("outbox"), and the transition's own result fields. Every function is VOLATILE
-- and PL/pgSQL: each statement reads with a snapshot taken after the locks before it were had.

-- The clock every transition reads: UTC, without a zone (as the columns hold it).
CREATE OR REPLACE FUNCTION ar__now() RETURNS timestamp
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN (clock_timestamp() AT TIME ZONE 'UTC')::timestamp;
END $$;

-- An empty result: no event, no outbox row.
CREATE OR REPLACE FUNCTION ar__result() RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN '{"events": [], "outbox": []}'::jsonb;
END $$;

-- The result `p` of a transition run inside another, whose result is `o`: its events and
-- outbox rows after `o`'s, its other keys (a refusal too) over `o`'s.
CREATE OR REPLACE FUNCTION ar__merge(o jsonb, p jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN o || (p - 'events' - 'outbox') || jsonb_build_object(
        'events', (o -> 'events') || (p -> 'events'),
        'outbox', (o -> 'outbox') || (p -> 'outbox'));
END $$;

-- A timestamp as Python's isoformat() writes it: a message to the user carries its time so
-- (UserMessage.as_payload), the same text whichever database wrote it.
CREATE OR REPLACE FUNCTION ar__isoformat(p timestamp) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN to_char(p, 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN to_char(p, 'US') = '000000' THEN '' ELSE '.' || to_char(p, 'US') END;
END $$;

-- A display name as it is compared for a suggestion: ASCII letters lower-cased, nothing but
-- ASCII letters and digits kept (queries.name_key on SQLite).
CREATE OR REPLACE FUNCTION ar__name_key(p text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN regexp_replace(
        translate(p, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz'),
        '[^abcdefghijklmnopqrstuvwxyz0123456789]', '', 'g');
END $$;

-- The fields of the refusal of an agent name the team does not have (the code
-- `unknown_agent`), with the agent it was probably meant for ("close"): the first (by id) whose
-- key is the name's, else (for a key of 3 characters or more) the first whose key starts with
-- the name's or begins it (queries.unknown_agent on SQLite).
CREATE OR REPLACE FUNCTION ar__unknown_agent(p_team bigint, p_name text) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_given text := ar__name_key(p_name);
    v_close text;
BEGIN
    IF v_given <> '' THEN
        SELECT display_name INTO v_close FROM ar_agents
        WHERE team_id = p_team AND ar__name_key(display_name) = v_given ORDER BY id LIMIT 1;
        IF v_close IS NULL AND length(v_given) >= 3 THEN
            SELECT display_name INTO v_close FROM ar_agents a,
                LATERAL (SELECT ar__name_key(a.display_name) AS k) key
            WHERE a.team_id = p_team AND key.k <> ''
                AND (starts_with(key.k, v_given) OR starts_with(v_given, key.k))
            ORDER BY a.id LIMIT 1;
        END IF;
    END IF;
    RETURN jsonb_build_object('name', p_name, 'team_id', p_team)
        || CASE WHEN v_close IS NULL THEN '{}' ELSE jsonb_build_object('close', v_close) END;
END $$;

-- Which state may follow which (an illegal move is a bug of the store, and raises): `idle`
-- follows any live state (a stop), `terminated` is final.
CREATE OR REPLACE FUNCTION ar__can_move(p_from ar_agent_state, p_to ar_agent_state)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE p_from
        WHEN 'idle' THEN p_to IN ('scheduled', 'idle', 'terminated')
        WHEN 'completed' THEN p_to IN ('scheduled', 'idle', 'terminated')
        WHEN 'scheduled' THEN p_to IN ('scheduled', 'running', 'idle', 'terminated')
        WHEN 'running' THEN p_to IN ('waiting', 'scheduled', 'completed', 'idle', 'terminated')
        WHEN 'waiting' THEN p_to IN ('waiting', 'running', 'scheduled', 'completed', 'idle',
                                     'terminated')
        ELSE false
    END;
END $$;

-- The one way an agent changes state.
CREATE OR REPLACE FUNCTION ar__move(INOUT a ar_agents, p_to ar_agent_state)
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ar__can_move(a.state, p_to) THEN
        RAISE EXCEPTION 'illegal transition of agent %: % -> %', a.id, a.state, p_to
            USING ERRCODE = 'P0001';
    END IF;
    a.state := p_to;
END $$;

-- The agent's row as the transition left it (`p_window` not NULL: its request window there
-- too). A row the transition left as it was is not written again: an UPDATE that changes
-- nothing still writes a new version of the row.
CREATE OR REPLACE FUNCTION ar__save_agent(a ar_agents, p_window jsonb DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    UPDATE ar_agents SET
        state = a.state, suspended = a.suspended, epoch = a.epoch,
        pending_trigger = a.pending_trigger, next_seq = a.next_seq,
        next_position = a.next_position, stop_requested = a.stop_requested,
        scheduled_at = a.scheduled_at, context_window = coalesce(p_window, context_window)
    WHERE id = a.id AND (
        p_window IS NOT NULL
        OR (state, suspended, epoch, pending_trigger, next_seq, next_position, stop_requested,
            scheduled_at)
           IS DISTINCT FROM (a.state, a.suspended, a.epoch, a.pending_trigger, a.next_seq,
                             a.next_position, a.stop_requested, a.scheduled_at));
END $$;

-- A ledger event, written now and listed in the result's "events" (the store logs them; the
-- agent's display name, when the transition has it, is for the log line only).
CREATE OR REPLACE FUNCTION ar__event(
    INOUT o jsonb, p_action ar_ledger_action, p_team bigint, p_agent bigint, p_now timestamp,
    p_detail jsonb DEFAULT '{}', p_outcome ar_route_outcome DEFAULT NULL,
    p_message bigint DEFAULT NULL, p_turn bigint DEFAULT NULL, p_epoch integer DEFAULT NULL,
    p_agent_name text DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ar_ledger
        (team_id, agent_id, action, outcome, message_id, turn_id, epoch, detail, created_at)
    VALUES (p_team, p_agent, p_action, p_outcome, p_message, p_turn, p_epoch, p_detail, p_now);
    o := jsonb_set(o, '{events}', (o -> 'events') || jsonb_build_array(jsonb_build_object(
        'action', p_action, 'team_id', p_team, 'agent_id', p_agent, 'outcome', p_outcome,
        'message_id', p_message, 'turn_id', p_turn, 'epoch', p_epoch, 'detail', p_detail,
        'agent', p_agent_name)));
END $$;

-- An event about an agent: its team, id and name from the row.
CREATE OR REPLACE FUNCTION ar__agent_event(
    INOUT o jsonb, p_action ar_ledger_action, a ar_agents, p_now timestamp,
    p_detail jsonb DEFAULT '{}', p_outcome ar_route_outcome DEFAULT NULL,
    p_message bigint DEFAULT NULL, p_turn bigint DEFAULT NULL, p_epoch integer DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
    o := ar__event(o, p_action, a.team_id, a.id, p_now, p_detail, p_outcome, p_message,
                     p_turn, p_epoch, a.display_name);
END $$;

-- An outbox row for the agent's current epoch, listed in the result's "outbox" (published
-- after the commit). A turn task carries the agent's name and team for monitors, and the
-- host's task when a host owns the agent's turns. A wake row is written marked published: its
-- signal is sent once, and a lost one is found by the waiter's periodic re-read.
CREATE OR REPLACE FUNCTION ar__outbox(
    INOUT o jsonb, a ar_agents, p_kind ar_outbox_kind, p_payload jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
    v_payload jsonb := p_payload;
    -- A message to the user of a team with no user task: its signal only wakes the feed.
    v_wake boolean := p_kind = 'wake_waiter'
                      OR (p_kind = 'deliver_user' AND p_payload ->> 'task' IS NULL);
BEGIN
    IF p_kind = 'enqueue_turn' THEN
        v_payload := jsonb_build_object('agent', a.display_name, 'team_id', a.team_id)
            || v_payload;
        IF a.runner IS NOT NULL THEN
            v_payload := v_payload || jsonb_build_object('task', a.runner);
        END IF;
    END IF;
    INSERT INTO ar_outbox (team_id, agent_id, kind, epoch, payload, created_at, published_at,
                           attempts)
    VALUES (a.team_id, a.id, p_kind, a.epoch, v_payload, p_now,
            CASE WHEN v_wake THEN p_now END, CASE WHEN v_wake THEN 1 ELSE 0 END)
    RETURNING id INTO v_id;
    o := jsonb_set(o, '{outbox}', (o -> 'outbox') || jsonb_build_array(jsonb_build_object(
        'id', v_id, 'kind', p_kind, 'agent_id', a.id, 'epoch', a.epoch, 'payload', v_payload)));
END $$;

-- Fence a new epoch and enqueue exactly one turn task for it (through the outbox).
CREATE OR REPLACE FUNCTION ar__schedule(
    INOUT a ar_agents, INOUT o jsonb, p_trigger ar_turn_trigger, p_now timestamp)
LANGUAGE plpgsql AS $$
BEGIN
    a.epoch := a.epoch + 1;
    a := ar__move(a, 'scheduled');
    a.pending_trigger := p_trigger;
    a.scheduled_at := p_now;
    o := ar__outbox(o, a, 'enqueue_turn', jsonb_build_object('trigger', p_trigger), p_now);
END $$;

-- One entry at the end of the agent's transcript; the position is the agent's counter.
CREATE OR REPLACE FUNCTION ar__append(
    INOUT a ar_agents, p_payload jsonb, p_turn bigint, p_now timestamp,
    p_message bigint DEFAULT NULL, p_meta jsonb DEFAULT NULL)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ar_transcript_entries
        (agent_id, position, role, payload, meta, message_id, tool_call_id, turn_id, created_at)
    VALUES (a.id, a.next_position, p_payload ->> 'role', p_payload, p_meta, p_message,
            p_payload ->> 'tool_call_id', p_turn, p_now);
    a.next_position := a.next_position + 1;
END $$;

-- The ids of the tool calls of the agent's last assistant message that have no result yet,
-- in order. Two statements: the results are looked for after the message's position as a
-- value, so that only the entries after it are read (a join on it reads every tool result
-- of the transcript).
CREATE OR REPLACE FUNCTION ar__open_tool_calls(p_agent bigint) RETURNS text[]
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_position integer;
    v_calls jsonb;
BEGIN
    SELECT position, payload -> 'tool_calls' INTO v_position, v_calls
    FROM ar_transcript_entries
    WHERE agent_id = p_agent AND role = 'assistant'
    ORDER BY position DESC LIMIT 1;
    IF NOT FOUND OR jsonb_typeof(v_calls) IS DISTINCT FROM 'array' THEN
        RETURN '{}';
    END IF;
    RETURN (SELECT coalesce(array_agg(call.value ->> 'id' ORDER BY call.n), '{}')
    FROM jsonb_array_elements(v_calls) WITH ORDINALITY AS call(value, n)
    WHERE NOT EXISTS (
        SELECT 1 FROM ar_transcript_entries later
        WHERE later.agent_id = p_agent AND later.position > v_position
          AND later.role = 'tool' AND later.tool_call_id = call.value ->> 'id'
    ));
END $$;

-- Every open tool call but `p_keep` gets the synthetic result `p_result` (an interrupted or
-- cancelled call); how many in "closed".
CREATE OR REPLACE FUNCTION ar__close_dangling(
    INOUT a ar_agents, INOUT o jsonb, p_turn bigint, p_result text, p_keep text,
    p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_call text;
    v_closed integer := 0;
BEGIN
    FOREACH v_call IN ARRAY ar__open_tool_calls(a.id) LOOP
        CONTINUE WHEN v_call = p_keep;
        a := ar__append(a, jsonb_build_object('role', 'tool', 'tool_call_id', v_call,
                                              'content', p_result),
                        p_turn, p_now, NULL,
                        jsonb_build_object('synthetic', split_part(p_result, ':', 1)));
        o := ar__agent_event(o, 'synthetic_tool_result', a, p_now,
                             jsonb_build_object('tool_call_id', v_call, 'result', p_result),
                             p_turn => p_turn);
        v_closed := v_closed + 1;
    END LOOP;
    o := jsonb_set(o, '{closed}', to_jsonb(v_closed));
END $$;

-- The question an agent is blocked on, locked; NULL if none.
CREATE OR REPLACE FUNCTION ar__waiting_question(p_agent bigint) RETURNS ar_questions
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    q ar_questions;
BEGIN
    SELECT * INTO q FROM ar_questions WHERE asker_agent_id = p_agent AND waiting
    FOR NO KEY UPDATE;
    RETURN q;
END $$;

-- The one way a question closes: answered (with its answer), expired or cancelled.
-- `p_stop_waiting`: the asker is no longer blocked on it either.
CREATE OR REPLACE FUNCTION ar__close_question(
    INOUT q ar_questions, p_status ar_question_status, p_now timestamp,
    p_answer bigint DEFAULT NULL, p_stop_waiting boolean DEFAULT false)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_status = 'open' OR (p_status = 'answered') <> (p_answer IS NOT NULL) THEN
        RAISE EXCEPTION 'question %: cannot close it as %', q.id, p_status USING ERRCODE = 'P0001';
    END IF;
    q.status := p_status;
    q.answer_message_id := coalesce(p_answer, q.answer_message_id);
    q.waiting := q.waiting AND NOT p_stop_waiting;
    q.closed_at := p_now;
    UPDATE ar_questions SET status = q.status, answer_message_id = q.answer_message_id,
                            waiting = q.waiting, closed_at = q.closed_at
    WHERE id = q.id;
END $$;

-- The turn a waiter blocks in (its epoch when it asked).
CREATE OR REPLACE FUNCTION ar__waiter_turn(p_agent bigint, p_epoch integer) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT id FROM ar_turns WHERE agent_id = p_agent AND epoch = p_epoch);
END $$;

-- A wait ends: `p_result` becomes the blocked call's result, `p_action` is ledgered with
-- `p_detail`, and the waiter continues: woken if it blocks in a worker, a continuation turn
-- if it is suspended.
CREATE OR REPLACE FUNCTION ar__end_wait(
    INOUT a ar_agents, INOUT o jsonb, q ar_questions, p_result text,
    p_action ar_ledger_action, p_turn bigint, p_message bigint, p_meta jsonb,
    p_detail jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    UPDATE ar_questions SET waiting = false WHERE id = q.id;
    a := ar__append(a, jsonb_build_object('role', 'tool', 'tool_call_id', q.tool_call_id,
                                          'content', p_result),
                    p_turn, p_now, p_message, p_meta);
    o := ar__agent_event(o, p_action, a, p_now,
                         jsonb_build_object('question_id', q.id) || p_detail,
                         p_message => p_message, p_epoch => a.epoch);
    IF a.suspended THEN
        a.suspended := false;
        r := ar__schedule(a, o, 'continuation', p_now);
        a := r.a;
        o := r.o;
    ELSE
        a := ar__move(a, 'running');
        o := ar__outbox(o, a, 'wake_waiter', jsonb_build_object(
            'question_id', q.id,
            'token', to_char(q.deadline, 'YYYY-MM-DD"T"HH24:MI:SS.US')), p_now);
    END IF;
END $$;

-- A message as it enters a transcript (formats.render): the router's envelope around the
-- content as the sender's text appears inside one (`p_body`, written by the router when the
-- message was accepted).
CREATE OR REPLACE FUNCTION ar__envelope(
    p_type ar_message_type, p_sender text, p_id bigint, p_subtype ar_message_subtype,
    p_question bigint, p_body text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN '<agent-message type="' || p_type || '" from="' || p_sender || '" message_id="'
        || p_id || '"'
        || coalesce(' subtype="' || p_subtype || '"', '')
        || coalesce(' question_id="' || p_question || '"', '')
        || E'>\n' || p_body || E'\n</agent-message>';
END $$;

-- A message's structured metadata on its transcript entry (formats.metadata).
CREATE OR REPLACE FUNCTION ar__metadata(m ar_messages) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('message_id', m.id, 'type', m.type, 'subtype', m.subtype,
                              'from', m.source_name, 'question_id', m.question_id, 'seq', m.seq);
END $$;

-- A refusal: its code (store/refusals.py: the error class and message the store raises) and
-- the fields its message is rendered from, in the result's "refused". Nothing of the
-- transition is written.
CREATE OR REPLACE FUNCTION ar__refused(INOUT o jsonb, p_code text, p_fields jsonb DEFAULT '{}')
LANGUAGE plpgsql AS $$
BEGIN
    o := jsonb_set(o, '{refused}', jsonb_build_object('code', p_code, 'fields', p_fields));
END $$;
