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

-- A timestamp as Python's isoformat() writes it.
CREATE OR REPLACE FUNCTION ar__isoformat(p timestamp) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN to_char(p, 'YYYY-MM-DD"T"HH24:MI:SS')
        || CASE WHEN to_char(p, 'US') = '000000' THEN '' ELSE '.' || to_char(p, 'US') END;
END $$;

-- A send refused: the error, and the `send_rejected` event that records it.
CREATE OR REPLACE FUNCTION ar__rejected(
    INOUT o jsonb, p_error text, p_message text, p_reason text, p_team bigint, p_to text,
    p_sender text, p_type ar_message_type, p_subtype ar_message_subtype)
LANGUAGE plpgsql AS $$
BEGIN
    o := jsonb_set(ar__refused(o, p_error, p_message), '{refused,event}', jsonb_build_object(
        'action', 'send_rejected', 'team_id', p_team, 'outcome', 'rejected',
        'detail', jsonb_build_object('reason', p_reason, 'to', p_to, 'sender', p_sender,
                                     'type', p_type, 'subtype', p_subtype,
                                     'message', p_message)));
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
                'last_at', ar__isoformat(p_now),
                'message', CASE WHEN v_detail ? 'message' THEN v_detail -> 'message'
                                ELSE detail -> 'message' END)
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

