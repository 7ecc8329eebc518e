-- The statements the store sends to PostgreSQL, each by its name (store/functions.py reads
-- them). A transition is one call of its function; the function decides every branch.

-- name: send
-- Route one message by its receiver's state; a refusal is recorded and returned.
SELECT ar_send(:team, :to, :sender, :external, CAST(:type AS ar_message_type),
               CAST(:subtype AS ar_message_subtype), :content, :body, :question_id, :wake,
               :dedup_key)

-- name: interrupt
-- The user's message to the lead; a running turn of the lead stops and one new turn starts.
SELECT ar_interrupt(:team, :to, :sender, :external, CAST(:type AS ar_message_type),
                    CAST(:subtype AS ar_message_subtype), :content, :body, :question_id, :wake,
                    :dedup_key, :reason)

-- name: send_many
-- Route several messages of one team from one sender: all of them, or none and one refusal.
SELECT ar_send_many(:team, :sender, :external, CAST(:messages AS jsonb))

-- name: record_refusal
-- Record a send refused before it reached the store (malformed input).
SELECT ar_record_refusal(CAST(:event AS jsonb))

-- name: claim
-- Claim an agent's scheduled turn and count it against the team's budgets; with `first`, make
-- the transition before its first model call too.
SELECT ar_claim(:agent, :epoch, :builtin, :lease_seconds, :ratio, CAST(:defaults AS jsonb),
                :first, :kept, :after, :limit, :stopped)

-- name: drain
-- Move a running turn's pending messages into its transcript.
SELECT ar_drain(:turn, :agent, :epoch, :limit)

-- name: append
-- Append an assistant message, or an open tool call's result (with how the call ran, in the
-- entry's meta), to a current turn's transcript.
SELECT ar_append(:turn, :agent, :epoch, CAST(:payload AS jsonb), :call, CAST(:meta AS jsonb))

-- name: before_call
-- Before a model call: carried results appended, lease renewed, a stop honoured, else the call
-- charged and pending messages drained; the roster and the new transcript entries read.
SELECT ar_before_call(:turn, :agent, :epoch, CAST(:results AS jsonb), :read, :after, :limit,
                      :lease_seconds, :ratio, CAST(:defaults AS jsonb), :stopped)

-- name: after_call
-- After a model call: its usage recorded, then the reply appended and the lease renewed (or a
-- stop honoured).
SELECT ar_after_call(:turn, :agent, :epoch, CAST(:payload AS jsonb), :model, :prompt_tokens,
                     :completion_tokens, :cached_tokens, :cost_nano, :estimated, :priced,
                     :ratio, CAST(:defaults AS jsonb), CAST(:context AS jsonb),
                     CAST(:window AS jsonb), :ms, :lease_seconds, :stopped)

-- name: end
-- End a turn (its final output written first, then the results it carried): completed,
-- suspended on its question, stopped, or one follow-up turn scheduled.
SELECT ar_end(:turn, :agent, :epoch, :failed, :error, :interrupted, :stopped,
              CAST(:results AS jsonb), CAST(:answers AS jsonb), CAST(:reports AS jsonb))

-- name: suspend
-- A blocked asker gives up its worker, unless its answer already came.
SELECT ar_suspend(:turn, :agent, :epoch)

-- name: finish_stop
-- A turn honours a stop at a boundary.
SELECT ar_finish_stop(:turn, :agent, :epoch, :reason, :stopped)

-- name: renew_lease
-- Extend a running turn's lease, if the turn is still its agent's current one; the turn's id,
-- or no row when it was fenced.
UPDATE ar_turns SET lease_expires_at = (clock_timestamp() AT TIME ZONE 'UTC')
                                       + make_interval(secs => :lease_seconds)
WHERE id = :turn AND status = 'running'
  AND epoch = (SELECT epoch FROM ar_agents WHERE id = :agent)
RETURNING id

-- name: charge_model_call
-- Count a model call against the team's budgets; refused (nothing counted) when one is spent.
SELECT ar_charge_model_call(:team, :agent, :turn, :ratio, CAST(:defaults AS jsonb))

-- name: record_usage
-- One model call's tokens and cost: its row, the team's sums, its event (with what the request
-- left out, on the call where that changed), and where the agent's request window then stood.
SELECT ar_record_usage(:team, :agent, :turn, :model, :prompt_tokens, :completion_tokens,
                       :cached_tokens, :cost_nano, :estimated, :priced, :ratio,
                       CAST(:defaults AS jsonb),
                       CAST(:context AS jsonb), CAST(:window AS jsonb), :ms)

-- name: charge_sub_agent
-- Refuse a new sub-agent when the team has created, or has active, as many as it may.
SELECT ar_charge_sub_agent(:team, :role, CAST(:defaults AS jsonb))

-- name: set_limits
-- An operator's new limits for a team.
SELECT ar_set_limits(:team, CAST(:limits AS jsonb), CAST(:given AS jsonb), :by,
                     CAST(:defaults AS jsonb))

-- name: budget
-- A team's budget row (made from the defaults if the team has none).
SELECT ar_budget(:team, CAST(:defaults AS jsonb))

-- name: create_team
-- A team, its lead and its budget row.
SELECT ar_create_team(:name, :role, :system_prompt, :runner, CAST(:limits AS jsonb), :model,
                      :user_task)

