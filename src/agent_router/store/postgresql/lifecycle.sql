-- Storage lifecycle on PostgreSQL: deleting a team with every row it owns, and retention
-- (finished teams, published outbox rows, routine ledger events older than a cutoff). The
-- SQLite implementation of the same transitions is store/lifecycle.py, which says what a team
-- owes and why a prune keeps it.

-- What the teams `p_teams` still owe someone, by kind (kinds they owe nothing of left out), as
-- [[kind, rows], ...] in the order of store/lifecycle.py's OWED.
CREATE OR REPLACE FUNCTION ar__owed(p_teams bigint[]) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_agg(jsonb_build_array(kind, n) ORDER BY k), '[]')
    FROM (VALUES
        (1, 'undelivered_messages', (SELECT count(*) FROM ar_messages
            WHERE team_id = ANY (p_teams) AND status = 'pending')),
        (2, 'open_questions', (SELECT count(*) FROM ar_questions
            WHERE team_id = ANY (p_teams) AND status = 'open')),
        (3, 'spent_budget', (SELECT count(*) FROM ar_budgets
            WHERE team_id = ANY (p_teams) AND exhausted IS NOT NULL)),
        (4, 'unpublished_outbox', (SELECT count(*) FROM ar_outbox
            WHERE team_id = ANY (p_teams) AND published_at IS NULL)),
        (5, 'current_transcripts', (SELECT count(*) FROM ar_agents
            WHERE team_id = ANY (p_teams) AND state IN ('scheduled', 'running', 'waiting')))
    ) AS owed(k, kind, n)
    WHERE n > 0);
END $$;

-- [[key, value], ...] as one object.
CREATE OR REPLACE FUNCTION ar__object(p_pairs jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RETURN (SELECT coalesce(jsonb_object_agg(p ->> 0, p -> 1), '{}')
            FROM jsonb_array_elements(p_pairs) p);
END $$;

-- Is the team at work (an agent scheduled, running or waiting), or was it active since
-- `p_since`? Read from rows that ledger retention never deletes (its agents, messages, turns
-- and model calls) as well as from the ledger: a team whose routine events were deleted is
-- still seen as active by its last message or turn.
CREATE OR REPLACE FUNCTION ar__active_since(p_team bigint, p_since timestamp) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM ar_agents WHERE team_id = p_team
                   AND (state IN ('scheduled', 'running', 'waiting') OR created_at >= p_since))
        OR EXISTS (SELECT 1 FROM ar_messages WHERE team_id = p_team AND created_at >= p_since)
        OR EXISTS (SELECT 1 FROM ar_turns WHERE team_id = p_team
                   AND (started_at >= p_since OR ended_at >= p_since))
        OR EXISTS (SELECT 1 FROM ar_model_calls
                   WHERE team_id = p_team AND created_at >= p_since)
        OR EXISTS (SELECT 1 FROM ar_ledger WHERE team_id = p_team AND created_at >= p_since);
END $$;

-- The `owed_dropped` event's detail for a team whose deletion drops `p_owed` (pairs): the
-- kinds, the first rows of each listed (each message's sender, receiver and opening).
CREATE OR REPLACE FUNCTION ar__owed_dropped(p_team bigint, p_owed jsonb, p_by text,
                                            p_listed integer) RETURNS jsonb
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN jsonb_build_object(
        'by', p_by, 'owed', ar__object(p_owed),
        'messages', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                'id', m.id, 'from', m.source_name, 'to', m.target, 'content', m.opening)
                ORDER BY m.id), '[]')
            FROM (SELECT m.id, m.source_name, a.display_name AS target,
                         left(m.content, 200) AS opening
                  FROM ar_messages m JOIN ar_agents a ON a.id = m.target_agent_id
                  WHERE m.team_id = p_team AND m.status = 'pending'
                  ORDER BY m.id LIMIT p_listed) m),
        'questions', (SELECT coalesce(jsonb_agg(q.id ORDER BY q.id), '[]')
            FROM (SELECT id FROM ar_questions WHERE team_id = p_team AND status = 'open'
                  ORDER BY id LIMIT p_listed) q));
END $$;

