"""The read-only web UI of ``agent-router web`` and the assets the swimlane page inlines."""
