-- The user channel on PostgreSQL: messages to the user (an answer, progress, a question) and
-- the wait of an ask_user call. The lock: the team's lead's row, then the writer's (ascending
-- ids: the lead is its team's first agent), so that a team's messages to the user are numbered
-- in commit order. The SQLite implementation of the same transitions is store/users.py.

-- Lock the writer's lead (when the writer is not the lead), then the writer with its turn
-- fenced. The writer's row in `a`, its lead's in `l`.
CREATE OR REPLACE FUNCTION ar__user_writer(
    INOUT a ar_agents, INOUT l ar_agents, INOUT o jsonb, p_turn bigint, p_agent bigint,
    p_epoch integer, p_operation text)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    SELECT lead.* INTO l FROM ar_agents w JOIN ar_agents lead
        ON lead.team_id = w.team_id AND lead.is_lead
    WHERE w.id = p_agent;
    IF l.id IS NOT NULL AND l.id <> p_agent THEN
        SELECT * INTO l FROM ar_agents WHERE id = l.id FOR NO KEY UPDATE;
    END IF;
    r := ar__fenced(a, o, p_turn, p_agent, p_epoch, p_operation);
    a := r.a;
    o := r.o;
    IF l.id IS NULL OR l.id = p_agent THEN
        l := a;
    END IF;
END $$;

-- A message to the user, its `user_message` event (an event of the lead's: the team's feed
-- reads the lead's events) and its delivery: an outbox row that publishes the team's user task
-- after the commit (with no user task, written published: its signal only wakes the feed).
CREATE OR REPLACE FUNCTION ar__write_user_message(
    INOUT o jsonb, a ar_agents, l ar_agents, p_kind text, p_content text,
    p_turn bigint, p_question bigint, p_dedup text, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    u ar_user_messages;
    v_message jsonb;
BEGIN
    INSERT INTO ar_user_messages (team_id, agent_id, kind, content, question_id, turn_id,
                                  dedup_key, created_at)
    VALUES (a.team_id, a.id, p_kind::ar_user_message_kind, p_content, p_question, p_turn,
            p_dedup, p_now)
    RETURNING * INTO u;
    v_message := ar__user_message(u.id, u.team_id, a.display_name, u.kind::text, u.content,
                                  u.question_id, u.created_at);
    o := ar__outbox(o, a, 'deliver_user', jsonb_build_object(
        'task', (SELECT user_task FROM ar_teams WHERE id = a.team_id), 'message', v_message),
        p_now);
    o := ar__agent_event(o, 'user_message', l, p_now, jsonb_build_object(
            'user_message_id', u.id, 'kind', p_kind, 'sender', a.display_name,
            'question_id', p_question),
        p_turn => p_turn);
    o := o || jsonb_build_object('user_message', v_message);
END $$;

-- A message to the user as the store returns it (UserMessage.as_payload).
CREATE OR REPLACE FUNCTION ar__user_message(
    p_id bigint, p_team bigint, p_sender text, p_kind text, p_content text, p_question bigint,
    p_created timestamp)
RETURNS jsonb LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object('id', p_id, 'team_id', p_team, 'sender', p_sender,
                              'kind', p_kind, 'content', p_content, 'question_id', p_question,
                              'created_at', ar__isoformat(p_created));
END $$;

-- The turn's agent tells the user `p_content` (an answer or progress); with `p_dedup`, a
-- retried write returns the first ("duplicate": true). The result's "user_message".
CREATE OR REPLACE FUNCTION ar_tell_user(
    p_turn bigint, p_agent bigint, p_epoch integer, p_kind text, p_content text,
    p_dedup text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    l ar_agents;
    u ar_user_messages;
    r record;
BEGIN
    r := ar__user_writer(a, l, o, p_turn, p_agent, p_epoch, 'tell_user');
    a := r.a;
    l := r.l;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    IF p_dedup IS NOT NULL THEN
        SELECT * INTO u FROM ar_user_messages WHERE team_id = a.team_id AND dedup_key = p_dedup;
        IF FOUND THEN
            RETURN o || jsonb_build_object('duplicate', true, 'user_message', ar__user_message(
                u.id, u.team_id, a.display_name, u.kind::text, u.content, u.question_id,
                u.created_at));
        END IF;
    END IF;
    o := ar__write_user_message(o, a, l, p_kind, p_content, p_turn, NULL, p_dedup, ar__now());
    RETURN o || '{"duplicate": false}';
END $$;

-- The turn's agent asks the user `p_content` and waits, holding no worker: the question opens
-- (a wait of kind user, on the asker itself: nobody in the team answers it), the agent is
-- waiting and suspended at once and its turn ends, and the question reaches the user as a
-- message of kind question. The result's "question" and "user_message".
CREATE OR REPLACE FUNCTION ar_ask_user(
    p_turn bigint, p_agent bigint, p_epoch integer, p_content text, p_call text,
    p_timeout float8)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    l ar_agents;
    q ar_questions;
    r record;
    v_now timestamp;
BEGIN
    r := ar__user_writer(a, l, o, p_turn, p_agent, p_epoch, 'ask_user');
    a := r.a;
    l := r.l;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    o := ar__refuse_closed_call(o, a, p_turn, p_call);
    IF o ? 'refused' THEN
        RETURN ar__refusal_event(o, ar__now());
    END IF;
    v_now := ar__now();
    r := ar__open_question(a, o, q, p_turn, a.id, 'user', p_call, 'user', p_timeout, '{}',
                           v_now);
    a := r.a;
    o := r.o;
    q := r.q;
    a.suspended := true;
    o := ar__suspend_turn(o, a, p_turn, p_epoch, v_now);
    IF l.id = a.id THEN
        l := a;
    END IF;
    o := ar__write_user_message(o, a, l, 'question', p_content, p_turn, q.id, NULL, v_now);
    RETURN o || jsonb_build_object('question', to_jsonb(q));
END $$;

-- Every question to the user still open at half its time (its deadline less its opening)
-- reaches the user once more: a message of kind question with the same question id and text,
-- from the asker, its dedup key `p_prefix` and the question's id, under the asker's lock.
-- The result's "reminded": how many.
CREATE OR REPLACE FUNCTION ar_remind_user(p_prefix text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    q ar_questions;
    a ar_agents;
    u ar_user_messages;
    v_now timestamp := ar__now();
    v_reminded integer := 0;
BEGIN
    FOR q IN SELECT * FROM ar_questions
             WHERE kind = 'user' AND status = 'open'
               AND created_at + (deadline - created_at) / 2 <= v_now
             ORDER BY asker_agent_id, id
    LOOP
        SELECT * INTO a FROM ar_agents WHERE id = q.asker_agent_id FOR NO KEY UPDATE;
        SELECT * INTO u FROM ar_user_messages WHERE question_id = q.id ORDER BY id LIMIT 1;
        CONTINUE WHEN u.id IS NULL
            OR (SELECT status FROM ar_questions WHERE id = q.id) <> 'open'
            OR EXISTS (SELECT 1 FROM ar_user_messages
                       WHERE team_id = q.team_id AND dedup_key = p_prefix || q.id);
        o := ar__write_user_message(o, a, a, 'question', u.content, NULL, q.id,
                                    p_prefix || q.id, v_now);
        v_reminded := v_reminded + 1;
    END LOOP;
    RETURN (o - 'user_message') || jsonb_build_object('reminded', v_reminded);
END $$;
