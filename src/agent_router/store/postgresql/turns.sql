-- A turn's transitions on PostgreSQL, under its agent's row lock and checked against the fence:
-- claim, drain, append, before and after a model call, end, suspend, stop. The SQLite implementation of the same transitions
-- is store/turns.py.

-- Lock the turn's agent and check the fence: a stale turn (its agent gone, another epoch, the
-- turn no longer running, the agent neither running nor waiting) writes nothing, and its
-- refusal is a `stale_write_refused` event naming `p_operation`.
-- A function of a turn opens with it in four statements: the call, its row and result taken
-- out of the record it returns (PL/pgSQL takes a record apart only field by field: a row
-- variable cannot be one of several INTO targets), and the refusal returned (no function
-- returns from its caller, and an exception carrying the refusal out would cost every call a
-- subtransaction and roll back the refusal's event with it).
CREATE OR REPLACE FUNCTION ar__fenced(
    INOUT a ar_agents, INOUT o jsonb, p_turn bigint, p_agent bigint, p_epoch integer,
    p_operation text)
LANGUAGE plpgsql AS $$
DECLARE
    v_status ar_turn_status;
    v_turn_found boolean;
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent FOR NO KEY UPDATE;
    SELECT status INTO v_status FROM ar_turns WHERE id = p_turn;
    v_turn_found := FOUND;
    IF a.id IS NOT NULL AND v_turn_found AND a.epoch = p_epoch AND v_status = 'running'
       AND a.state IN ('running', 'waiting') THEN
        RETURN;
    END IF;
    o := ar__refused(o, 'stale_turn', jsonb_build_object(
        'turn_id', p_turn, 'epoch', p_epoch, 'operation', p_operation));
    o := jsonb_set(o, '{refused,event}', jsonb_build_object(
        'action', 'stale_write_refused', 'team_id', a.team_id,
        -- A deleted team's rows are gone: the event then names them only in its detail.
        'agent_id', CASE WHEN a.id IS NOT NULL THEN p_agent END,
        'turn_id', CASE WHEN v_turn_found THEN p_turn END, 'epoch', p_epoch,
        'detail', jsonb_build_object('operation', p_operation, 'current_epoch', a.epoch)
            || CASE WHEN a.id IS NOT NULL AND v_turn_found THEN '{}'::jsonb
                    ELSE jsonb_build_object('deleted_agent_id', p_agent, 'turn', p_turn) END));
END $$;

-- A write (`p_operation`) of a current turn refused: ledgered as a stale write.
CREATE OR REPLACE FUNCTION ar__write_refused(
    INOUT o jsonb, a ar_agents, p_turn bigint, p_operation text, p_code text, p_fields jsonb,
    p_detail jsonb DEFAULT '{}')
LANGUAGE plpgsql AS $$
BEGIN
    o := jsonb_set(ar__refused(o, p_code, p_fields), '{refused,event}', jsonb_build_object(
        'action', 'stale_write_refused', 'team_id', a.team_id, 'agent_id', a.id,
        'turn_id', p_turn, 'detail', jsonb_build_object('operation', p_operation) || p_detail));
END $$;

-- Refuse `p_operation` while tool calls of the last assistant message have no result (the
-- refusal `p_code`, naming them); `p_ledger_calls`: the event names them.
CREATE OR REPLACE FUNCTION ar__refuse_open_tool_calls(
    INOUT o jsonb, a ar_agents, p_turn bigint, p_operation text, p_code text,
    p_ledger_calls boolean DEFAULT false)
LANGUAGE plpgsql AS $$
DECLARE
    v_open text[] := ar__open_tool_calls(a.id);
BEGIN
    IF cardinality(v_open) > 0 THEN
        o := ar__write_refused(o, a, p_turn, p_operation, p_code,
            jsonb_build_object('calls', to_jsonb(v_open)),
            CASE WHEN p_ledger_calls THEN jsonb_build_object('dangling', to_jsonb(v_open))
                 ELSE '{}'::jsonb END);
    END IF;
END $$;

-- Claim the scheduled turn of `p_epoch` (NULL: the current one) and count it against the
-- team's budgets. The result's "claim" is NULL when there is nothing to claim (a duplicate or
-- stale delivery, or no turn scheduled: a `claim_refused` event); else the turn, the agent's
-- team and name, and "budget" the check of the team's budgets. `p_builtin`: the claim is the
-- built-in loop's, which runs no turn of an agent whose turns a host's task runs. `p_first`:
-- the claim also makes the transition before the turn's first model call (ar_before_call,
-- nothing carried; "before" its result), unless the turn must first stop (a budget spent, a
-- stop requested) or run the open tool calls of its agent's last reply. It reads back the
-- entries after `p_after` with `p_kept` (the loop's kept window took in those before), else all
-- of them unless the agent has a window checkpoint.
CREATE OR REPLACE FUNCTION ar_claim(
    p_agent bigint, p_epoch integer, p_builtin boolean, p_lease_seconds float8,
    p_ratio float8, p_defaults jsonb, p_first boolean, p_kept boolean, p_after integer,
    p_limit integer, p_stopped text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    t ar_turns;
    b jsonb;
    v_now timestamp;
    v_trigger ar_turn_trigger;
    v_open text[];
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'no_agent_id', jsonb_build_object('agent_id', p_agent));
    END IF;
    IF p_builtin AND a.runner IS NOT NULL THEN
        RETURN ar__refused(o, 'host_owned', jsonb_build_object('runner', a.runner));
    END IF;
    v_now := ar__now();
    IF a.state <> 'scheduled' OR (p_epoch IS NOT NULL AND p_epoch <> a.epoch) THEN
        o := ar__agent_event(o, 'claim_refused', a, v_now,
            jsonb_build_object('current_epoch', a.epoch, 'state', a.state), p_epoch => p_epoch);
        RETURN o || '{"claim": null}';
    END IF;
    v_trigger := coalesce(a.pending_trigger, 'new');
    a := ar__move(a, 'running');
    a.pending_trigger := NULL;
    PERFORM ar__save_agent(a);
    INSERT INTO ar_turns (team_id, agent_id, epoch, trigger, status, started_at, lease_expires_at)
    VALUES (a.team_id, a.id, a.epoch, v_trigger, 'running', v_now,
            v_now + make_interval(secs => p_lease_seconds))
    RETURNING * INTO t;
    o := ar__agent_event(o, 'turn_claimed', a, v_now, jsonb_build_object('trigger', v_trigger),
                         p_turn => t.id, p_epoch => a.epoch);
    -- The agent's lock, then the budget's: no transaction takes them the other way round.
    o := ar__charge(o, a.team_id, a.id, t.id, true, p_ratio, p_defaults, v_now);
    v_open := ar__open_tool_calls(a.id);
    o := o || jsonb_build_object('claim', jsonb_build_object(
        'turn', to_jsonb(t), 'team_id', a.team_id, 'display_name', a.display_name,
        'agent', to_jsonb(a),
        'lead', CASE WHEN a.is_lead THEN a.display_name ELSE (
            SELECT l.display_name FROM ar_agents l WHERE l.team_id = a.team_id AND l.is_lead) END,
        'checkpoint', a.context_window, 'open_calls', to_jsonb(v_open)));
    IF p_first AND (o -> 'budget' ->> 'ok')::boolean AND NOT a.stop_requested
       AND cardinality(v_open) = 0 THEN
        b := ar_before_call(t.id, a.id, a.epoch, '[]', p_kept OR a.context_window IS NULL,
                            CASE WHEN p_kept THEN p_after END, p_limit, p_lease_seconds, p_ratio,
                            p_defaults, p_stopped);
        o := o || jsonb_build_object(
            'events', (o -> 'events') || (b -> 'events'),
            'outbox', (o -> 'outbox') || (b -> 'outbox'),
            'before', b - 'events' - 'outbox');
    END IF;
    RETURN o;
END $$;

-- The results a turn carried (`p_results`: [[tool call id, content, meta], ...]; the meta, how
-- the call ran or null, is the entry's) appended, each the result of an open tool call of the
-- last assistant message; `p_close`: together they must close its calls (a drain follows). All are checked before any is written: a refusal writes
-- nothing.
CREATE OR REPLACE FUNCTION ar__carried(
    INOUT a ar_agents, INOUT o jsonb, p_turn bigint, p_results jsonb, p_close boolean,
    p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_open text[] := ar__open_tool_calls(a.id);
    v_result jsonb;
BEGIN
    FOR v_result IN SELECT value FROM jsonb_array_elements(p_results) LOOP
        IF NOT (v_result ->> 0) = ANY (v_open) THEN
            o := ar__write_refused(o, a, p_turn, 'append_tool_result', 'not_open_tool_call',
                                   jsonb_build_object('call', v_result ->> 0));
            RETURN;
        END IF;
        v_open := array_remove(v_open, v_result ->> 0);
    END LOOP;
    IF p_close AND cardinality(v_open) > 0 THEN
        o := ar__write_refused(o, a, p_turn, 'drain', 'calls_open_at_drain',
            jsonb_build_object('calls', to_jsonb(v_open)),
            jsonb_build_object('dangling', to_jsonb(v_open)));
        RETURN;
    END IF;
    FOR v_result IN SELECT value FROM jsonb_array_elements(p_results) LOOP
        a := ar__append(a, jsonb_build_object('role', 'tool', 'tool_call_id', v_result ->> 0,
                                              'content', v_result ->> 1), p_turn, p_now,
                        NULL, nullif(v_result -> 2, 'null'::jsonb));
    END LOOP;
END $$;

-- Everything a turn does before a model call: the results it carried appended (they close the
-- last batch), its lease renewed, then a stop requested honoured ("stopped"), else the model
-- call charged to the team's budgets ("budget") and, if it may be made, a batch of pending
-- messages drained ("messages"; "more": others are pending). Returns what the loop builds its
-- request from: the team's agents ("roster") and, with `p_read`, the transcript entries after
-- position `p_after` (all with NULL): "rows", [position, payload] pairs.
CREATE OR REPLACE FUNCTION ar_before_call(
    p_turn bigint, p_agent bigint, p_epoch integer, p_results jsonb, p_read boolean,
    p_after integer,
    p_limit integer, p_lease_seconds float8, p_ratio float8, p_defaults jsonb, p_stopped text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
    v_now timestamp;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'before_call');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF a.state <> 'running' THEN
        o := ar__write_refused(o, a, p_turn, 'drain', 'cannot_drain',
                               jsonb_build_object('name', a.display_name, 'state', a.state));
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    v_now := ar__now();
    r := ar__carried(a, o, p_turn, p_results, true, v_now);
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    UPDATE ar_turns SET lease_expires_at = v_now + make_interval(secs => p_lease_seconds)
    WHERE id = p_turn;
    IF a.stop_requested THEN
        r := ar__stop_turn(a, o, p_turn, ar__requested_stop_reason(a), p_stopped, v_now);
        PERFORM ar__save_agent(r.a);
        RETURN r.o || '{"stopped": true}';
    END IF;
    o := ar__charge(o, a.team_id, a.id, p_turn, false, p_ratio, p_defaults, v_now);
    IF o ? 'refused' OR NOT (o -> 'budget' ->> 'ok')::boolean THEN
        PERFORM ar__save_agent(a);
        RETURN o;
    END IF;
    -- The fence, the state and the open tool calls were checked above (the carried results
    -- close the last batch): the drain runs on the row in hand, which is written once.
    r := ar__drain(a, o, p_turn, p_epoch, p_limit);
    a := r.a;
    o := r.o;
    PERFORM ar__save_agent(a);
    RETURN o || jsonb_build_object(
        'more', jsonb_array_length(o -> 'messages') = p_limit AND EXISTS (
            SELECT 1 FROM ar_messages WHERE target_agent_id = a.id AND status = 'pending'),
        -- The columns an Agent is made of (values.AGENT_FIELDS) only: not a system prompt or
        -- a request window of every agent of the team at every model call.
        'roster', (SELECT jsonb_agg(jsonb_build_object(
                       'id', m.id, 'team_id', m.team_id, 'display_name', m.display_name,
                       'role', m.role, 'is_lead', m.is_lead, 'state', m.state,
                       'suspended', m.suspended, 'epoch', m.epoch,
                       'pending_trigger', m.pending_trigger,
                       'stop_requested', m.stop_requested, 'runner', m.runner) ORDER BY m.id)
                   FROM ar_agents m WHERE m.team_id = a.team_id),
        'rows', CASE WHEN p_read THEN (
            SELECT coalesce(jsonb_agg(jsonb_build_array(e.position, e.payload)
                                      ORDER BY e.position), '[]')
            FROM ar_transcript_entries e
            WHERE e.agent_id = a.id AND (p_after IS NULL OR e.position > p_after)) END);
END $$;

-- Everything a turn does after a model call: its usage recorded (when given: `p_prompt` not
-- NULL, as ar_record_usage; `p_ms`: how long the call took), then, if a stop was requested meanwhile, the stop honoured and the
-- reply left out ("stopped"); else the reply appended and the turn's lease renewed. A reply
-- that calls no tool reads the questions open to the agent ("questions", with the names of
-- their askers and of the agent): the loop's reminders look at them before the turn ends.
CREATE OR REPLACE FUNCTION ar_after_call(
    p_turn bigint, p_agent bigint, p_epoch integer, p_payload jsonb, p_model text,
    p_prompt bigint, p_completion bigint, p_cached bigint, p_cost_nano bigint,
    p_estimated boolean, p_priced boolean, p_ratio float8, p_defaults jsonb, p_context jsonb,
    p_window jsonb, p_ms bigint, p_lease_seconds float8, p_stopped text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
    v_now timestamp;
    v_window jsonb;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'append_assistant');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF NOT a.stop_requested THEN
        o := ar__refuse_open_tool_calls(o, a, p_turn, 'append_assistant',
                                        'calls_open_at_append');
        IF o ? 'refused' THEN
            RETURN ar__refusal_event(o, ar__now());
        END IF;
    END IF;
    IF p_prompt IS NOT NULL THEN
        -- The request window is written with the agent's row below, not by the usage's own
        -- UPDATE of it.
        o := ar__merge(o, ar_record_usage(
            a.team_id, a.id, p_turn, p_model, p_prompt, p_completion, p_cached, p_cost_nano,
            p_estimated, p_priced, p_ratio, p_defaults, p_context, NULL, p_ms,
            a.display_name));
        IF NOT o ? 'refused' THEN
            v_window := p_window;
        END IF;
    END IF;
    v_now := ar__now();
    IF a.stop_requested THEN
        r := ar__stop_turn(a, o, p_turn, ar__requested_stop_reason(a), p_stopped, v_now);
        PERFORM ar__save_agent(r.a, v_window);
        RETURN r.o || '{"stopped": true, "questions": []}';
    END IF;
    a := ar__append(a, p_payload, p_turn, v_now);
    PERFORM ar__save_agent(a, v_window);
    UPDATE ar_turns SET lease_expires_at = v_now + make_interval(secs => p_lease_seconds)
    WHERE id = p_turn;
    RETURN o || jsonb_build_object('questions', CASE
        WHEN jsonb_array_length(coalesce(p_payload -> 'tool_calls', '[]')) > 0 THEN '[]'::jsonb
        ELSE (SELECT coalesce(jsonb_agg(to_jsonb(q) || jsonb_build_object(
                  'asker', s.display_name, 'target', a.display_name) ORDER BY q.id), '[]')
              FROM ar_questions q JOIN ar_agents s ON s.id = q.asker_agent_id
              WHERE q.target_agent_id = a.id AND q.status = 'open' AND q.kind = 'ask') END);
END $$;

-- Move pending messages, in sequence order, into the transcript as user entries, consumed in
-- this transaction (at most `p_limit`). Of one sender's progress narration in a drain only the
-- latest is read; the others are dropped as superseded. Refused while the last assistant tool
-- calls still lack results. The result's "messages": those delivered.
CREATE OR REPLACE FUNCTION ar_drain(p_turn bigint, p_agent bigint, p_epoch integer,
                                    p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'drain');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF a.state <> 'running' THEN
        o := ar__write_refused(o, a, p_turn, 'drain', 'cannot_drain',
                               jsonb_build_object('name', a.display_name, 'state', a.state));
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    o := ar__refuse_open_tool_calls(o, a, p_turn, 'drain', 'calls_open_at_drain', true);
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    r := ar__drain(a, o, p_turn, p_epoch, p_limit);
    PERFORM ar__save_agent(r.a);
    RETURN r.o;
END $$;

-- The drain of a running agent `a` whose last tool calls all have results, checked by the
-- caller, which saves the agent's row: ar_drain's work after its checks.
CREATE OR REPLACE FUNCTION ar__drain(
    INOUT a ar_agents, INOUT o jsonb, p_turn bigint, p_epoch integer, p_limit integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamp;
    v_first integer;
    v_count integer;
    v_delivered jsonb;
    v_superseded jsonb;
BEGIN
    v_now := ar__now();
    v_first := a.next_position;
    WITH batch AS (
        SELECT m.*, row_number() OVER (ORDER BY m.seq) AS k,
               max(m.id) FILTER (WHERE m.subtype = 'progress_output')
                   OVER (PARTITION BY m.source_name) AS latest
        FROM (SELECT * FROM ar_messages
              WHERE target_agent_id = a.id AND status = 'pending'
              ORDER BY seq LIMIT p_limit) m
    ),
    superseded AS (
        UPDATE ar_messages m SET status = 'dropped', drop_reason = format(
            'superseded by progress output %s: only the latest progress of a sender reaches '
            'the reader per drain', b.latest)
        FROM batch b
        WHERE m.id = b.id AND b.subtype = 'progress_output' AND b.id <> b.latest
        RETURNING m.id
    ),
    delivered AS (
        SELECT b.*, row_number() OVER (ORDER BY b.seq) - 1 AS offset_
        FROM batch b
        WHERE b.subtype IS DISTINCT FROM 'progress_output' OR b.id = b.latest
    ),
    consumed AS (
        UPDATE ar_messages m SET status = 'delivered', consumed_turn_id = p_turn,
                                 consumed_at = v_now
        FROM delivered d WHERE m.id = d.id
        RETURNING m.*
    ),
    entries AS (
        INSERT INTO ar_transcript_entries (agent_id, position, role, payload, meta, message_id,
                                           turn_id, created_at)
        SELECT a.id, v_first + d.offset_, 'user',
               jsonb_build_object('role', 'user', 'content', ar__envelope(
                   d.type, d.source_name, d.id, d.subtype, d.question_id,
                   coalesce(d.body, d.content))),
               jsonb_build_object('message_id', d.id, 'type', d.type, 'subtype', d.subtype,
                                  'from', d.source_name, 'question_id', d.question_id,
                                  'seq', d.seq),
               d.id, p_turn, v_now
        FROM delivered d
        RETURNING message_id
    )
    SELECT (SELECT count(*) FROM entries),
           (SELECT coalesce(jsonb_agg(to_jsonb(c) - 'body' ORDER BY c.seq), '[]') FROM consumed c),
           (SELECT jsonb_agg(s.id ORDER BY s.id) FROM superseded s)
    INTO v_count, v_delivered, v_superseded;
    IF v_count = 0 THEN
        o := o || jsonb_build_object('messages', '[]'::jsonb, 'target', a.display_name);
        RETURN;
    END IF;
    a.next_position := a.next_position + v_count;
    o := ar__agent_event(o, 'drain', a, v_now, jsonb_build_object(
            'count', v_count, 'first_seq', v_delivered -> 0 -> 'seq',
            'last_seq', v_delivered -> -1 -> 'seq', 'superseded', v_superseded),
        p_turn => p_turn, p_epoch => p_epoch);
    o := o || jsonb_build_object('messages', v_delivered, 'target', a.display_name);
END $$;

-- Append to a current turn's transcript: an assistant message (`p_call` NULL), which follows
-- no open tool call, or the result of the open tool call `p_call` (`p_meta`: how it ran).
CREATE OR REPLACE FUNCTION ar_append(p_turn bigint, p_agent bigint, p_epoch integer,
                                     p_payload jsonb, p_call text, p_meta jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
    v_operation text := CASE WHEN p_call IS NULL THEN 'append_assistant'
                             ELSE 'append_tool_result' END;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, v_operation);
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF p_call IS NULL THEN
        o := ar__refuse_open_tool_calls(o, a, p_turn, v_operation, 'calls_open_at_append');
    ELSIF NOT p_call = ANY (ar__open_tool_calls(a.id)) THEN
        o := ar__write_refused(o, a, p_turn, v_operation, 'not_open_tool_call',
                               jsonb_build_object('call', p_call));
    END IF;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    a := ar__append(a, p_payload, p_turn, ar__now(), NULL, p_meta);
    PERFORM ar__save_agent(a);
    RETURN o;
END $$;

-- Cancel the open questions the agent asked (a stop): it no longer waits on any.
CREATE OR REPLACE FUNCTION ar__cancel_own_questions(p_agent bigint, p_now timestamp)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE ar_questions SET status = 'cancelled', waiting = false, closed_at = p_now
    WHERE asker_agent_id = p_agent AND status = 'open';
END $$;

-- Why the agent was asked to stop (the lead's reason, a spent budget's): the reason of its
-- latest stop_requested event, which the stop it honours at a boundary records.
CREATE OR REPLACE FUNCTION ar__requested_stop_reason(a ar_agents) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce((
        SELECT l.detail ->> 'reason' FROM ar_ledger l
        WHERE l.team_id = a.team_id AND l.agent_id = a.id AND l.action = 'stop_requested'
        ORDER BY l.id DESC LIMIT 1), 'stop requested');
END $$;

-- The turn honours a stop: the rest of its batch gets cancelled results (`p_stopped`), its
-- open questions are cancelled, the agent is idle (mailbox kept), with no wait suspended, no
-- turn scheduled and no stop pending. A stop the user's interrupt requested (its event's
-- "restart") then starts one follow-up turn for the wake messages pending: `restarted`.
CREATE OR REPLACE FUNCTION ar__stop_turn(
    INOUT a ar_agents, INOUT o jsonb, p_turn bigint, p_reason text, p_stopped text,
    p_now timestamp, OUT restarted boolean)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_restart boolean := a.stop_requested AND coalesce((
        SELECT (l.detail ->> 'restart')::boolean FROM ar_ledger l
        WHERE l.team_id = a.team_id AND l.agent_id = a.id AND l.action = 'stop_requested'
        ORDER BY l.id DESC LIMIT 1), false);
BEGIN
    r := ar__close_dangling(a, o, p_turn, p_stopped, NULL, p_now);
    a := r.a;
    o := r.o;
    PERFORM ar__cancel_own_questions(a.id, p_now);
    UPDATE ar_turns SET status = 'stopped', ended_at = p_now WHERE id = p_turn;
    a := ar__move(a, 'idle');
    a.suspended := false;
    a.pending_trigger := NULL;
    a.stop_requested := false;
    o := ar__agent_event(o, 'stopped', a, p_now, jsonb_build_object(
            'reason', p_reason, 'cancelled_tool_calls', o -> 'closed'),
        p_turn => p_turn, p_epoch => a.epoch);
    restarted := v_restart AND EXISTS (
        SELECT 1 FROM ar_messages WHERE target_agent_id = a.id AND status = 'pending' AND wake);
    IF restarted THEN
        r := ar__schedule(a, o, 'follow_up', p_now);
        a := r.a;
        o := ar__agent_event(r.o, 'follow_up', a, p_now, p_turn => p_turn, p_epoch => a.epoch);
    END IF;
END $$;

-- The end-of-turn hook. First the turn's final output: the lead's answer to the user in parts
-- (`p_answers`: [{content, dedup_key}], each written as ar_tell_user writes it), or a
-- sub-agent's report to its lead (`p_reports`, routed as ar_send_many routes them); a refused
-- output refuses the end, nothing else written. Then the results the turn carried
-- (`p_results`, as ar__carried), and one follow-up turn if wake messages are pending, else
-- completed. A stop requested is honoured (unless the turn failed); a turn that ends while
-- blocked on a question leaves it open, suspended; every other open tool call gets
-- `p_interrupted`. The result's "deliveries": the report's.
CREATE OR REPLACE FUNCTION ar_end(
    p_turn bigint, p_agent bigint, p_epoch integer, p_failed boolean, p_error text,
    p_interrupted text, p_stopped text, p_results jsonb, p_answers jsonb, p_reports jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    q ar_questions;
    r record;
    v_part jsonb;
    v_now timestamp;
    v_follow_up boolean := false;
    v_closed integer;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'end');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    FOR v_part IN SELECT value FROM jsonb_array_elements(coalesce(p_answers, '[]')) LOOP
        o := ar__merge(o, ar_tell_user(p_turn, p_agent, p_epoch, 'answer',
                                       v_part ->> 'content', v_part ->> 'dedup_key'));
    END LOOP;
    IF p_reports IS NOT NULL THEN
        o := ar__merge(o, ar_send_many(a.team_id, a.display_name, false, p_reports));
    END IF;
    IF o ? 'refused' THEN
        RETURN o;
    END IF;
    o := o - 'user_message' - 'duplicate';
    v_now := ar__now();
    r := ar__carried(a, o, p_turn, p_results, false, v_now);
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF a.stop_requested AND NOT p_failed THEN
        r := ar__stop_turn(a, o, p_turn, ar__requested_stop_reason(a), p_stopped, v_now);
        a := r.a;
        o := r.o;
        PERFORM ar__save_agent(a);
        RETURN o || jsonb_build_object('ended', jsonb_build_object(
            'follow_up', r.restarted, 'state', a.state, 'epoch', a.epoch,
            'synthetic_results', 0));
    END IF;
    q := ar__waiting_question(a.id);
    r := ar__close_dangling(a, o, p_turn, p_interrupted, q.tool_call_id, v_now);
    a := r.a;
    o := r.o;
    v_closed := (o ->> 'closed')::integer;
    UPDATE ar_turns SET status = CASE WHEN p_failed THEN 'failed' ELSE 'ended' END::ar_turn_status,
                        ended_at = v_now, error = p_error
    WHERE id = p_turn;
    IF q.id IS NOT NULL THEN
        -- The turn ends while blocked (it failed): the ask stays open, suspended.
        a := ar__move(a, 'waiting');
        a.suspended := true;
    ELSIF EXISTS (SELECT 1 FROM ar_messages
                  WHERE target_agent_id = a.id AND status = 'pending' AND wake) THEN
        v_follow_up := true;
        r := ar__schedule(a, o, 'follow_up', v_now);
        a := r.a;
        o := r.o;
    ELSE
        a := ar__move(a, 'completed');
    END IF;
    PERFORM ar__save_agent(a);
    o := ar__agent_event(o, 'turn_ended', a, v_now, jsonb_build_object(
            'failed', p_failed, 'error', p_error, 'state', a.state,
            'synthetic_results', v_closed),
        p_turn => p_turn, p_epoch => p_epoch);
    IF v_follow_up THEN
        o := ar__agent_event(o, 'follow_up', a, v_now, p_turn => p_turn, p_epoch => a.epoch);
    END IF;
    RETURN o || jsonb_build_object('ended', jsonb_build_object(
        'follow_up', v_follow_up, 'state', a.state, 'epoch', a.epoch,
        'synthetic_results', v_closed));
END $$;

-- A waiting agent's turn gives up its worker: the agent suspended (its row written), the turn
-- ended `suspended` and ledgered (`turn_ended`).
CREATE OR REPLACE FUNCTION ar__suspend_turn(
    INOUT o jsonb, a ar_agents, p_turn bigint, p_epoch integer, p_now timestamp)
LANGUAGE plpgsql AS $$
BEGIN
    a.suspended := true;
    PERFORM ar__save_agent(a);
    UPDATE ar_turns SET status = 'suspended', ended_at = p_now WHERE id = p_turn;
    o := ar__agent_event(o, 'turn_ended', a, p_now,
                         jsonb_build_object('state', a.state, 'suspended', true),
                         p_turn => p_turn, p_epoch => p_epoch);
END $$;

-- A blocked asker gives up its worker, decided under the agent lock: "suspended" true if it is
-- now suspended (the answer will schedule a continuation), false if the answer already came
-- (the tool result is in the transcript and this turn continues).
CREATE OR REPLACE FUNCTION ar_suspend(p_turn bigint, p_agent bigint, p_epoch integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'suspend');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF a.state <> 'waiting' THEN
        RETURN o || '{"suspended": false}';
    END IF;
    o := ar__suspend_turn(o, a, p_turn, p_epoch, ar__now());
    RETURN o || '{"suspended": true}';
END $$;

-- The turn honours a stop at a boundary (ar__stop_turn); `p_reason` NULL: the reason the stop
-- was requested with.
CREATE OR REPLACE FUNCTION ar_finish_stop(p_turn bigint, p_agent bigint, p_epoch integer,
                                          p_reason text, p_stopped text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
BEGIN
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, 'stop');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    r := ar__stop_turn(a, o, p_turn, coalesce(p_reason, ar__requested_stop_reason(a)),
                       p_stopped, ar__now());
    PERFORM ar__save_agent(r.a);
    RETURN r.o;
END $$;