-- Route one message (store/routing.py's route): the result's "delivery", or "refused" with
-- nothing written (its event is for the caller to write).
--
-- The receiver's row is taken one of two ways. A send that can change nothing of it but its
-- counter (a message that is no answer, names no question and carries no dedup key, from an
-- outside sender or a live agent other than the receiver, to a receiver that is running or
-- scheduled, or idle or completed and not woken) takes it with the UPDATE that writes the
-- counter: one statement locks and writes the row, and there is nothing to refuse. Any other
-- send, and this one when that UPDATE matched no row (the receiver in another state, unknown,
-- of another team), locks the row first, checks and refuses, and writes it back once decided.
-- Either way the outcome is ar__decide's and the message, its event and the delivery are
-- written below by the same statements.
CREATE OR REPLACE FUNCTION ar__route(
    INOUT o jsonb, p_team bigint, p_to text, p_sender text, p_external boolean,
    p_type ar_message_type, p_subtype ar_message_subtype, p_content text, p_body text,
    p_question bigint, p_wake boolean, p_dedup text)
LANGUAGE plpgsql AS $$
DECLARE
    t ar_agents;
    q ar_questions;
    w ar_questions;
    m ar_messages;
    r record;
    v_found boolean;
    v_source bigint;
    v_source_state ar_agent_state;
    v_before ar_agent_state;
    v_outcome ar_route_outcome;
    v_now timestamp;
    v_taken boolean := false;
BEGIN
    IF p_type <> 'answer' AND p_question IS NULL AND p_dedup IS NULL
       AND (p_external OR p_sender <> p_to) THEN
        IF NOT p_external THEN
            SELECT id, state INTO v_source, v_source_state FROM ar_agents
            WHERE team_id = p_team AND display_name = p_sender;
        END IF;
        IF p_external OR v_source_state <> 'terminated' THEN
            UPDATE ar_agents SET next_seq = next_seq + 1
            WHERE team_id = p_team AND display_name = p_to
              AND (state IN ('running', 'scheduled')
                   OR (state IN ('idle', 'completed') AND NOT p_wake))
            RETURNING * INTO t;
            v_taken := FOUND;
            v_now := ar__now();
        END IF;
    END IF;
    IF NOT v_taken THEN
        SELECT * INTO t FROM ar_agents WHERE team_id = p_team AND display_name = p_to
        FOR NO KEY UPDATE;
        v_found := FOUND;
        v_now := ar__now();
        IF NOT v_found AND NOT EXISTS (SELECT 1 FROM ar_teams WHERE id = p_team) THEN
            o := ar__refused(o, 'UnknownTeamError', format('unknown team %s', p_team));
            RETURN;
        END IF;
        IF NOT p_external THEN
            SELECT id, state INTO v_source, v_source_state FROM ar_agents
            WHERE team_id = p_team AND display_name = p_sender;
            IF v_source IS NULL THEN
                o := ar__rejected(o, 'UnknownAgentError', format(
                        'unknown sender %s: not an agent of team %s, nor ''user'', ''system'' or '
                        '''job:<name>''', ar__repr(p_sender), p_team),
                    'unknown_sender', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            ELSIF v_source_state = 'terminated' THEN
                o := ar__rejected(o, 'AgentTerminatedError',
                    format('sender %s is terminated', ar__repr(p_sender)),
                    'sender_terminated', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            END IF;
        END IF;
        IF NOT v_found THEN
            o := ar__rejected(o, 'UnknownAgentError', ar__unknown_agent(p_team, p_to),
                'unknown_target', p_team, p_to, p_sender, p_type, p_subtype);
            RETURN;
        END IF;
        IF v_source = t.id THEN
            o := ar__rejected(o, 'InvalidMessageError', 'an agent cannot message itself',
                'self_send', p_team, p_to, p_sender, p_type, p_subtype);
            RETURN;
        END IF;
        IF t.state = 'terminated' THEN
            o := ar__rejected(o, 'AgentTerminatedError',
                format('agent %s is terminated', ar__repr(p_to)),
                'terminated', p_team, p_to, p_sender, p_type, p_subtype);
            RETURN;
        END IF;
        -- A retried send finds its first delivery by its dedup key.
        IF p_dedup IS NOT NULL THEN
            SELECT * INTO m FROM ar_messages WHERE target_agent_id = t.id AND dedup_key = p_dedup;
            IF FOUND THEN
                IF (m.content, m.source_name, m.type, m.subtype, m.question_id)
                   IS DISTINCT FROM (p_content, p_sender, p_type, p_subtype, p_question) THEN
                    o := ar__rejected(o, 'DedupConflictError', format(
                            'dedup key %s was used for message %s to %s with other content, '
                            'sender or type', ar__repr(p_dedup), m.id, t.display_name),
                        'dedup_conflict', p_team, p_to, p_sender, p_type, p_subtype);
                    RETURN;
                END IF;
                o := ar__agent_event(o, 'duplicate_send', t, v_now,
                                     jsonb_build_object('dedup_key', p_dedup), m.outcome, m.id);
                o := o || jsonb_build_object('delivery', jsonb_build_object(
                    'message_id', m.id, 'outcome', m.outcome, 'target', t.display_name,
                    'seq', m.seq, 'epoch', t.epoch, 'duplicate', true));
                RETURN;
            END IF;
        END IF;
        v_before := t.state;
        -- An answer answers an open question that its receiver asked.
        IF p_type = 'answer' THEN
            IF p_question IS NULL THEN
                o := ar__rejected(o, 'InvalidMessageError', 'an answer needs a question_id',
                    'no_question_id', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            END IF;
            SELECT * INTO q FROM ar_questions WHERE id = p_question FOR NO KEY UPDATE;
            IF NOT FOUND OR q.team_id <> p_team THEN
                o := ar__rejected(o, 'UnknownQuestionError',
                    format('no question %s in team %s', p_question, p_team),
                    'unknown_question', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            ELSIF q.asker_agent_id <> t.id THEN
                o := ar__rejected(o, 'WrongQuestionError',
                    format('question %s was not asked by %s', q.id, ar__repr(t.display_name)),
                    'wrong_question', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            ELSIF q.kind = 'user' AND p_sender <> 'user' THEN
                o := ar__rejected(o, 'WrongQuestionError',
                    format('question %s is the user''s to answer', q.id),
                    'wrong_question', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            ELSIF q.kind = 'output' THEN
                o := ar__rejected(o, 'WrongQuestionError', format(
                        '%s is not a question but a wait for output: nothing to answer', q.id),
                    'wrong_question', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            ELSIF q.status <> 'open' THEN
                o := ar__rejected(o, 'QuestionClosedError',
                    format('question %s is already %s', q.id, q.status),
                    'question_closed', p_team, p_to, p_sender, p_type, p_subtype);
                RETURN;
            END IF;
        END IF;
        -- The question a waiting receiver is blocked on (usually the very one answered).
        IF t.state = 'waiting' THEN
            IF q.id IS NOT NULL AND q.waiting THEN
                w := q;
            ELSE
                w := ar__waiting_question(t.id);
            END IF;
        END IF;
    END IF;
    v_before := coalesce(v_before, t.state);
    v_outcome := ar__decide(t.state, w.id, w.kind, w.target_agent_id, p_type, p_subtype,
                            v_source, p_wake, q.id, p_external AND p_sender = 'user');
    -- The message, final as inserted: one that resolves a wait is delivered as it is
    -- inserted, into the turn that waits for it.
    INSERT INTO ar_messages (team_id, seq, source_name, source_agent_id, target_agent_id, type,
                             subtype, content, body, question_id, wake, dedup_key, outcome,
                             status, consumed_turn_id, consumed_at, created_at)
    VALUES (p_team, CASE WHEN v_taken THEN t.next_seq - 1 ELSE t.next_seq END, p_sender,
            v_source, t.id, p_type, p_subtype, p_content, p_body, p_question, p_wake, p_dedup,
            v_outcome,
            CASE WHEN v_outcome = 'resolved' THEN 'delivered' ELSE 'pending' END::ar_message_status,
            CASE WHEN v_outcome = 'resolved' THEN ar__waiter_turn(t.id, w.asker_epoch) END,
            CASE WHEN v_outcome = 'resolved' THEN v_now END, v_now)
    RETURNING * INTO m;
    IF NOT v_taken THEN
        t.next_seq := t.next_seq + 1;
    END IF;
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
    IF NOT v_taken THEN
        PERFORM ar__save_agent(t);
    END IF;
    o := ar__agent_event(o, 'route', t, v_now, jsonb_build_object(
            'seq', m.seq, 'type', p_type, 'sender', p_sender, 'wake', p_wake,
            'state_before', v_before, 'state_after', t.state),
        v_outcome, m.id, NULL, t.epoch);
    o := o || jsonb_build_object('delivery', jsonb_build_object(
        'message_id', m.id, 'outcome', v_outcome, 'target', t.display_name, 'seq', m.seq,
        'epoch', t.epoch, 'duplicate', false));
END $$;

-- Send one message: routed, or refused with its event written.
CREATE OR REPLACE FUNCTION ar_send(
    p_team bigint, p_to text, p_sender text, p_external boolean, p_type ar_message_type,
    p_subtype ar_message_subtype, p_content text, p_body text, p_question bigint,
    p_wake boolean, p_dedup text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__route(ar__result(), p_team, p_to, p_sender, p_external, p_type, p_subtype,
                         p_content, p_body, p_question, p_wake, p_dedup);
BEGIN
    IF o ? 'refused' THEN
        o := ar__refusal_event(o, ar__now());
    END IF;
    RETURN o;
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
    v_refused jsonb;
BEGIN
    BEGIN
        FOR v_sent IN
            SELECT e.value AS m, e.n FROM jsonb_array_elements(p_messages) WITH ORDINALITY e(value, n)
            LEFT JOIN ar_agents ag ON ag.team_id = p_team AND ag.display_name = e.value ->> 'to'
            ORDER BY coalesce(ag.id, 0), e.n
        LOOP
            o := ar__route(o, p_team, v_sent.m ->> 'to', p_sender, p_external,
                           (v_sent.m ->> 'type')::ar_message_type,
                           (v_sent.m ->> 'subtype')::ar_message_subtype, v_sent.m ->> 'content',
                           v_sent.m ->> 'body', (v_sent.m ->> 'question_id')::bigint,
                           (v_sent.m ->> 'wake')::boolean, v_sent.m ->> 'dedup_key');
            IF o ? 'refused' THEN
                RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = (o -> 'refused')::text;
            END IF;
            v_deliveries := v_deliveries || jsonb_build_array(
                (o -> 'delivery') || jsonb_build_object('n', v_sent.n));
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'AR001' THEN
        -- Everything of the batch is rolled back; its first refusal is recorded.
        v_refused := SQLERRM::jsonb;
        RETURN ar__refusal_event(jsonb_set(ar__result(), '{refused}', v_refused), ar__now());
    END;
    SELECT coalesce(jsonb_agg(d - 'n' ORDER BY (d ->> 'n')::integer), '[]') INTO v_deliveries
    FROM jsonb_array_elements(v_deliveries) d;
    RETURN (o - 'delivery') || jsonb_build_object('deliveries', v_deliveries);
END $$;
