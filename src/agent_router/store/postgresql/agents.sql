-- Teams and agents on PostgreSQL, under the team lock: create, stop, terminate. The SQLite
-- implementation of the same transitions is store/agents.py.

-- A new idle agent; its system prompt, snapshotted now, opens its transcript. `p_runner`: the
-- host's task for its turns (NULL: the built-in loop).
CREATE OR REPLACE FUNCTION ar__insert_agent(
    p_team bigint, p_name text, p_role text, p_system_prompt text, p_is_lead boolean,
    p_runner text, p_now timestamp)
RETURNS ar_agents LANGUAGE plpgsql AS $$
DECLARE
    a ar_agents;
BEGIN
    INSERT INTO ar_agents (team_id, display_name, role, is_lead, state, suspended, epoch,
                           next_seq, next_position, system_prompt, stop_requested, created_at,
                           runner)
    VALUES (p_team, p_name, p_role, p_is_lead, 'idle', false, 0, 1, 0, p_system_prompt, false,
            p_now, p_runner)
    RETURNING * INTO a;
    IF p_system_prompt IS NOT NULL AND p_system_prompt <> '' THEN
        a := ar__append(a, jsonb_build_object('role', 'system', 'content', p_system_prompt),
                        NULL, p_now);
        PERFORM ar__save_agent(a);
    END IF;
    RETURN a;
END $$;