-- name: tell_user
-- A message to the user from a turn's agent (an answer or progress), delivered after commit.
SELECT ar_tell_user(:turn, :agent, :epoch, :kind, :content, :dedup_key)

-- name: ask_user
-- A turn's agent asks the user and suspends; the question reaches the user as a message.
SELECT ar_ask_user(:turn, :agent, :epoch, :content, :call, :timeout)

-- name: create_agent
-- A sub-agent, and its task routed to it: both, or neither.
SELECT ar_create_agent(:team, :role, :name, :system_prompt, :runner, CAST(:task AS jsonb))

-- name: terminate
-- End a sub-agent for good: its turn fenced, its mail dropped, its questions cancelled.
SELECT ar_terminate(:agent, :reason)

-- name: request_stop
-- Stop a sub-agent: at once if no worker holds it, else at its turn's next boundary.
SELECT ar_request_stop(:agent, :reason)

-- name: ask
-- Open a question from a turn's agent to another agent, and route it there.
SELECT ar_ask(:turn, :agent, :epoch, :target, :content, :body, :call,
              CAST(:subtype AS ar_message_subtype), :timeout)

-- name: wait_output
-- The lead waits for a sub-agent's next output (or takes one already in its mailbox).
SELECT ar_wait_output(:turn, :agent, :epoch, :target, :call, :timeout)

-- name: overdue_questions
-- Open questions past their deadline, oldest team first; `question` NULL: all of them.
SELECT id FROM ar_questions
WHERE status = 'open' AND deadline <= (clock_timestamp() AT TIME ZONE 'UTC')
  AND (CAST(:question AS bigint) IS NULL OR id = :question)
ORDER BY team_id, id

-- name: expire_question
-- Expire one open question past its deadline; its blocked asker gets the expired result.
SELECT ar_expire_question(:question, :result)

-- name: start_job
-- Record a background job of an agent before its task is sent.
SELECT ar_start_job(:team, :agent, :name, :task)

-- name: finish_job
-- Route a background job's completion to its agent as a notice, once.
SELECT ar_finish_job(:job, :ok, :result, :result_body, :batch_seconds, :max_windows)

-- name: take_over
-- Fence a running agent whose turn is presumed dead, and recover it.
SELECT ar_take_over(:agent, :reason, :expected_turn, :lease_check, :interrupted)

-- name: mark_published
-- Mark outbox rows published, after their publish. Its commit does not wait for the disk
-- (synchronous_commit off, for this transaction only): a mark lost in a server crash only makes
-- the sweeper publish the row again, and every published signal is fenced or re-checked.
UPDATE ar_outbox
SET published_at = (clock_timestamp() AT TIME ZONE 'UTC'), attempts = attempts + 1
WHERE id = ANY (CAST(:ids AS bigint[])) AND published_at IS NULL
  AND set_config('synchronous_commit', 'off', true) = 'off'

-- name: remind_user
-- Send the user once more each question to the user open at half its time.
SELECT ar_remind_user(:prefix)

-- name: seed_mailbox
-- Queue many context-only notices for an agent in bulk (benchmarks and load tests).
SELECT ar_seed_mailbox(:agent, :count, :content, :sender)

-- name: take_over_expired
-- Take over an agent whose running turn's lease is still expired under the lock.
SELECT ar_take_over_expired(:agent, :interrupted)

-- name: reenqueue
-- Enqueue again the turn task of an agent found lost, unless its task moved since it was read.
SELECT ar_reenqueue(:agent, :epoch, CAST(:last_published AS timestamp), :windows)

-- name: record_sweep_failure
-- One more failure of a sweeper repair for an agent: ledgered, and the agent left alone a while.
SELECT ar_record_sweep_failure(:agent, CAST(:step AS ar_sweep_step), :error, :period_seconds,
                               :quarantine_after, :max_periods)

-- name: lift_quarantine
-- A repair succeeded for the agent: its failures are behind it.
SELECT ar_lift_quarantine(:agent, :reason, :quarantine_after)

-- name: lift_settled_quarantines
-- Lift the agents no repair needs any more, but those a pass tried.
SELECT ar_lift_settled_quarantines(CAST(:keep AS bigint[]), :reason, :quarantine_after)

-- name: claim_unpublished
-- Take outbox rows to publish again: unpublished, older than the cutoff, not taken since.
SELECT ar_claim_unpublished(CAST(:cutoff AS timestamp), :limit)

-- name: delete_team
-- Delete a team and every row it owns (or count them); one that still owes rows is refused
-- unless what it owes is to be dropped.
SELECT ar_delete_team(:team, :dry_run, :include_undelivered, :listed)

-- name: prune_teams
-- One batch of a prune: finished teams after the given id, deleted (or counted).
SELECT ar_prune_teams(CAST(:before AS timestamp), :after, :limit, :dry_run,
                      :include_undelivered, :listed)

-- name: prune_outbox
-- Delete (or count) published outbox rows older than the cutoff.
SELECT ar_prune_outbox(CAST(:before AS timestamp), :dry_run)

-- name: prune_ledger
-- One batch of ledger retention: routine events older than the cutoff, deleted (or counted).
SELECT ar_prune_ledger(CAST(:before AS timestamp), CAST(:routine AS ar_ledger_action[]), :limit,
                       :dry_run)
