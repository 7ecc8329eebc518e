"""The enum types (CHECK constraints on SQLite) revision 0001 created and their labels, in the
order PostgreSQL's types are dropped. Frozen: a database at 0001 holds exactly these, so a label
today's code adds takes a new revision, never an edit here. Revision 0001 creates its types from
them; a later revision that changes a type starts from them."""

from __future__ import annotations

ENUMS: dict[str, tuple[str, ...]] = {
    "ar_agent_state": ("idle", "scheduled", "running", "waiting", "completed", "terminated"),
    "ar_turn_trigger": ("new", "follow_up", "continuation", "recovery"),
    "ar_message_type": ("task", "output", "ask", "answer", "message", "notice"),
    "ar_message_subtype": ("progress_output", "completion_report", "ask_master", "ask_other"),
    "ar_route_outcome": (
        "resolved",
        "injected_inline",
        "coalesced",
        "triggered_new_turn",
        "queued",
        "rejected",
    ),
    "ar_message_status": ("pending", "delivered", "dropped"),
    "ar_question_status": ("open", "answered", "expired", "cancelled"),
    "ar_question_kind": ("ask", "output"),
    "ar_turn_status": ("running", "ended", "failed", "suspended", "fenced", "stopped"),
    "ar_outbox_kind": ("enqueue_turn", "wake_waiter"),
    "ar_job_status": ("running", "succeeded", "failed"),
    "ar_ledger_action": (
        "team_created",
        "agent_created",
        "route",
        "send_rejected",
        "duplicate_send",
        "turn_claimed",
        "claim_refused",
        "drain",
        "turn_ended",
        "follow_up",
        "ask",
        "ask_refused",
        "question_resolved",
        "take_over",
        "stale_write_refused",
        "synthetic_tool_result",
        "outbox_published",
        "terminated",
        "message_dropped",
        "question_cancelled",
        "question_expired",
        "reenqueued",
        "job_started",
        "job_finished",
        "wait_output",
        "stop_requested",
        "stopped",
    ),
}
