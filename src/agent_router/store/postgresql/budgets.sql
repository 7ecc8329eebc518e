-- Team budgets on PostgreSQL: one ar_budgets row per team holds its limits (NULL: unlimited)
-- and what it used; every check locks that row, compares and counts in the same transaction.
-- The SQLite implementation of the same transitions is store/budgets.py.

-- A team's budget row: `p_limits` (as stored, by column; a limit not named: unlimited) from
-- `p_started`, nothing used yet. Nothing if the team has one already.
CREATE OR REPLACE FUNCTION ar__insert_budget(p_team bigint, p_started timestamp, p_limits jsonb)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO ar_budgets (team_id, started_at, max_model_calls, max_turns, max_tokens,
                            max_cost_nano, max_wall_seconds, max_sub_agents_created,
                            max_sub_agents_active, deadline_at, model_calls, turns,
                            prompt_tokens, completion_tokens, cached_tokens, cost_nano, warned,
                            exhausted)
    VALUES (p_team, p_started, (p_limits ->> 'max_model_calls')::bigint,
            (p_limits ->> 'max_turns')::bigint, (p_limits ->> 'max_tokens')::bigint,
            (p_limits ->> 'max_cost_nano')::bigint, (p_limits ->> 'max_wall_seconds')::float8,
            (p_limits ->> 'max_sub_agents_created')::integer,
            (p_limits ->> 'max_sub_agents_active')::integer,
            p_started + make_interval(secs => (p_limits ->> 'max_wall_seconds')::float8),
            0, 0, 0, 0, 0, 0, false, NULL)
    ON CONFLICT DO NOTHING;
END $$;

-- The team's budget row, locked; made from `p_defaults` (the settings' limits, as stored) if
-- the team has none yet (a team created before budgets existed). NULL: no such team.
CREATE OR REPLACE FUNCTION ar__budget_row(p_team bigint, p_defaults jsonb) RETURNS ar_budgets
LANGUAGE plpgsql AS $$
DECLARE
    b ar_budgets;
    v_created timestamp;
BEGIN
    SELECT * INTO b FROM ar_budgets WHERE team_id = p_team FOR UPDATE;
    IF FOUND THEN
        RETURN b;
    END IF;
    SELECT created_at INTO v_created FROM ar_teams WHERE id = p_team;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM ar__insert_budget(p_team, v_created, p_defaults);
    SELECT * INTO b FROM ar_budgets WHERE team_id = p_team FOR UPDATE;
    RETURN b;
END $$;

-- The team's sub-agents: ever created, and not terminated.
CREATE OR REPLACE FUNCTION ar__sub_agents(p_team bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT jsonb_build_array(count(*), count(*) FILTER (WHERE state <> 'terminated'))
    FROM ar_agents WHERE team_id = p_team AND NOT is_lead);
END $$;

-- A budget's limit, in its unit (dollars for the cost); NULL: unlimited.
CREATE OR REPLACE FUNCTION ar__budget_limit(b ar_budgets, p_name ar_budget_name)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE p_name
        WHEN 'model_calls' THEN b.max_model_calls::float8
        WHEN 'turns' THEN b.max_turns::float8
        WHEN 'tokens' THEN b.max_tokens::float8
        WHEN 'cost' THEN b.max_cost_nano::float8 / 1000000000
        WHEN 'wall_seconds' THEN b.max_wall_seconds
        WHEN 'sub_agents_created' THEN b.max_sub_agents_created::float8
        WHEN 'sub_agents_active' THEN b.max_sub_agents_active::float8
    END;
END $$;

-- What the team used of a team-stopping budget, at `p_now`.
CREATE OR REPLACE FUNCTION ar__budget_used(b ar_budgets, p_name ar_budget_name, p_now timestamp)
RETURNS float8 LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN CASE p_name
        WHEN 'model_calls' THEN b.model_calls::float8
        WHEN 'turns' THEN b.turns::float8
        WHEN 'tokens' THEN b.prompt_tokens::float8 + b.completion_tokens::float8
        WHEN 'cost' THEN b.cost_nano::float8 / 1000000000
        WHEN 'wall_seconds' THEN greatest(0, extract(epoch FROM p_now - b.started_at)::float8)
    END;
END $$;

