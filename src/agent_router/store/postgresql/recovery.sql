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
