-- Routing on PostgreSQL: accept a message and deliver it by the receiver's state, resolve a
-- waiter, refuse what cannot be delivered. The lock: the target agent's row (and the question
-- an answer answers). The SQLite implementation of the same transitions is store/routing.py.

-- The routing table (decisions.decide): the outcome of a message to a receiver in `p_state`,
-- blocked on the question `p_wait_*` when it is waiting. Only the agent waited on releases a
-- wait: an ask ends on its answer to it, or on any other wake message it sends the asker; an
-- output wait ends on its report (an output that is not progress narration); a wait for the
-- user (ask_user) ends on the user's answer to it, or any other wake message of the user's.
CREATE OR REPLACE FUNCTION ar__decide(
    p_state ar_agent_state, p_wait_id bigint, p_wait_kind ar_question_kind,
    p_wait_target bigint, p_type ar_message_type, p_subtype ar_message_subtype,
    p_sender_id bigint, p_wake boolean, p_answers bigint, p_from_user boolean)
RETURNS ar_route_outcome LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE
        WHEN p_state = 'waiting' AND p_wait_id IS NOT NULL AND p_wait_kind = 'user'
             AND p_from_user AND p_wake AND (p_answers IS NULL OR p_answers = p_wait_id)
            THEN 'resolved'
        WHEN p_state = 'waiting' AND p_wait_id IS NOT NULL AND p_wait_kind <> 'user'
             AND p_sender_id IS NOT NULL
             AND p_sender_id = p_wait_target
             AND CASE p_wait_kind
                 WHEN 'output' THEN p_type = 'output'
                      AND p_subtype IS DISTINCT FROM 'progress_output'
                 ELSE p_wake AND (p_answers IS NULL OR p_answers = p_wait_id)
             END
            THEN 'resolved'
        WHEN p_state = 'waiting' THEN CASE WHEN p_wake THEN 'injected_inline' ELSE 'queued' END
        WHEN p_state = 'running' THEN 'injected_inline'
        WHEN p_state = 'scheduled' THEN 'coalesced'
        WHEN p_wake THEN 'triggered_new_turn'
        ELSE 'queued'
    END::ar_route_outcome;
END $$;

-- A send refused (`p_refusal`: its code, fields and reason, or NULL): the error, and the
-- `send_rejected` event that records it, with the code and fields its message is rendered from
-- (none for an unknown team: nothing of it to record).
CREATE OR REPLACE FUNCTION ar__rejected(
    INOUT o jsonb, p_refusal jsonb, p_to text, p_new ar_messages)
LANGUAGE plpgsql AS $$
BEGIN
    o := ar__refused(o, p_refusal ->> 'code', p_refusal -> 'fields');
    IF p_refusal ? 'reason' THEN
        o := jsonb_set(o, '{refused,event}', jsonb_build_object(
            'action', 'send_rejected', 'team_id', p_new.team_id, 'outcome', 'rejected',
            'detail', jsonb_build_object(
                'reason', p_refusal -> 'reason', 'to', p_to, 'sender', p_new.source_name,
                'type', p_new.type, 'subtype', p_new.subtype,
                'refused', p_refusal -> 'code', 'fields', p_refusal -> 'fields')));
    END IF;
END $$;

-- A refusal of a send as ar__rejected takes it: `p_reason` is its event's (NULL: no event).
CREATE OR REPLACE FUNCTION ar__send_refusal(p_reason text, p_code text, p_fields jsonb)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'code', p_code))
        || jsonb_build_object('fields', p_fields);
END $$;

