-- Background jobs on PostgreSQL: record one, route its completion once, batch the completions
-- of a burst. The SQLite implementation of the same transitions is store/jobs.py.

-- Record a background job before its task is sent, so that a completion (or the poller) always
-- finds it. The result's "job".
CREATE OR REPLACE FUNCTION ar_start_job(p_team bigint, p_agent text, p_name text, p_task text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    j ar_background_jobs;
    v_now timestamp := ar__now();
BEGIN
    IF NOT EXISTS (SELECT 1 FROM ar_teams WHERE id = p_team) THEN
        RETURN ar__refused(o, 'unknown_team', jsonb_build_object('team_id', p_team));
    END IF;
    SELECT * INTO a FROM ar_agents WHERE team_id = p_team AND display_name = p_agent;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'unknown_agent',
                           jsonb_build_object('name', p_agent, 'team_id', p_team));
    ELSIF a.state = 'terminated' THEN
        RETURN ar__refused(o, 'terminated', jsonb_build_object('name', p_agent));
    ELSIF EXISTS (SELECT 1 FROM ar_background_jobs WHERE task_id = p_task) THEN
        RETURN ar__refused(o, 'job_task_recorded', jsonb_build_object('task_id', p_task));
    END IF;
    INSERT INTO ar_background_jobs (team_id, agent_id, name, task_id, status, created_at)
    VALUES (p_team, a.id, left(p_name, 200), p_task, 'running', v_now)
    RETURNING * INTO j;
    o := ar__agent_event(o, 'job_started', a, v_now, jsonb_build_object(
        'job_id', j.id, 'name', j.name, 'task_id', p_task));
    RETURN o || jsonb_build_object('job', to_jsonb(j));
END $$;

-- Give the turn task just scheduled (the last outbox row of `o`) a countdown, published with it.
CREATE OR REPLACE FUNCTION ar__delay_turn(INOUT o jsonb, p_seconds float8, p_first timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_entry jsonb := o -> 'outbox' -> -1;
    v_payload jsonb := (v_entry -> 'payload') || jsonb_build_object(
        'countdown', p_seconds, 'batch_started', to_jsonb(p_first));
BEGIN
    UPDATE ar_outbox SET payload = v_payload WHERE id = (v_entry ->> 'id')::bigint;
    o := jsonb_set(o, ARRAY['outbox', (jsonb_array_length(o -> 'outbox') - 1)::text, 'payload'],
                   v_payload);
END $$;

-- Debounce: the first completion schedules the agent's turn `p_seconds` late; each further one
-- that arrives before that turn started pushes it back by `p_seconds` again (a new epoch; the
-- earlier task is refused by the fence), for at most `p_max_windows` windows after the first.
CREATE OR REPLACE FUNCTION ar__batch_turn(
    INOUT o jsonb, p_agent bigint, p_outcome ar_route_outcome, p_seconds float8,
    p_max_windows integer, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    a ar_agents;
    r record;
    v_first timestamp;
BEGIN
    IF p_outcome = 'triggered_new_turn' THEN
        o := ar__delay_turn(o, p_seconds, p_now);
        RETURN;
    ELSIF p_outcome <> 'coalesced' THEN
        RETURN;
    END IF;
    SELECT * INTO a FROM ar_agents WHERE id = p_agent;
    SELECT (payload ->> 'batch_started')::timestamp INTO v_first FROM ar_outbox
    WHERE agent_id = a.id AND epoch = a.epoch AND kind = 'enqueue_turn'
    ORDER BY id DESC LIMIT 1;
    IF v_first IS NULL  -- not a batch turn (a message woke it): it starts as published
       OR p_now - v_first >= make_interval(secs => p_seconds * p_max_windows) THEN
        RETURN;
    END IF;
    r := ar__schedule(a, o, coalesce(a.pending_trigger, 'new'), p_now);
    o := ar__delay_turn(r.o, p_seconds, v_first);
    PERFORM ar__save_agent(r.a);
END $$;

-- Route a job's completion to its agent as a notice from `job:<name>`, once: the job's row lock
-- orders the link callback against the poller, and the second finds the job finished (the
-- dedup key `job:<id>` guards the message as well). The notice's content is
-- "Background job <name> (<task id>) finished|failed: <result>"; `p_result_body` is the result
-- as it appears inside an envelope (NULL: as it is; the job's name and task id, which hold no
-- markup, need no escaping). The result's "job".
CREATE OR REPLACE FUNCTION ar_finish_job(
    p_job bigint, p_ok boolean, p_result text, p_result_body text, p_batch_seconds float8,
    p_max_windows integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    j ar_background_jobs;
    a ar_agents;
    v_now timestamp;
    v_head text;
    v_reported boolean := false;
    r record;
BEGIN
    SELECT * INTO j FROM ar_background_jobs WHERE id = p_job FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'unknown_job', jsonb_build_object('job_id', p_job));
    ELSIF j.status <> 'running' THEN
        RETURN o || jsonb_build_object('job', to_jsonb(j));
    END IF;
    v_now := ar__now();
    SELECT * INTO a FROM ar_agents WHERE id = j.agent_id;
    UPDATE ar_background_jobs
    SET status = CASE WHEN p_ok THEN 'succeeded' ELSE 'failed' END::ar_job_status,
        finished_at = v_now, result = p_result
    WHERE id = j.id RETURNING * INTO j;
    IF a.state <> 'terminated' THEN
        v_head := format('Background job %s (%s) %s: ', j.name, j.task_id,
                         CASE WHEN p_ok THEN 'finished' ELSE 'failed' END);
        r := ar__route(o, a.display_name, true, ar__message(
            j.team_id, 'job:' || j.name, 'notice', NULL, v_head || p_result,
            v_head || p_result_body, NULL, true, 'job:' || j.id));
        o := r.o;
        IF o ? 'refused' THEN  -- its agent exists and is not terminated: a bug, rolled back
            RAISE EXCEPTION 'the notice of job % refused: %', j.id, o -> 'refused';
        END IF;
        v_reported := true;
        UPDATE ar_background_jobs SET notice_message_id = (r.d ->> 'message_id')::bigint
        WHERE id = j.id RETURNING * INTO j;
        IF p_batch_seconds > 0 THEN
            o := ar__batch_turn(o, a.id, (r.d ->> 'outcome')::ar_route_outcome,
                                p_batch_seconds, p_max_windows, v_now);
        END IF;
    END IF;
    o := ar__agent_event(o, 'job_finished', a, v_now,
                         jsonb_build_object('job_id', j.id, 'status', j.status,
                                            'reported', v_reported),
                         p_message => j.notice_message_id);
    RETURN o || jsonb_build_object('job', to_jsonb(j));
END $$;
