"""The router's Alembic history (``versions/``), run by :mod:`agent_router.store.migrate`.

**Every migration is backward compatible with the previous release.** An upgrade runs while
that release's workers and senders still run (a rolling deploy), on the schema the migration
leaves, with their own store functions (:mod:`agent_router.store.functions`). So a migration
may add: a table, a nullable column or one with a server default, an index, an enum value the
previous release never reads or writes, a constraint every write of the previous release
keeps. It may not drop, rename or narrow a table, a column or an enum value the previous
release uses, add a ``NOT NULL`` column without a default to a table it inserts into, change
what a column means, or rewrite a table under a long lock. What only the previous release
needed goes in a later release's migration, once no worker of that release can run (after
``agent-router db upgrade --finish``). A change that cannot be additive is split over two
releases: the first adds the new shape and writes both, the second stops using the old.
On SQLite, which alters little in place, a change to a table copies it (Alembic's batch mode)
under the database's write lock, in time proportional to its rows: writers of every release
wait for it, up to ``sqlite_busy_timeout_seconds``.
"""