-- The event of a refusal (the result's refused.event), written after the refusal. Refusals of
-- a send of one kind (team, reason, sender, receiver) within a minute share one row, counted in
-- its `repeats`: a sender retrying a refused send does not grow the ledger by a row a try.
CREATE OR REPLACE FUNCTION ar__refusal_event(INOUT o jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_event jsonb := o #> '{refused,event}';
    v_detail jsonb := v_event -> 'detail';
    v_team bigint := (v_event ->> 'team_id')::bigint;
    v_latest ar_ledger;
BEGIN
    IF v_event IS NULL THEN
        RETURN;
    END IF;
    IF v_event ->> 'action' = 'send_rejected' AND v_team IS NOT NULL THEN
        SELECT * INTO v_latest FROM ar_ledger
        WHERE team_id = v_team AND action = 'send_rejected'
          AND created_at >= p_now - interval '60 seconds'
        ORDER BY id DESC LIMIT 1 FOR UPDATE;
        IF FOUND AND (v_latest.detail -> 'reason') IS NOT DISTINCT FROM (v_detail -> 'reason')
           AND (v_latest.detail -> 'sender') IS NOT DISTINCT FROM (v_detail -> 'sender')
           AND (v_latest.detail -> 'to') IS NOT DISTINCT FROM (v_detail -> 'to') THEN
            UPDATE ar_ledger SET detail = detail || jsonb_build_object(
                'repeats', coalesce((detail ->> 'repeats')::integer, 1) + 1,
                'last_at', to_jsonb(p_now))
                || jsonb_strip_nulls(jsonb_build_object(
                    'refused', v_detail -> 'refused', 'fields', v_detail -> 'fields'))
            WHERE id = v_latest.id;
            RETURN;
        END IF;
    END IF;
    o := ar__event(o, (v_event ->> 'action')::ar_ledger_action, v_team,
                   (v_event ->> 'agent_id')::bigint, p_now, v_detail,
                   (v_event ->> 'outcome')::ar_route_outcome, NULL,
                   (v_event ->> 'turn_id')::bigint, (v_event ->> 'epoch')::integer);
END $$;

-- Record a refusal the store's caller made before routing (malformed input): `p_event` as a
-- refusal's event.
CREATE OR REPLACE FUNCTION ar_record_refusal(p_event jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    RETURN ar__refusal_event(jsonb_set(ar__result(), '{refused}',
                                       jsonb_build_object('event', p_event)), ar__now())
        - 'refused';
END $$;

-- The message becomes the blocked call's tool result, in this transaction: the question no
-- longer waited on, the rendered message at the end of the waiter's transcript (a pending
-- message is delivered into the waiting turn now), the waiter continuing.
CREATE OR REPLACE FUNCTION ar__resolve_waiter(
    INOUT a ar_agents, INOUT o jsonb, q ar_questions, m ar_messages, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF m.status <> 'delivered' THEN
        UPDATE ar_messages SET status = 'delivered',
                               consumed_turn_id = ar__waiter_turn(a.id, q.asker_epoch),
                               consumed_at = p_now
        WHERE id = m.id RETURNING * INTO m;
    END IF;
    r := ar__end_wait(
        a, o, q,
        ar__envelope(m.type, m.source_name, m.id, m.subtype, m.question_id,
                     coalesce(m.body, m.content)),
        'question_resolved', m.consumed_turn_id, m.id, ar__metadata(m),
        jsonb_build_object('suspended', a.suspended), p_now);
    a := r.a;
    o := r.o;
END $$;

-- A message to route: its team, sender and own fields (the rest of the row is the router's).
CREATE OR REPLACE FUNCTION ar__message(
    p_team bigint, p_sender text, p_type ar_message_type, p_subtype ar_message_subtype,
    p_content text, p_body text, p_question bigint, p_wake boolean, p_dedup text)
RETURNS ar_messages LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m ar_messages;
BEGIN
    m.team_id := p_team;
    m.source_name := p_sender;
    m.type := p_type;
    m.subtype := p_subtype;
    m.content := p_content;
    m.body := p_body;
    m.question_id := p_question;
    m.wake := p_wake;
    m.dedup_key := p_dedup;
    RETURN m;
END $$;

-- Why a send to the receiver `t` (locked; NULL when the team has no `p_to`) is refused, checked
-- in order: an unknown team, an unknown or terminated sender (`p_source_state`), an unknown,
-- same or terminated receiver. NULL when none is.
CREATE OR REPLACE FUNCTION ar__send_refused(
    t ar_agents, p_to text, p_new ar_messages, p_external boolean, p_source bigint,
    p_source_state ar_agent_state)
RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF t.id IS NULL AND NOT EXISTS (SELECT 1 FROM ar_teams WHERE id = p_new.team_id) THEN
        RETURN ar__send_refusal(NULL, 'unknown_team',
                                jsonb_build_object('team_id', p_new.team_id));
    ELSIF NOT p_external AND p_source IS NULL THEN
        RETURN ar__send_refusal('unknown_sender', 'unknown_sender', jsonb_build_object(
            'sender', p_new.source_name, 'team_id', p_new.team_id));
    ELSIF p_source_state = 'terminated' THEN
        RETURN ar__send_refusal('sender_terminated', 'sender_terminated',
                                jsonb_build_object('sender', p_new.source_name));
    ELSIF t.id IS NULL THEN
        RETURN ar__send_refusal('unknown_target', 'unknown_agent',
                                ar__unknown_agent(p_new.team_id, p_to));
    ELSIF p_source = t.id THEN
        RETURN ar__send_refusal('self_send', 'self_send', '{}');
    ELSIF t.state = 'terminated' THEN
        RETURN ar__send_refusal('terminated', 'terminated', jsonb_build_object('name', p_to));
    END IF;
    RETURN NULL;
END $$;

-- Why an answer to `t` is refused: it names no question, or `q` (locked; NULL when there is no
-- such question) is of another team, was not asked by `t`, is the user's to answer (and the
-- sender not the user), is a wait for output, or is closed. NULL when it answers `q`.
CREATE OR REPLACE FUNCTION ar__answer_refused(q ar_questions, t ar_agents, p_new ar_messages)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_new.question_id IS NULL THEN
        RETURN ar__send_refusal('no_question_id', 'no_question_id', '{}');
    ELSIF q.id IS NULL OR q.team_id <> p_new.team_id THEN
        RETURN ar__send_refusal('unknown_question', 'unknown_question', jsonb_build_object(
            'question_id', p_new.question_id, 'team_id', p_new.team_id));
    ELSIF q.asker_agent_id <> t.id THEN
        RETURN ar__send_refusal('wrong_question', 'not_asked_by', jsonb_build_object(
            'question_id', q.id, 'target', t.display_name));
    ELSIF q.kind = 'user' AND p_new.source_name <> 'user' THEN
        RETURN ar__send_refusal('wrong_question', 'users_question',
                                jsonb_build_object('question_id', q.id));
    ELSIF q.kind = 'output' THEN
        RETURN ar__send_refusal('wrong_question', 'not_a_question',
                                jsonb_build_object('question_id', q.id));
    ELSIF q.status <> 'open' THEN
        RETURN ar__send_refusal('question_closed', 'question_closed', jsonb_build_object(
            'question_id', q.id, 'status', q.status));
    END IF;
    RETURN NULL;
END $$;

-- The message `p_new` to `t`, inserted final (one that resolves a wait is delivered as it is
-- inserted, into the turn `p_turn` that waits for it).
CREATE OR REPLACE FUNCTION ar__insert_message(
    p_new ar_messages, t ar_agents, p_source bigint, p_seq bigint,
    p_outcome ar_route_outcome, p_turn bigint, p_now timestamp)
RETURNS ar_messages LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    m ar_messages;
BEGIN
    INSERT INTO ar_messages (team_id, seq, source_name, source_agent_id, target_agent_id, type,
                             subtype, content, body, question_id, wake, dedup_key, outcome,
                             status, consumed_turn_id, consumed_at, created_at)
    VALUES (p_new.team_id, p_seq, p_new.source_name, p_source, t.id, p_new.type,
            p_new.subtype, p_new.content, p_new.body, p_new.question_id, p_new.wake,
            p_new.dedup_key, p_outcome,
            CASE WHEN p_outcome = 'resolved' THEN 'delivered' ELSE 'pending' END::ar_message_status,
            p_turn, CASE WHEN p_outcome = 'resolved' THEN p_now END, p_now)
    RETURNING * INTO m;
    RETURN m;
END $$;

-- What a send returns: `m` as routed to `t` (`p_duplicate`: a retried send found it).
CREATE OR REPLACE FUNCTION ar__delivery(t ar_agents, m ar_messages, p_duplicate boolean)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('message_id', m.id, 'outcome', m.outcome, 'target', t.display_name,
                              'seq', m.seq, 'epoch', t.epoch, 'duplicate', p_duplicate);
END $$;

-- Route one message `p_new` to `p_to` (store/routing.py's route): "d" the delivery, or "o" with
-- "refused" and nothing written (its event is for the caller to write). The sender is looked up
-- once, then the receiver's row is taken one of two ways.
--
-- The fast path: a send that can change nothing of the receiver but its counter (a message
-- that is no answer, names no question and carries no dedup key, from an outside sender or a
-- live agent other than the receiver, to a receiver that is running or scheduled, or idle or
-- completed and not woken) takes the row with the UPDATE that writes the counter: one statement
-- locks and writes it, there is nothing to refuse, and the routing table's row is the
-- receiver's state alone. The general path (any other send, and this one when that UPDATE
-- matched no row): lock the receiver, refuse, find the question answered and the one waited on,
-- decide, and write the row back once.
CREATE OR REPLACE FUNCTION ar__route(
    INOUT o jsonb, OUT d jsonb, p_to text, p_external boolean, p_new ar_messages)
LANGUAGE plpgsql AS $$
DECLARE
    t ar_agents;
    q ar_questions;
    w ar_questions;
    m ar_messages;
    r record;
    v_source bigint;
    v_source_state ar_agent_state;
    v_before ar_agent_state;
    v_outcome ar_route_outcome;
    v_refused jsonb;
    v_now timestamp;
BEGIN
    IF NOT p_external THEN
        SELECT id, state INTO v_source, v_source_state FROM ar_agents
        WHERE team_id = p_new.team_id AND display_name = p_new.source_name;
    END IF;
    IF p_new.type <> 'answer' AND p_new.question_id IS NULL AND p_new.dedup_key IS NULL
       AND (p_external OR (v_source_state <> 'terminated' AND p_new.source_name <> p_to)) THEN
        UPDATE ar_agents SET next_seq = next_seq + 1
        WHERE team_id = p_new.team_id AND display_name = p_to
          AND (state IN ('running', 'scheduled')
               OR (state IN ('idle', 'completed') AND NOT p_new.wake))
        RETURNING * INTO t;
        IF FOUND THEN
            v_now := ar__now();
            m := ar__insert_message(p_new, t, v_source, t.next_seq - 1, ar__decide(
                    t.state, NULL, NULL, NULL, p_new.type, p_new.subtype, v_source,
                    p_new.wake, NULL, p_external AND p_new.source_name = 'user'), NULL, v_now);
            o := ar__agent_event(o, 'route', t, v_now, ar__route_detail(m, t.state, t.state),
                                 m.outcome, m.id, NULL, t.epoch);
            d := ar__delivery(t, m, false);
            RETURN;
        END IF;
    END IF;

    SELECT * INTO t FROM ar_agents WHERE team_id = p_new.team_id AND display_name = p_to
    FOR NO KEY UPDATE;
    v_now := ar__now();
    v_refused := ar__send_refused(t, p_to, p_new, p_external, v_source, v_source_state);
    -- A retried send finds its first delivery by its dedup key.
    IF v_refused IS NULL AND p_new.dedup_key IS NOT NULL THEN
        SELECT * INTO m FROM ar_messages
        WHERE target_agent_id = t.id AND dedup_key = p_new.dedup_key;
        IF FOUND AND (m.content, m.source_name, m.type, m.subtype, m.question_id)
                     IS DISTINCT FROM (p_new.content, p_new.source_name, p_new.type,
                                       p_new.subtype, p_new.question_id) THEN
            v_refused := ar__send_refusal('dedup_conflict', 'dedup_conflict', jsonb_build_object(
                'dedup_key', p_new.dedup_key, 'message_id', m.id, 'target', t.display_name));
        ELSIF FOUND THEN
            o := ar__agent_event(o, 'duplicate_send', t, v_now,
                                 jsonb_build_object('dedup_key', p_new.dedup_key), m.outcome,
                                 m.id);
            d := ar__delivery(t, m, true);
            RETURN;
        END IF;
    END IF;
    -- An answer answers an open question that its receiver asked.
    IF v_refused IS NULL AND p_new.type = 'answer' THEN
        SELECT * INTO q FROM ar_questions WHERE id = p_new.question_id FOR NO KEY UPDATE;
        v_refused := ar__answer_refused(q, t, p_new);
    END IF;
    IF v_refused IS NOT NULL THEN
        o := ar__rejected(o, v_refused, p_to, p_new);
        RETURN;
    END IF;
    -- The question a waiting receiver is blocked on (usually the very one answered).
    IF t.state = 'waiting' THEN
        w := CASE WHEN q.waiting THEN q ELSE ar__waiting_question(t.id) END;
    END IF;
    v_before := t.state;
    v_outcome := ar__decide(t.state, w.id, w.kind, w.target_agent_id, p_new.type,
                            p_new.subtype, v_source, p_new.wake, q.id,
                            p_external AND p_new.source_name = 'user');
    m := ar__insert_message(p_new, t, v_source, t.next_seq, v_outcome,
                            CASE WHEN v_outcome = 'resolved'
                                 THEN ar__waiter_turn(t.id, w.asker_epoch) END, v_now);
    t.next_seq := t.next_seq + 1;
    IF q.id IS NOT NULL THEN
        q := ar__close_question(q, 'answered', v_now, m.id);
    END IF;
    IF v_outcome = 'resolved' THEN
        -- The report ends an output wait; any message of the asked agent to the asker is its
        -- answer: either way the question is answered by this message, delivered once.
        IF q.id IS DISTINCT FROM w.id THEN
            w := ar__close_question(w, 'answered', v_now, m.id);
        END IF;
        r := ar__resolve_waiter(t, o, w, m, v_now);
        t := r.a;
        o := r.o;
    ELSIF v_outcome = 'triggered_new_turn' THEN
        r := ar__schedule(t, o, 'new', v_now);
        t := r.a;
        o := r.o;
    END IF;
    PERFORM ar__save_agent(t);
    o := ar__agent_event(o, 'route', t, v_now, ar__route_detail(m, v_before, t.state),
                         v_outcome, m.id, NULL, t.epoch);
    d := ar__delivery(t, m, false);
END $$;

-- The detail of a route's ledger event (routing.route_detail).
CREATE OR REPLACE FUNCTION ar__route_detail(
    m ar_messages, p_before ar_agent_state, p_after ar_agent_state)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('seq', m.seq, 'type', m.type, 'sender', m.source_name,
                              'wake', m.wake, 'state_before', p_before, 'state_after', p_after);
END $$;

-- Send one message: routed, or refused with its event written.
CREATE OR REPLACE FUNCTION ar_send(
    p_team bigint, p_to text, p_sender text, p_external boolean, p_type ar_message_type,
    p_subtype ar_message_subtype, p_content text, p_body text, p_question bigint,
    p_wake boolean, p_dedup text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r record := ar__route(ar__result(), p_to, p_external, ar__message(
        p_team, p_sender, p_type, p_subtype, p_content, p_body, p_question, p_wake, p_dedup));
BEGIN
    IF r.o ? 'refused' THEN
        RETURN ar__refusal_event(r.o, ar__now());
    END IF;
    RETURN r.o || jsonb_build_object('delivery', r.d);
END $$;

-- The user's message to the lead, routed as ar_send routes it; a lead running a turn is then
-- asked to stop at its next boundary (its stop_requested event's "restart"), and that stop
-- starts one follow-up turn for the message (ar__stop_turn). A lead waiting on a wait of its
-- own (a wait for a sub-agent's output) has the wait ended too, its call given a cancelled
-- result: blocked in its worker, its turn reaches that boundary now; suspended (no worker
-- holds it), it is stopped here and the follow-up turn scheduled at once.
CREATE OR REPLACE FUNCTION ar_interrupt(
    p_team bigint, p_to text, p_sender text, p_external boolean, p_type ar_message_type,
    p_subtype ar_message_subtype, p_content text, p_body text, p_question bigint,
    p_wake boolean, p_dedup text, p_reason text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar_send(p_team, p_to, p_sender, p_external, p_type, p_subtype, p_content,
                       p_body, p_question, p_wake, p_dedup);
    a ar_agents;
    own ar_questions;
    r record;
    v_now timestamp;
    v_before ar_agent_state;
    v_stopped text := format('cancelled: stopped (%s)', p_reason);
BEGIN
    IF o ? 'refused' OR (o -> 'delivery' ->> 'duplicate')::boolean THEN
        RETURN o;
    END IF;
    SELECT * INTO a FROM ar_agents WHERE team_id = p_team AND display_name = p_to FOR UPDATE;
    IF a.stop_requested THEN
        RETURN o;
    END IF;
    own := ar__waiting_question(a.id);
    IF a.state <> 'running' AND (a.state <> 'waiting' OR own.id IS NULL) THEN
        RETURN o;
    END IF;
    v_now := ar__now();
    v_before := a.state;
    IF a.suspended THEN  -- no worker holds it: stopped now, the follow-up scheduled
        own := ar__close_question(own, 'cancelled', v_now, NULL, true);
        r := ar__close_dangling(a, o, NULL, v_stopped, NULL, v_now);
        a := r.a;
        o := r.o - 'closed';
        PERFORM ar__cancel_own_questions(a.id, v_now);
        a.epoch := a.epoch + 1;  -- a continuation claims nothing
        a := ar__move(a, 'idle');
        a.suspended := false;
        a.pending_trigger := NULL;
        o := ar__agent_event(o, 'stopped', a, v_now, jsonb_build_object(
                'reason', p_reason, 'state_before', v_before, 'cancelled_questions', 0),
            p_epoch => a.epoch);
        r := ar__schedule(a, o, 'follow_up', v_now);
        a := r.a;
        PERFORM ar__save_agent(a);
        RETURN ar__agent_event(r.o, 'follow_up', a, v_now, p_epoch => a.epoch);
    END IF;
    a.stop_requested := true;
    IF own.id IS NOT NULL THEN  -- blocked in a worker: end the wait, the turn then stops
        own := ar__close_question(own, 'cancelled', v_now);
        r := ar__release(a, o, own, v_stopped, v_now);
        a := r.a;
        o := r.o;
    END IF;
    PERFORM ar__save_agent(a);
    RETURN ar__agent_event(o, 'stop_requested', a, v_now, jsonb_build_object(
            'reason', p_reason, 'state_before', v_before, 'cancelled_questions', 0,
            'restart', true),
        p_epoch => a.epoch);
END $$;

-- Send several messages of one team from one sender in this one transaction, each routed as
-- ar_send routes it, their targets locked in ascending id order (unknown targets first, so
-- that their refusal comes before any lock): all of them, or none and the first refusal's
-- event. `p_messages`: [{to, type, subtype, content, body, question_id, wake, dedup_key}];
-- the result's "deliveries" in the order given.
CREATE OR REPLACE FUNCTION ar_send_many(
    p_team bigint, p_sender text, p_external boolean, p_messages jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    v_deliveries jsonb := '[]';
    v_sent record;
    r record;
BEGIN
    BEGIN
        FOR v_sent IN
            SELECT e.value AS m, e.n FROM jsonb_array_elements(p_messages) WITH ORDINALITY e(value, n)
            LEFT JOIN ar_agents ag ON ag.team_id = p_team AND ag.display_name = e.value ->> 'to'
            ORDER BY coalesce(ag.id, 0), e.n
        LOOP
            r := ar__route(o, v_sent.m ->> 'to', p_external, jsonb_populate_record(
                NULL::ar_messages,
                v_sent.m || jsonb_build_object('team_id', p_team, 'source_name', p_sender)));
            o := r.o;
            IF o ? 'refused' THEN
                RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = (o -> 'refused')::text;
            END IF;
            v_deliveries := v_deliveries || jsonb_build_array(
                r.d || jsonb_build_object('n', v_sent.n));
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'AR001' THEN
        -- Everything of the batch is rolled back; its first refusal is recorded.
        RETURN ar__refusal_event(jsonb_set(ar__result(), '{refused}', SQLERRM::jsonb),
                                 ar__now());
    END;
    SELECT coalesce(jsonb_agg(d - 'n' ORDER BY (d ->> 'n')::integer), '[]') INTO v_deliveries
    FROM jsonb_array_elements(v_deliveries) d;
    RETURN o || jsonb_build_object('deliveries', v_deliveries);
END $$;
