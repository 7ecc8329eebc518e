-- The statements the store sends to PostgreSQL, each by its name (store/functions.py reads
-- them). A transition is one call of its function; the function decides every branch.

-- name: send
-- Route one message by its receiver's state; a refusal is recorded and returned.
SELECT ar_send(:team, :to, :sender, :external, CAST(:type AS ar_message_type),
               CAST(:subtype AS ar_message_subtype), :content, :body, :question_id, :wake,
               :dedup_key)

-- name: send_many
-- Route several messages of one team from one sender: all of them, or none and one refusal.
SELECT ar_send_many(:team, :sender, :external, CAST(:messages AS jsonb))

-- name: record_refusal
-- Record a send refused before it reached the store (malformed input).
SELECT ar_record_refusal(CAST(:event AS jsonb))