-- The team-stopping budgets, in the order they are checked (by name).
CREATE OR REPLACE FUNCTION ar__stopping_budgets() RETURNS ar_budget_name[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN ARRAY['cost', 'model_calls', 'tokens', 'turns', 'wall_seconds']::ar_budget_name[];
END $$;

-- The first team-stopping budget with nothing left (the turns only when `p_turns`: a turn that
-- started may make its model calls); NULL: none.
CREATE OR REPLACE FUNCTION ar__budget_spent(b ar_budgets, p_now timestamp, p_turns boolean)
RETURNS ar_budget_name LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (SELECT n FROM unnest(ar__stopping_budgets()) WITH ORDINALITY AS s(n, k)
    WHERE ar__budget_limit(b, n) IS NOT NULL AND (p_turns OR n <> 'turns')
      AND ar__budget_used(b, n, p_now) >= ar__budget_limit(b, n)
    ORDER BY k LIMIT 1);
END $$;

-- Once per team (until its limits change): the budget past the warning threshold, warned of
-- in a `budget_warning` event (the row's `warned` set by the caller).
CREATE OR REPLACE FUNCTION ar__budget_warn(
    INOUT o jsonb, b ar_budgets, p_ratio float8, p_agent bigint, p_turn bigint, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    v_name ar_budget_name;
BEGIN
    IF b.warned THEN
        RETURN;
    END IF;
    SELECT n INTO v_name FROM unnest(ar__stopping_budgets()) WITH ORDINALITY AS s(n, k)
    WHERE ar__budget_limit(b, n) IS NOT NULL
      AND ar__budget_used(b, n, p_now) >= p_ratio * ar__budget_limit(b, n)
    ORDER BY k LIMIT 1;
    IF v_name IS NULL THEN
        RETURN;
    END IF;
    UPDATE ar_budgets SET warned = true WHERE team_id = b.team_id;
    o := ar__event(o, 'budget_warning', b.team_id, p_agent, p_now, jsonb_build_object(
        'budget', v_name, 'used', ar__budget_used(b, v_name, p_now),
        'limit', ar__budget_limit(b, v_name)), p_turn => p_turn);
    o := jsonb_set(o, '{budget,warn}', to_jsonb(v_name));
END $$;

-- A check that found `p_spent` spent: the first such check marks the team exhausted, in a
-- `budget_exhausted` event.
CREATE OR REPLACE FUNCTION ar__budget_refused(
    INOUT o jsonb, b ar_budgets, p_spent ar_budget_name, p_agent bigint, p_turn bigint,
    p_now timestamp)
LANGUAGE plpgsql AS $$
BEGIN
    IF b.exhausted IS NULL THEN
        UPDATE ar_budgets SET exhausted = p_spent WHERE team_id = b.team_id;
        o := ar__event(o, 'budget_exhausted', b.team_id, p_agent, p_now, jsonb_build_object(
            'budget', p_spent, 'used', ar__budget_used(b, p_spent, p_now),
            'limit', ar__budget_limit(b, p_spent)), p_turn => p_turn);
    END IF;
    o := o || jsonb_build_object('budget', jsonb_build_object(
        'ok', false, 'exhausted', coalesce(b.exhausted, p_spent),
        'newly_exhausted', b.exhausted IS NULL));
END $$;

-- A turn starts (`p_turns`) or a model call is about to be made: refused when a budget is
-- spent, else counted; the check in the result's "budget".
CREATE OR REPLACE FUNCTION ar__charge(
    INOUT o jsonb, p_team bigint, p_agent bigint, p_turn bigint, p_turns boolean,
    p_ratio float8, p_defaults jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    b ar_budgets := ar__budget_row(p_team, p_defaults);
    v_spent ar_budget_name;
BEGIN
    IF b.team_id IS NULL THEN
        o := ar__refused(o, 'no_team', jsonb_build_object('team_id', p_team));
        RETURN;
    END IF;
    v_spent := coalesce(b.exhausted, ar__budget_spent(b, p_now, p_turns));
    IF v_spent IS NOT NULL THEN
        o := ar__budget_refused(o, b, v_spent, p_agent, p_turn, p_now);
        RETURN;
    END IF;
    IF p_turns THEN
        UPDATE ar_budgets SET turns = turns + 1 WHERE team_id = p_team RETURNING * INTO b;
    ELSE
        UPDATE ar_budgets SET model_calls = model_calls + 1 WHERE team_id = p_team
        RETURNING * INTO b;
    END IF;
    o := o || jsonb_build_object('budget', jsonb_build_object('ok', true));
    o := ar__budget_warn(o, b, p_ratio, p_agent, p_turn, p_now);
END $$;

-- A model call is about to be made: refused (nothing counted) when a budget is spent.
CREATE OR REPLACE FUNCTION ar_charge_model_call(
    p_team bigint, p_agent bigint, p_turn bigint, p_ratio float8, p_defaults jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    RETURN ar__charge(ar__result(), p_team, p_agent, p_turn, false, p_ratio, p_defaults,
                      ar__now());
END $$;

-- One model call's usage: a row per call, the team's totals, one `model_call` event (its
-- `context`: what the request left out, on the call where that changed); `p_window`, where the
-- agent's request window then stood, is kept on the agent; `p_ms`, how long the call took, is
-- the event's `ms` (the call ended at the event's time).
CREATE OR REPLACE FUNCTION ar_record_usage(
    p_team bigint, p_agent bigint, p_turn bigint, p_model text, p_prompt bigint,
    p_completion bigint, p_cached bigint, p_cost_nano bigint, p_estimated boolean,
    p_priced boolean, p_ratio float8, p_defaults jsonb, p_context jsonb, p_window jsonb,
    p_ms bigint, p_agent_name text DEFAULT NULL)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    v_now timestamp := ar__now();
    b ar_budgets := ar__budget_row(p_team, p_defaults);
    v_max constant numeric := 9223372036854775807;
    v_saturated jsonb;
BEGIN
    IF b.team_id IS NULL THEN
        RETURN ar__refused(o, 'no_team', jsonb_build_object('team_id', p_team));
    END IF;
    -- A call's cost at the column's range saturated there (the caller caps it); a team's
    -- total stops at it rather than overflow.
    SELECT coalesce(jsonb_agg(name ORDER BY k), '[]'::jsonb) INTO v_saturated
    FROM (VALUES (0, 'cost_usd', p_cost_nano >= v_max),
                 (1, 'team_prompt_tokens', b.prompt_tokens::numeric + p_prompt > v_max),
                 (2, 'team_completion_tokens',
                  b.completion_tokens::numeric + p_completion > v_max),
                 (3, 'team_cached_tokens', b.cached_tokens::numeric + p_cached > v_max),
                 (4, 'team_cost_nano', b.cost_nano::numeric + p_cost_nano > v_max))
         AS s(k, name, hit)
    WHERE hit;
    UPDATE ar_budgets SET
        prompt_tokens = least(prompt_tokens::numeric + p_prompt, v_max)::bigint,
        completion_tokens = least(completion_tokens::numeric + p_completion, v_max)::bigint,
        cached_tokens = least(cached_tokens::numeric + p_cached, v_max)::bigint,
        cost_nano = least(cost_nano::numeric + p_cost_nano, v_max)::bigint
    WHERE team_id = p_team RETURNING * INTO b;
    IF p_window IS NOT NULL THEN
        UPDATE ar_agents SET context_window = p_window WHERE id = p_agent;
    END IF;
    INSERT INTO ar_model_calls (team_id, agent_id, turn_id, model, prompt_tokens,
                                completion_tokens, cached_tokens, cost_nano, estimated, created_at)
    VALUES (p_team, p_agent, p_turn, p_model, p_prompt, p_completion, p_cached, p_cost_nano,
            p_estimated, v_now);
    o := ar__event(o, 'model_call', p_team, p_agent, v_now, jsonb_build_object(
        'model', p_model, 'prompt_tokens', p_prompt, 'completion_tokens', p_completion,
        'cached_tokens', p_cached, 'cost_usd', p_cost_nano::float8 / 1000000000,
        'estimated', p_estimated)
        || CASE WHEN p_priced THEN '{}'::jsonb ELSE '{"unpriced": true}'::jsonb END
        || CASE WHEN p_context IS NULL THEN '{}'::jsonb
                ELSE jsonb_build_object('context', p_context) END
        || CASE WHEN v_saturated = '[]'::jsonb THEN '{}'::jsonb
                ELSE jsonb_build_object('saturated', v_saturated) END
        || CASE WHEN p_ms IS NULL THEN '{}'::jsonb ELSE jsonb_build_object('ms', p_ms) END,
        p_turn => p_turn, p_agent_name => p_agent_name);
    o := o || jsonb_build_object('budget', jsonb_build_object('ok', true));
    RETURN ar__budget_warn(o, b, p_ratio, p_agent, p_turn, v_now);
END $$;

-- Before a sub-agent is created: refused (a `budget_refused` event) when the team has created,
-- or has active, as many as its limits allow.
CREATE OR REPLACE FUNCTION ar__charge_sub_agent(
    INOUT o jsonb, p_team bigint, p_role text, p_defaults jsonb, p_now timestamp)
LANGUAGE plpgsql AS $$
DECLARE
    b ar_budgets := ar__budget_row(p_team, p_defaults);
    v_created bigint;
    v_active bigint;
    v_name ar_budget_name;
    v_limit float8;
    v_used float8;
BEGIN
    IF b.team_id IS NULL THEN
        o := ar__refused(o, 'no_team', jsonb_build_object('team_id', p_team));
        RETURN;
    END IF;
    v_created := (ar__sub_agents(p_team) ->> 0)::bigint;
    v_active := (ar__sub_agents(p_team) ->> 1)::bigint;
    FOREACH v_name IN ARRAY ARRAY['sub_agents_created', 'sub_agents_active']::ar_budget_name[]
    LOOP
        v_limit := ar__budget_limit(b, v_name);
        v_used := CASE v_name WHEN 'sub_agents_created' THEN v_created ELSE v_active END;
        CONTINUE WHEN v_limit IS NULL OR v_used < v_limit;
        o := ar__refused(o, 'sub_agents_spent', jsonb_build_object(
            'budget', v_name, 'limit', v_limit::bigint, 'used', v_used::bigint));
        o := jsonb_set(o, '{refused,event}', jsonb_build_object(
            'action', 'budget_refused', 'team_id', p_team,
            'detail', jsonb_build_object('budget', v_name, 'limit', v_limit, 'used', v_used,
                                         'role', p_role)));
        RETURN;
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION ar_charge_sub_agent(p_team bigint, p_role text, p_defaults jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__charge_sub_agent(ar__result(), p_team, p_role, p_defaults, ar__now());
BEGIN
    IF o ? 'refused' THEN
        o := ar__refusal_event(o, ar__now());
    END IF;
    RETURN o;
END $$;

-- An operator's new limits (`p_limits`: the limits named, as stored; NULL values: unlimited).
-- The warning may be given again; a team stopped by a budget that is no longer spent may go on.
-- `p_given`: the limits as the operator gave them, for the `budget_changed` event.
CREATE OR REPLACE FUNCTION ar_set_limits(
    p_team bigint, p_limits jsonb, p_given jsonb, p_by text, p_defaults jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb := ar__result();
    v_now timestamp := ar__now();
    b ar_budgets := ar__budget_row(p_team, p_defaults);
    v_before ar_budget_name;
BEGIN
    IF b.team_id IS NULL THEN
        RETURN ar__refused(o, 'no_team', jsonb_build_object('team_id', p_team));
    END IF;
    v_before := b.exhausted;
    UPDATE ar_budgets SET
        max_model_calls = CASE WHEN p_limits ? 'max_model_calls'
            THEN (p_limits ->> 'max_model_calls')::bigint ELSE max_model_calls END,
        max_turns = CASE WHEN p_limits ? 'max_turns'
            THEN (p_limits ->> 'max_turns')::bigint ELSE max_turns END,
        max_tokens = CASE WHEN p_limits ? 'max_tokens'
            THEN (p_limits ->> 'max_tokens')::bigint ELSE max_tokens END,
        max_cost_nano = CASE WHEN p_limits ? 'max_cost_nano'
            THEN (p_limits ->> 'max_cost_nano')::bigint ELSE max_cost_nano END,
        max_wall_seconds = CASE WHEN p_limits ? 'max_wall_seconds'
            THEN (p_limits ->> 'max_wall_seconds')::float8 ELSE max_wall_seconds END,
        max_sub_agents_created = CASE WHEN p_limits ? 'max_sub_agents_created'
            THEN (p_limits ->> 'max_sub_agents_created')::integer
            ELSE max_sub_agents_created END,
        max_sub_agents_active = CASE WHEN p_limits ? 'max_sub_agents_active'
            THEN (p_limits ->> 'max_sub_agents_active')::integer
            ELSE max_sub_agents_active END,
        warned = false
    WHERE team_id = p_team RETURNING * INTO b;
    UPDATE ar_budgets SET
        deadline_at = started_at + make_interval(secs => max_wall_seconds),
        exhausted = CASE WHEN exhausted IS NOT NULL AND ar__budget_spent(b, v_now, true) IS NULL
                         THEN NULL ELSE exhausted END
    WHERE team_id = p_team RETURNING * INTO b;
    o := ar__event(o, 'budget_changed', p_team, NULL, v_now, jsonb_build_object(
        'by', p_by, 'limits', p_given, 'was_exhausted', v_before, 'exhausted', b.exhausted));
    RETURN o || jsonb_build_object('row', to_jsonb(b), 'sub_agents', ar__sub_agents(p_team));
END $$;

-- The team's limits and what it used (a locked read: the row is made if the team has none).
CREATE OR REPLACE FUNCTION ar_budget(p_team bigint, p_defaults jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    b ar_budgets := ar__budget_row(p_team, p_defaults);
BEGIN
    IF b.team_id IS NULL THEN
        RETURN ar__refused(ar__result(), 'no_team', jsonb_build_object('team_id', p_team));
    END IF;
    RETURN ar__result() || jsonb_build_object('row', to_jsonb(b),
                                              'sub_agents', ar__sub_agents(p_team));
END $$;