-- Delete the teams `p_teams` (locked first, then their agents by id: the canonical order) and
-- every row they own, children before the rows they reference (store/lifecycle.py,
-- delete_teams); `p_dry_run`: count them, delete nothing. A team that still owes rows is
-- refused (`owed_rows`), or with `p_include` deleted and what it owed ledgered
-- (`owed_dropped`, written after its rows are gone: the event outlives the team). With
-- `p_idle_since` (a prune, which chose the teams before locking them), a team active since
-- then or owing rows now is kept, not deleted nor refused, and outbox rows published before
-- then are left out (the prune counts them on its own). The result's "deletion": "teams",
-- "rows" ([[table, rows], ...]), "questions" (the open ones, whose wake keys go too), "owed"
-- ([[kind, rows], ...]) and "kept".
CREATE OR REPLACE FUNCTION ar__delete_teams(
    INOUT o jsonb, p_teams bigint[], p_dry_run boolean, p_include boolean, p_by text,
    p_idle_since timestamp, p_listed integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamp := ar__now();
    v_locked bigint[];
    v_kept bigint[] := '{}';
    v_agents bigint[];
    v_team bigint;
    v_owed jsonb;
    v_drops jsonb := '[]';
    v_rows jsonb := '[]';
    v_table text;
    v_where text;
    v_count bigint;
    v_drop jsonb;
BEGIN
    v_locked := ARRAY(SELECT id FROM ar_teams WHERE id = ANY (p_teams) ORDER BY id FOR UPDATE);
    PERFORM 1 FROM ar_agents WHERE team_id = ANY (v_locked) ORDER BY id FOR UPDATE;
    IF p_idle_since IS NOT NULL THEN
        -- Read again under the locks: what committed since the teams were chosen is seen now.
        v_kept := ARRAY(SELECT t FROM unnest(v_locked) t
                        WHERE ar__active_since(t, p_idle_since)
                           OR (NOT p_include AND ar__owed(ARRAY[t]) <> '[]')
                        ORDER BY t);
        v_locked := ARRAY(SELECT t FROM unnest(v_locked) t WHERE t <> ALL (v_kept) ORDER BY t);
    END IF;
    IF cardinality(v_locked) = 0 THEN
        o := o || jsonb_build_object('deletion', jsonb_build_object(
            'teams', '[]'::jsonb, 'rows', '[]'::jsonb, 'questions', '[]'::jsonb,
            'owed', '[]'::jsonb, 'kept', to_jsonb(v_kept)));
        RETURN;
    END IF;
    FOREACH v_team IN ARRAY v_locked LOOP
        v_owed := ar__owed(ARRAY[v_team]);
        CONTINUE WHEN v_owed = '[]';
        IF NOT p_include THEN
            o := ar__refused(o, 'owed_rows',
                             jsonb_build_object('team_id', v_team, 'owed', ar__object(v_owed)));
            RETURN;
        END IF;
        IF NOT p_dry_run THEN
            v_drops := v_drops || jsonb_build_array(jsonb_build_array(
                v_team, ar__owed_dropped(v_team, v_owed, p_by, p_listed)));
        END IF;
    END LOOP;
    v_owed := ar__owed(v_locked);
    v_agents := ARRAY(SELECT id FROM ar_agents WHERE team_id = ANY (v_locked));
    o := o || jsonb_build_object('deletion', jsonb_build_object(
        'teams', to_jsonb(v_locked), 'owed', v_owed, 'kept', to_jsonb(v_kept),
        'questions', to_jsonb(ARRAY(SELECT id FROM ar_questions
                                    WHERE team_id = ANY (v_locked) AND status = 'open'
                                    ORDER BY id))));
    -- $1: the teams, $2: their agents, $3: the prune's cutoff.
    FOR v_table, v_where IN VALUES
        ('ar_transcript_entries', 'agent_id = ANY ($2)'),
        ('ar_ledger', 'team_id = ANY ($1) OR agent_id = ANY ($2)'),
        ('ar_outbox', 'team_id = ANY ($1) AND ($3 IS NULL OR published_at IS NULL '
                      'OR published_at >= $3)'),
        ('ar_background_jobs', 'team_id = ANY ($1)'),
        ('ar_model_calls', 'team_id = ANY ($1)'),
        ('ar_user_messages', 'team_id = ANY ($1)'),
        ('ar_quarantine', 'team_id = ANY ($1)'),
        ('ar_budgets', 'team_id = ANY ($1)'),
        ('ar_messages', 'team_id = ANY ($1)'),
        ('ar_questions', 'team_id = ANY ($1)'),
        ('ar_turns', 'team_id = ANY ($1)'),
        ('ar_agents', 'team_id = ANY ($1)'),
        ('ar_teams', 'id = ANY ($1)')
    LOOP
        IF p_dry_run THEN
            EXECUTE format('SELECT count(*) FROM %I WHERE %s', v_table, v_where)
                INTO v_count USING v_locked, v_agents, p_idle_since;
        ELSE
            EXECUTE format('DELETE FROM %I WHERE %s', v_table, v_where)
                USING v_locked, v_agents, p_idle_since;
            GET DIAGNOSTICS v_count = ROW_COUNT;
        END IF;
        v_rows := v_rows || jsonb_build_array(jsonb_build_array(v_table, v_count));
    END LOOP;
    o := jsonb_set(o, '{deletion,rows}', v_rows);
    FOR v_drop IN SELECT value FROM jsonb_array_elements(v_drops) LOOP
        o := ar__event(o, 'owed_dropped', (v_drop ->> 0)::bigint, NULL, v_now, v_drop -> 1);
    END LOOP;
END $$;

-- Delete a team and every row it owns (ar__delete_teams); an unknown team is refused.
CREATE OR REPLACE FUNCTION ar_delete_team(
    p_team bigint, p_dry_run boolean, p_include boolean, p_listed integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb;
BEGIN
    o := ar__delete_teams(ar__result(), ARRAY[p_team], p_dry_run, p_include, 'delete', NULL,
                          p_listed);
    IF NOT o ? 'refused' AND o -> 'deletion' -> 'teams' = '[]' THEN
        RETURN ar__refused(ar__result(), 'unknown_team', jsonb_build_object('team_id', p_team));
    END IF;
    RETURN o;
END $$;

-- One batch of a prune (store/lifecycle.py, finished_teams and delete_teams): the first
-- `p_limit` teams with ids above `p_after`, created before `p_before`, with nothing in flight
-- and no activity since then, are deleted (ar__delete_teams, `p_before` its cutoff) but those
-- that owe rows (with `p_include`: none), which are kept. The result's "deletion", its "kept"
-- led by the teams kept for what they owe, and "chosen": how many teams the batch looked at
-- (fewer than `p_limit`: the last batch).
CREATE OR REPLACE FUNCTION ar_prune_teams(
    p_before timestamp, p_after bigint, p_limit integer, p_dry_run boolean, p_include boolean,
    p_listed integer)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    o jsonb;
    v_finished bigint[];
    v_held bigint[];
    v_chosen integer;
BEGIN
    SELECT count(*),
           coalesce(array_agg(id ORDER BY id) FILTER (WHERE p_include OR NOT owes), '{}'),
           coalesce(array_agg(id ORDER BY id) FILTER (WHERE owes AND NOT p_include), '{}')
    INTO v_chosen, v_finished, v_held
    FROM (SELECT id, ar__owed(ARRAY[id]) <> '[]' AS owes FROM ar_teams
          WHERE id > p_after AND created_at < p_before AND NOT ar__active_since(id, p_before)
          ORDER BY id LIMIT p_limit) chosen;
    o := ar__delete_teams(ar__result(), v_finished, p_dry_run, p_include, 'prune', p_before,
                          p_listed);
    o := jsonb_set(o, '{deletion,kept}', to_jsonb(v_held) || (o -> 'deletion' -> 'kept'));
    RETURN o || jsonb_build_object('chosen', v_chosen);
END $$;

-- Published outbox rows older than `p_before` (their tasks were sent long ago): deleted, or
-- with `p_dry_run` counted. The result's "deleted".
CREATE OR REPLACE FUNCTION ar_prune_outbox(p_before timestamp, p_dry_run boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
BEGIN
    IF p_dry_run THEN
        SELECT count(*) INTO v_count FROM ar_outbox
        WHERE published_at IS NOT NULL AND published_at < p_before;
    ELSE
        DELETE FROM ar_outbox WHERE published_at IS NOT NULL AND published_at < p_before;
        GET DIAGNOSTICS v_count = ROW_COUNT;
    END IF;
    RETURN ar__result() || jsonb_build_object('deleted', v_count);
END $$;

-- One batch of ledger retention: up to `p_limit` routine events (`p_routine`: store/
-- lifecycle.py's ROUTINE_LEDGER; a failed turn's end is not routine) older than `p_before`,
-- oldest first, deleted; with `p_dry_run` every one counted, none deleted. The result's
-- "deleted".
CREATE OR REPLACE FUNCTION ar_prune_ledger(
    p_before timestamp, p_routine ar_ledger_action[], p_limit integer, p_dry_run boolean)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
BEGIN
    WITH routine AS (
        SELECT id FROM ar_ledger
        WHERE created_at < p_before AND action = ANY (p_routine)
          AND (action <> 'turn_ended' OR NOT coalesce(detail -> 'failed' = 'true', false))
        ORDER BY id LIMIT CASE WHEN NOT p_dry_run THEN p_limit END
    ), deleted AS (
        DELETE FROM ar_ledger WHERE NOT p_dry_run AND id IN (SELECT id FROM routine)
        RETURNING 1
    )
    SELECT CASE WHEN p_dry_run THEN (SELECT count(*) FROM routine)
                ELSE (SELECT count(*) FROM deleted) END
    INTO v_count;
    RETURN ar__result() || jsonb_build_object('deleted', v_count);
END $$;