-- A team whose agents run on `p_model` (NULL: each role's, else the worker's), its lead (named
-- `p_name`) and its budget row (`p_limits`, as stored); `p_user_task` receives its messages
-- to the user (NULL: the host reads them). The result's "team" and "lead".
CREATE OR REPLACE FUNCTION ar_create_team(
    p_name text, p_role text, p_system_prompt text, p_runner text, p_limits jsonb,
    p_model text, p_user_task text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    v_now timestamp := ar__now();
    v_team ar_teams;
    a ar_agents;
BEGIN
    INSERT INTO ar_teams (created_at, model, user_task) VALUES (v_now, p_model, p_user_task)
    RETURNING * INTO v_team;
    a := ar__insert_agent(v_team.id, p_name, p_role, p_system_prompt, true, p_runner, v_now);
    o := ar__agent_event(o, 'team_created', a, v_now);
    PERFORM ar__insert_budget(v_team.id, v_team.created_at, p_limits);
    RETURN o || jsonb_build_object('team', to_jsonb(v_team), 'lead', to_jsonb(a));
END $$;

-- Add a sub-agent (named `p_name`, else `{role}_{n}` with n counted per role from 1) and, when
-- `p_task` is given ({sender, external, type, subtype, content, body, question_id, wake,
-- dedup_key}), route that message to it in the same transaction: both exist, or neither. The
-- result's "agent", and "delivery" of the task.
CREATE OR REPLACE FUNCTION ar_create_agent(
    p_team bigint, p_role text, p_name text, p_system_prompt text, p_runner text,
    p_task jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
    v_now timestamp;
    v_name text := p_name;
    v_n integer := 1;
BEGIN
    PERFORM 1 FROM ar_teams WHERE id = p_team FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'unknown_team', jsonb_build_object('team_id', p_team));
    END IF;
    v_now := ar__now();
    IF v_name IS NULL THEN
        -- The team lock makes the count safe.
        WHILE EXISTS (SELECT 1 FROM ar_agents WHERE team_id = p_team AND role = p_role
                      AND display_name = p_role || '_' || v_n) LOOP
            v_n := v_n + 1;
        END LOOP;
        v_name := p_role || '_' || v_n;
    END IF;
    IF EXISTS (SELECT 1 FROM ar_agents WHERE team_id = p_team AND display_name = v_name) THEN
        o := ar__refused(o, 'display_name_taken',
                         jsonb_build_object('name', v_name, 'team_id', p_team));
        o := jsonb_set(o, '{refused,event}', jsonb_build_object(
            'action', 'send_rejected', 'team_id', p_team,
            'detail', jsonb_build_object('reason', 'duplicate_display_name',
                                         'display_name', v_name)));
        RETURN ar__refusal_event(o, v_now);
    END IF;
    BEGIN
        a := ar__insert_agent(p_team, v_name, p_role, p_system_prompt, false, p_runner, v_now);
        o := ar__agent_event(o, 'agent_created', a, v_now,
                             jsonb_build_object('display_name', v_name, 'role', p_role));
        IF p_task IS NOT NULL THEN
            r := ar__route(o, v_name, (p_task ->> 'external')::boolean, jsonb_populate_record(
                NULL::ar_messages, p_task || jsonb_build_object(
                    'team_id', p_team, 'source_name', p_task -> 'sender')));
            o := r.o || jsonb_build_object('delivery', r.d);
            IF o ? 'refused' THEN
                RAISE EXCEPTION USING ERRCODE = 'AR001', MESSAGE = (o -> 'refused')::text;
            END IF;
            SELECT * INTO a FROM ar_agents WHERE id = a.id;
        END IF;
    EXCEPTION WHEN SQLSTATE 'AR001' THEN
        -- The agent is not created: the task's refusal is recorded.
        RETURN ar__refusal_event(jsonb_set(ar__result(), '{refused}', SQLERRM::jsonb),
                                 ar__now());
    END;
    RETURN o || jsonb_build_object('agent', to_jsonb(a));
END $$;

-- For stop and terminate: the team lock, then the agent and every agent with an open question
-- to it, by id. Refuses the lead and a terminated agent; "questions": the open questions asked
-- of it, by id.
CREATE OR REPLACE FUNCTION ar__lock_sub_agent_and_askers(
    INOUT a ar_agents, INOUT o jsonb, p_agent bigint, p_done text)
LANGUAGE plpgsql AS $$
DECLARE
    v_team bigint;
BEGIN
    SELECT team_id INTO v_team FROM ar_agents WHERE id = p_agent;
    IF NOT FOUND THEN
        o := ar__refused(o, 'no_agent_id', jsonb_build_object('agent_id', p_agent));
        RETURN;
    END IF;
    PERFORM 1 FROM ar_teams WHERE id = v_team FOR NO KEY UPDATE;
    PERFORM 1 FROM ar_agents
    WHERE id = p_agent OR id IN (SELECT asker_agent_id FROM ar_questions
                                 WHERE target_agent_id = p_agent AND status = 'open')
    ORDER BY id FOR NO KEY UPDATE;
    SELECT * INTO a FROM ar_agents WHERE id = p_agent;
    IF a.is_lead THEN
        o := ar__refused(o, 'lead_kept', jsonb_build_object('done', p_done));
    ELSIF a.state = 'terminated' THEN
        o := ar__refused(o, 'already_terminated', jsonb_build_object('name', a.display_name));
    END IF;
END $$;

-- The questions asked of `p_agent` still open are cancelled; their askers still blocked on one
-- get `p_result`.
CREATE OR REPLACE FUNCTION ar__cancel_asked_of(
    INOUT o jsonb, p_agent bigint, p_result text, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    q ar_questions;
    asker ar_agents;
    r record;
    v_count integer := 0;
BEGIN
    FOR q IN SELECT * FROM ar_questions WHERE target_agent_id = p_agent AND status = 'open'
             ORDER BY id LOOP
        q := ar__close_question(q, 'cancelled', p_now);
        v_count := v_count + 1;
        CONTINUE WHEN NOT q.waiting;
        SELECT * INTO asker FROM ar_agents WHERE id = q.asker_agent_id;
        r := ar__release(asker, o, q, p_result, p_now);
        o := r.o;
        PERFORM ar__save_agent(r.a);
    END LOOP;
    o := jsonb_set(o, '{cancelled}', to_jsonb(v_count));
END $$;

-- Final: fence any running turn, drop pending messages with `p_reason`, cancel the questions
-- it asked, and release agents blocked on a question to it.
CREATE OR REPLACE FUNCTION ar_terminate(p_agent bigint, p_reason text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    r record;
    v_now timestamp;
    v_dropped integer;
BEGIN
    r := ar__lock_sub_agent_and_askers(a, o, p_agent, 'terminated');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN o;
    END IF;
    v_now := ar__now();
    UPDATE ar_turns SET status = 'fenced', ended_at = v_now,
                        error = format('terminated: %s', p_reason)
    WHERE agent_id = a.id AND status = 'running';
    r := ar__close_dangling(a, o, NULL, format('cancelled: agent terminated (%s)', p_reason),
                            NULL, v_now);
    a := r.a;
    o := r.o - 'closed';
    UPDATE ar_messages SET status = 'dropped', drop_reason = format('target terminated: %s', p_reason)
    WHERE target_agent_id = a.id AND status = 'pending';
    GET DIAGNOSTICS v_dropped = ROW_COUNT;
    PERFORM ar__cancel_own_questions(a.id, v_now);
    o := ar__cancel_asked_of(o, a.id,
        format('cancelled: %s was terminated (%s)', a.display_name, p_reason), v_now) - 'cancelled';
    a.epoch := a.epoch + 1;
    a := ar__move(a, 'terminated');
    a.suspended := false;
    a.pending_trigger := NULL;
    PERFORM ar__save_agent(a);
    o := ar__agent_event(o, 'terminated', a, v_now,
                         jsonb_build_object('reason', p_reason, 'dropped', v_dropped),
                         p_epoch => a.epoch);
    RETURN o;
END $$;

-- Stop a sub-agent cooperatively. A resting, scheduled or suspended agent stops at once (a
-- queued turn task is fenced); a running or blocked one is flagged and stops at its next
-- boundary (ar_finish_stop). Questions it asked and questions asked of it are cancelled
-- (blocked askers get a cancelled result); its mailbox is kept. The result's "state": the
-- agent's after the request (idle, or running while the stop is pending).
CREATE OR REPLACE FUNCTION ar_request_stop(p_agent bigint, p_reason text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    own ar_questions;
    r record;
    v_now timestamp;
    v_before ar_agent_state;
    v_cancelled integer;
    v_action ar_ledger_action;
    v_stopped text := format('cancelled: stopped (%s)', p_reason);
BEGIN
    r := ar__lock_sub_agent_and_askers(a, o, p_agent, 'stopped');
    a := r.a;
    o := r.o;
    IF o ? 'refused' THEN
        RETURN o;
    END IF;
    v_now := ar__now();
    o := ar__cancel_asked_of(o, a.id,
        format('cancelled: %s was stopped (%s)', a.display_name, p_reason), v_now);
    v_cancelled := (o ->> 'cancelled')::integer;
    o := o - 'cancelled';
    v_before := a.state;
    own := ar__waiting_question(a.id);
    IF a.state = 'running' OR (a.state = 'waiting' AND NOT a.suspended) THEN
        a.stop_requested := true;
        IF own.id IS NOT NULL THEN  -- blocked in a worker: end the wait, the turn then stops
            own := ar__close_question(own, 'cancelled', v_now);
            r := ar__release(a, o, own, v_stopped, v_now);
            a := r.a;
            o := r.o;
        END IF;
        v_action := 'stop_requested';
    ELSE
        -- No worker holds it: idle at once, a queued turn task fenced.
        IF own.id IS NOT NULL THEN  -- suspended on a wait: its call gets the cancelled result
            own := ar__close_question(own, 'cancelled', v_now, NULL, true);
        END IF;
        r := ar__close_dangling(a, o, NULL, v_stopped, NULL, v_now);
        a := r.a;
        o := r.o - 'closed';
        PERFORM ar__cancel_own_questions(a.id, v_now);
        IF a.state IN ('scheduled', 'waiting') THEN
            a.epoch := a.epoch + 1;
        END IF;
        a := ar__move(a, 'idle');
        a.suspended := false;
        a.pending_trigger := NULL;
        a.stop_requested := false;
        v_action := 'stopped';
    END IF;
    PERFORM ar__save_agent(a);
    o := ar__agent_event(o, v_action, a, v_now, jsonb_build_object(
            'reason', p_reason, 'state_before', v_before, 'cancelled_questions', v_cancelled),
        p_epoch => a.epoch);
    RETURN o || jsonb_build_object('state', a.state);
END $$;

-- Queue `p_count` context-only notices for an agent in bulk (benchmarks and load tests: it
-- bypasses routing decisions, so it never wakes anyone).
CREATE OR REPLACE FUNCTION ar_seed_mailbox(
    p_agent bigint, p_count integer, p_content text, p_sender text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    v_now timestamp;
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'no_agent_id', jsonb_build_object('agent_id', p_agent));
    END IF;
    v_now := ar__now();
    INSERT INTO ar_messages (team_id, seq, source_name, target_agent_id, type, content, wake,
                             outcome, status, created_at)
    SELECT a.team_id, a.next_seq + i, p_sender, a.id, 'notice', p_content, false, 'queued',
           'pending', v_now
    FROM generate_series(0, p_count - 1) i;
    a.next_seq := a.next_seq + greatest(p_count, 0);
    PERFORM ar__save_agent(a);
    RETURN o;
END $$;
