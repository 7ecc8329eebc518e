-- Repairs of what a crash left behind, on PostgreSQL. The SQLite implementation of the same
-- transitions is store/recovery.py.

-- Fence a running agent whose turn is presumed dead: the old turn fenced so that it can write
-- nothing, then a recovery turn scheduled, or, if it was blocked in an ask, the agent left
-- suspended on that ask in a new epoch. `p_expected_turn`: the turn found expired must still be
-- the agent's; `p_lease_check`: its lease must still be expired. The result's "epoch".
CREATE OR REPLACE FUNCTION ar_take_over(
    p_agent bigint, p_reason text, p_expected_turn bigint, p_lease_check boolean,
    p_interrupted text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    t ar_turns;
    q ar_questions;
    r record;
    v_now timestamp;
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN ar__refused(o, 'no_agent_id', jsonb_build_object('agent_id', p_agent));
    END IF;
    IF a.state NOT IN ('running', 'waiting') OR a.suspended THEN
        RETURN ar__refused(o, 'nothing_to_take_over',
                           jsonb_build_object('name', a.display_name, 'state', a.state));
    END IF;
    v_now := ar__now();
    SELECT * INTO t FROM ar_turns WHERE agent_id = a.id AND epoch = a.epoch;
    IF p_expected_turn IS NOT NULL AND t.id IS DISTINCT FROM p_expected_turn THEN
        RETURN ar__refused(o, 'turn_changed');
    END IF;
    IF p_lease_check AND (t.id IS NULL OR t.lease_expires_at IS NULL
                          OR t.lease_expires_at >= v_now) THEN
        RETURN ar__refused(o, 'lease_renewed');
    END IF;
    IF t.id IS NOT NULL THEN
        UPDATE ar_turns SET status = 'fenced', ended_at = v_now, error = p_reason
        WHERE id = t.id;
    END IF;
    q := ar__waiting_question(a.id);
    IF q.id IS NOT NULL THEN
        a := ar__move(a, 'waiting');
        a.suspended := true;
        a.epoch := a.epoch + 1;
        UPDATE ar_questions SET asker_epoch = a.epoch WHERE id = q.id;
    ELSE
        r := ar__close_dangling(a, o, t.id, p_interrupted, NULL, v_now);
        r := ar__schedule(r.a, r.o - 'closed', 'recovery', v_now);
        a := r.a;
        o := r.o;
    END IF;
    PERFORM ar__save_agent(a);
    o := ar__agent_event(o, 'take_over', a, v_now,
                         jsonb_build_object('reason', p_reason, 'suspended', a.suspended),
                         p_turn => t.id, p_epoch => a.epoch);
    RETURN o || jsonb_build_object('epoch', a.epoch);
END $$;

-- ar_take_over, but only if the agent's running turn has a lease that is still expired under
-- the lock (a heartbeat may have renewed it since the sweeper listed it). The result's "epoch":
-- the new epoch, or NULL when there was nothing to take over any more.
CREATE OR REPLACE FUNCTION ar_take_over_expired(p_agent bigint, p_interrupted text)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb;
    t ar_turns;
BEGIN
    SELECT turn.* INTO t FROM ar_agents a
    JOIN ar_turns turn ON turn.agent_id = a.id AND turn.epoch = a.epoch
    WHERE a.id = p_agent AND turn.status = 'running';
    IF t.id IS NULL OR t.lease_expires_at IS NULL OR t.lease_expires_at >= ar__now() THEN
        RETURN ar__result() || jsonb_build_object('epoch', NULL);
    END IF;
    o := ar_take_over(p_agent, 'lease expired', t.id, true, p_interrupted);
    IF o -> 'refused' ->> 'code' IN ('nothing_to_take_over', 'turn_changed', 'lease_renewed') THEN
        RETURN ar__result() || jsonb_build_object('epoch', NULL);
    END IF;
    RETURN o;
END $$;

-- Enqueue again the turn task of an agent found lost (store/recovery.py, reenqueue): only if
-- it is still scheduled in `p_epoch` and nobody published its task since it was read (its last
-- publish still `p_last_published`, none pending); an agent another transaction holds is left
-- to it. The result's "reenqueued".
CREATE OR REPLACE FUNCTION ar_reenqueue(
    p_agent bigint, p_epoch integer, p_last_published timestamp, p_windows integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    v_unpublished bigint;
    v_last timestamp;
    v_now timestamp;
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent FOR NO KEY UPDATE SKIP LOCKED;
    IF a.id IS NULL OR a.state <> 'scheduled' OR a.epoch <> p_epoch THEN
        RETURN o || '{"reenqueued": false}';
    END IF;
    SELECT count(*) FILTER (WHERE published_at IS NULL), max(published_at)
    INTO v_unpublished, v_last
    FROM ar_outbox WHERE agent_id = a.id AND epoch = a.epoch AND kind = 'enqueue_turn';
    IF v_unpublished > 0 OR v_last IS DISTINCT FROM p_last_published THEN
        RETURN o || '{"reenqueued": false}';
    END IF;
    v_now := ar__now();
    a.scheduled_at := v_now;
    PERFORM ar__save_agent(a);
    o := ar__outbox(o, a, 'enqueue_turn', jsonb_build_object(
        'trigger', coalesce(a.pending_trigger, 'new'), 'reenqueued', true), v_now);
    o := ar__agent_event(o, 'reenqueued', a, v_now,
                         jsonb_build_object('backoff_windows', p_windows), p_epoch => a.epoch);
    RETURN o || '{"reenqueued": true}';
END $$;

-- Outbox rows to publish again (store/recovery.py, claim_unpublished): never published,
-- created at or before `p_cutoff` and not taken by a sweeper since then, oldest first, at most
-- `p_limit`; taken now (attempted_at), skipping rows another sweeper holds locked. The
-- result's "entries".
CREATE OR REPLACE FUNCTION ar_claim_unpublished(p_cutoff timestamp, p_limit integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamp := ar__now();
    v_entries jsonb;
BEGIN
    WITH taken AS (
        SELECT id FROM ar_outbox
        WHERE published_at IS NULL AND created_at <= p_cutoff
          AND (attempted_at IS NULL OR attempted_at <= p_cutoff)
        ORDER BY id LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    ), marked AS (
        UPDATE ar_outbox b SET attempted_at = v_now FROM taken WHERE b.id = taken.id
        RETURNING b.id, b.kind, b.agent_id, b.epoch, b.payload
    )
    SELECT coalesce(jsonb_agg(jsonb_build_object(
        'id', id, 'kind', kind, 'agent_id', agent_id, 'epoch', epoch, 'payload', payload)
        ORDER BY id), '[]')
    INTO v_entries FROM marked;
    RETURN ar__result() || jsonb_build_object('entries', v_entries);
END $$;

-- The sweeper's bulkheads (store/quarantine.py). A quarantine row as the store returns it.
CREATE OR REPLACE FUNCTION ar__quarantine(q ar_quarantine) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'agent_id', q.agent_id, 'team_id', q.team_id, 'step', q.step, 'failures', q.failures,
        'error', q.error, 'first_failed_at', q.first_failed_at,
        'last_failed_at', q.last_failed_at, 'until', q.until);
END $$;

-- One more failure of `p_step` for the agent: ledgered (`sweep_failed`), and the agent left
-- alone for 1, 2, 4, ... sweep periods (`p_period` seconds; at most `p_max_periods`); at
-- `p_quarantine_after` failures in a row, `quarantined`. The result's "quarantine": the row,
-- or NULL when the agent is gone.
CREATE OR REPLACE FUNCTION ar_record_sweep_failure(
    p_agent bigint, p_step ar_sweep_step, p_error text, p_period float8,
    p_quarantine_after integer, p_max_periods integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    a ar_agents;
    q ar_quarantine;
    v_now timestamp;
    v_periods integer;
    v_detail jsonb;
BEGIN
    SELECT * INTO a FROM ar_agents WHERE id = p_agent;
    IF NOT FOUND THEN
        RETURN o || jsonb_build_object('quarantine', NULL);
    END IF;
    v_now := ar__now();
    INSERT INTO ar_quarantine
        (agent_id, team_id, step, failures, error, first_failed_at, last_failed_at, until)
    VALUES (a.id, a.team_id, p_step, 0, p_error, v_now, v_now, v_now)
    ON CONFLICT DO NOTHING;
    SELECT * INTO q FROM ar_quarantine WHERE agent_id = a.id FOR UPDATE;
    q.failures := q.failures + 1;
    v_periods := least(2 ^ (q.failures - 1), p_max_periods);
    UPDATE ar_quarantine SET failures = q.failures, step = p_step, error = p_error,
        last_failed_at = v_now, until = v_now + make_interval(secs => p_period * v_periods)
    WHERE agent_id = a.id
    RETURNING * INTO q;
    v_detail := jsonb_build_object('step', p_step, 'failures', q.failures, 'error', p_error);
    o := ar__agent_event(o, 'sweep_failed', a, v_now,
                         jsonb_build_object('left_alone_periods', v_periods) || v_detail);
    IF q.failures = p_quarantine_after THEN
        o := ar__agent_event(o, 'quarantined', a, v_now, v_detail);
    END IF;
    RETURN o || jsonb_build_object('quarantine', ar__quarantine(q));
END $$;

-- The agent's failures are behind it: its row goes, and a quarantine (from
-- `p_quarantine_after` failures) is ledgered lifted. "lifted": whether it had a row.
CREATE OR REPLACE FUNCTION ar__lift_quarantine(
    INOUT o jsonb, p_agent bigint, p_reason text, p_quarantine_after integer, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    q ar_quarantine;
BEGIN
    SELECT * INTO q FROM ar_quarantine WHERE agent_id = p_agent FOR UPDATE;
    IF NOT FOUND THEN
        o := o || '{"lifted": false}';
        RETURN;
    END IF;
    IF q.failures >= p_quarantine_after THEN
        o := ar__event(o, 'quarantine_lifted', q.team_id, q.agent_id, p_now, jsonb_build_object(
            'step', q.step, 'failures', q.failures, 'reason', p_reason));
    END IF;
    DELETE FROM ar_quarantine WHERE agent_id = p_agent;
    o := o || '{"lifted": true}';
END $$;

-- A repair succeeded for the agent: ar__lift_quarantine.
CREATE OR REPLACE FUNCTION ar_lift_quarantine(
    p_agent bigint, p_reason text, p_quarantine_after integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ar__lift_quarantine(ar__result(), p_agent, p_reason, p_quarantine_after, ar__now());
END $$;

-- Lift the agents whose backoff is over and that no repair needs any more (resting or
-- terminated), in id order, but those in `p_keep` (a pass tried them) and those whose failed
-- step is a background job's report (it stays until it is made). The result's "lifted": their
-- ids.
CREATE OR REPLACE FUNCTION ar_lift_settled_quarantines(
    p_keep bigint[], p_reason text, p_quarantine_after integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    v_now timestamp := ar__now();
    v_agent bigint;
    v_lifted bigint[] := '{}';
BEGIN
    FOR v_agent IN
        SELECT q.agent_id FROM ar_quarantine q JOIN ar_agents a ON a.id = q.agent_id
        WHERE q.until <= v_now AND q.step <> 'poll_job'
          AND a.state IN ('idle', 'completed', 'terminated')
          AND NOT q.agent_id = ANY (p_keep)
        ORDER BY q.agent_id
    LOOP
        o := ar__lift_quarantine(o, v_agent, p_reason, p_quarantine_after, v_now);
        v_lifted := v_lifted || v_agent;
    END LOOP;
    RETURN (o - 'lifted') || jsonb_build_object('lifted', to_jsonb(v_lifted));
END $$;
