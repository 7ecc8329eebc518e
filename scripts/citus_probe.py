"""Report, table by table, whether the router's PostgreSQL store can be distributed on Citus,
and what Citus refuses where it cannot.

The plan each table is tried against: ``ar_teams`` distributed by ``id``; every table with a
``team_id`` distributed by it, colocated with ``ar_teams``; a table without one (the version
table, ``ar_transcript_entries``) made a reference table. The schema is the one
``agent-router db upgrade`` creates, in a schema of the probe's own (``citus_probe``, dropped
and created again on each run, dropped at the end), on the coordinator of a Citus cluster
(``scripts/citus.sh start``; its ``url`` is the default here).

First, which of the store's functions Citus created on the workers as ``db upgrade`` installed
them on the coordinator. Then two passes, each on a fresh schema, tables taken parents first
(by their foreign keys):

* **as is**: ``create_distributed_table`` (``create_reference_table``) on the schema as it is;
  a table whose parent was refused is refused for that too.
* **blockers**: where Citus refuses, the probe drops the constraint or unique index it refused
  (a primary key, unique constraint or unique index without the distribution column; a foreign
  key whose columns do not pair the distribution columns), one at a time, and asks again, so each
  blocker is reported with Citus's own message, until the table is distributed or nothing the
  probe knows to drop is left. Parents distributed this way let their children be asked on
  their own account.

Last, the README's walk through the store (a team, an agent, a send, a turn, the transcript,
the ledger) on the schema the second pass left, every table distributed: each step that fails,
with the server's message.

Nothing here changes the router's schema or migrations: the drops happen in the probe's
schema only. Exit status 0 when every table is distributed as it is, 1 otherwise.

    python scripts/citus_probe.py [URL]    # URL: the coordinator's (scripts/citus.sh url)
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from agent_router.store import migrate

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:9700/test"
SCHEMA = "citus_probe"
TEAMS = "ar_teams"
TEAM_COLUMN = "team_id"


@dataclass(frozen=True, kw_only=True)
class Blocker:
    """A constraint or unique index Citus refuses on the table's planned distribution."""

    name: str
    kind: str  # "primary key", "unique", "unique index", "foreign key"
    definition: str
    drop: str  # the statement that removes it (in the probe's schema)


@dataclass(kw_only=True)
class Outcome:
    """What one pass found for one table."""

    table: str
    plan: str
    done: bool = False
    refusals: list[tuple[str, str | None]] = field(default_factory=list)  # (message, dropped)
    left: list[Blocker] = field(default_factory=list)
    cascaded: list[str] = field(default_factory=list)  # its foreign keys a parent's drop took


def plan_of(table: str, columns: set[str]) -> tuple[str, str | None]:
    """The call that distributes ``table``, and its distribution column (None: reference)."""
    if table == TEAMS:
        return f"create_distributed_table('{table}', 'id')", "id"
    if TEAM_COLUMN in columns:
        return (
            f"create_distributed_table('{table}', '{TEAM_COLUMN}', colocate_with => '{TEAMS}')",
            TEAM_COLUMN,
        )
    return f"create_reference_table('{table}')", None


def tables(conn: sa.Connection) -> dict[str, set[str]]:
    rows = conn.execute(
        sa.text(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = :schema"
        ),
        {"schema": SCHEMA},
    )
    found: dict[str, set[str]] = {}
    for table, column in rows:
        found.setdefault(table, set()).add(column)
    return found


def parents_first(conn: sa.Connection, names: list[str]) -> list[str]:
    """``names`` ordered so a table comes after every table its foreign keys reference."""
    edges = conn.execute(
        sa.text(
            "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint"
            " WHERE contype = 'f' AND connamespace = CAST(:schema AS regnamespace)"
        ),
        {"schema": SCHEMA},
    ).all()
    parents: dict[str, set[str]] = {name: set() for name in names}
    for child, parent in edges:
        if child != parent:
            parents[_bare(child)].add(_bare(parent))
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = sorted(n for n in names if n not in ordered and parents[n] <= set(ordered))
        ordered.extend(ready or sorted(n for n in names if n not in ordered))
    return ordered


def _bare(name: str) -> str:
    return name.removeprefix(f"{SCHEMA}.")


def blockers(conn: sa.Connection, table: str, column: str | None) -> list[Blocker]:
    """The table's keys, unique indexes and foreign keys that the planned distribution refuses:
    for a distributed table, a key or unique index without ``column``, a foreign key that does
    not pair ``column`` with its parent's distribution column; for a reference table, a foreign
    key to a table that is not a reference table."""
    qualified = f"{SCHEMA}.{table}"
    found: list[Blocker] = []
    keys = conn.execute(
        sa.text(
            "SELECT c.conname, c.contype, pg_get_constraintdef(c.oid),"
            " ARRAY(SELECT a.attname FROM unnest(c.conkey) k"
            "       JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k) AS cols,"
            " ARRAY(SELECT a.attname FROM unnest(c.confkey) k"
            "       JOIN pg_attribute a ON a.attrelid = c.confrelid AND a.attnum = k) AS fcols,"
            " c.confrelid::regclass::text"
            " FROM pg_constraint c WHERE c.conrelid = CAST(:t AS regclass)"
            " AND c.contype IN ('p', 'u', 'f') ORDER BY c.contype DESC, c.conname"
        ),
        {"t": qualified},
    ).all()
    for name, contype, raw, cols, fcols, parent in keys:
        definition = raw.replace(f"{SCHEMA}.", "")
        drop = f'ALTER TABLE {qualified} DROP CONSTRAINT "{name}" CASCADE'
        if contype in ("p", "u"):
            if column is not None and column not in cols:
                kind = "primary key" if contype == "p" else "unique"
                found.append(Blocker(name=name, kind=kind, definition=definition, drop=drop))
            continue
        parent_column = _distribution_column(conn, parent)
        if column is None:
            ok = parent_column is None and _is_reference(conn, parent)
        else:
            ok = parent_column is None and _is_reference(conn, parent)
            ok = ok or (
                parent_column is not None
                and column in cols
                and parent_column in fcols
                and cols.index(column) == fcols.index(parent_column)
            )
        if not ok:
            kind = "foreign key"
            if parent_column is None and not _is_reference(conn, parent):
                kind += f" (to {_bare(parent)}, not distributed)"
            found.append(Blocker(name=name, kind=kind, definition=definition, drop=drop))
    indexes = conn.execute(
        sa.text(
            "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid),"
            " ARRAY(SELECT a.attname FROM unnest(i.indkey) k"
            "       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k)"
            " FROM pg_index i WHERE i.indrelid = CAST(:t AS regclass) AND i.indisunique"
            " AND NOT EXISTS (SELECT 1 FROM pg_constraint c"
            "   WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid"
            "   AND c.contype IN ('p', 'u'))"
        ),
        {"t": qualified},
    ).all()
    for name, definition, cols in indexes:
        if column is not None and column not in cols:
            found.append(
                Blocker(
                    name=_bare(name),
                    kind="unique index",
                    definition=definition.replace(f"{SCHEMA}.", ""),
                    drop=f"DROP INDEX {name} CASCADE",
                )
            )
    return found


def _distribution_column(conn: sa.Connection, table: str) -> str | None:
    return conn.execute(
        sa.text(
            "SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition"
            " WHERE logicalrelid = CAST(:t AS regclass) AND partmethod = 'h'"
        ),
        {"t": table},
    ).scalar()


def _is_reference(conn: sa.Connection, table: str) -> bool:
    return bool(
        conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_dist_partition"
                " WHERE logicalrelid = CAST(:t AS regclass) AND partmethod = 'n'"
            ),
            {"t": table},
        ).scalar()
    )


def functions_kept_local(conn: sa.Connection) -> tuple[int, list[str]]:
    """How many of the store's functions there are, and those Citus did not create on the
    workers (it propagates a function created on the coordinator unless the function depends
    on a table that is not distributed: a table's row type as an argument or result)."""
    rows = conn.execute(
        sa.text(
            "SELECT p.proname, EXISTS (SELECT 1 FROM pg_dist_object d"
            "   WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid)"
            " FROM pg_proc p WHERE p.pronamespace = CAST(:schema AS regnamespace)"
            " ORDER BY p.proname"
        ),
        {"schema": SCHEMA},
    ).all()
    local = [re.sub(r"_v[0-9a-f]+$", "", name) for name, distributed in rows if not distributed]
    return len(rows), local


def attempt(conn: sa.Connection, call: str) -> str | None:
    """Run ``call``; Citus's refusal (message and detail) if it refuses, else None."""
    try:
        conn.execute(sa.text(f"SELECT {call}"))
    except sa.exc.DBAPIError as error:
        diag = getattr(error.orig, "diag", None)
        primary = getattr(diag, "message_primary", None) or str(error.orig).splitlines()[0]
        detail = getattr(diag, "message_detail", None)
        return f"{primary}" + (f" (DETAIL: {detail})" if detail else "")
    return None


def fresh_schema(admin: sa.Engine, url: sa.URL) -> None:
    with admin.connect() as conn:
        conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        conn.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
    migrate.upgrade(url.render_as_string(hide_password=False))


def run_pass(admin: sa.Engine, url: sa.URL, *, drop_blockers: bool) -> list[Outcome]:
    fresh_schema(admin, url)
    if not drop_blockers:
        with admin.connect() as conn:
            total, local = functions_kept_local(conn)
        print(
            f"functions: {total} installed on the coordinator, {total - len(local)} of them"
            f" created on the workers too; kept on the coordinator ({len(local)}):"
        )
        print(textwrap.indent(textwrap.fill(", ".join(local), width=96), "  "))
        print()
    outcomes: list[Outcome] = []
    cascaded: dict[str, list[str]] = {}  # table: its foreign keys dropped with a parent's key
    with admin.connect() as conn:
        found = tables(conn)
        for table in parents_first(conn, list(found)):
            call, column = plan_of(table, found[table])
            call = call.replace(f"('{table}'", f"('{SCHEMA}.{table}'").replace(
                f"=> '{TEAMS}'", f"=> '{SCHEMA}.{TEAMS}'"
            )
            outcome = Outcome(table=table, plan=plan_of(table, found[table])[0])
            outcome.cascaded = cascaded.get(table, [])
            outcomes.append(outcome)
            while True:
                refusal = attempt(conn, call)
                if refusal is None:
                    outcome.done = True
                    break
                left = blockers(conn, table, column)
                if not drop_blockers:
                    outcome.refusals.append((refusal, None))
                    outcome.left = left
                    break
                blocker = _refused(refusal, left)
                if blocker is None:
                    outcome.refusals.append((refusal, None))
                    outcome.left = left
                    break
                dropped = f"{blocker.kind} {blocker.definition}"
                dependents = _dependents(conn, blocker)
                if dependents:
                    dropped += f" (and, depending on it, {', '.join(dependents)})"
                for dependent in dependents:
                    child, name = dependent.split(".", 1)
                    cascaded.setdefault(child, []).append(name)
                conn.execute(sa.text(blocker.drop))
                outcome.refusals.append((refusal, dropped))
    return outcomes


def _dependents(conn: sa.Connection, blocker: Blocker) -> list[str]:
    """The foreign keys of other tables that reference ``blocker``'s index (dropped with it)."""
    if blocker.kind.startswith("foreign key"):
        return []
    rows = conn.execute(
        sa.text(
            "SELECT f.conrelid::regclass::text || '.' || f.conname FROM pg_constraint f"
            " WHERE f.contype = 'f' AND f.conindid = CAST(:index AS regclass)"
            " ORDER BY 1"
        ),
        {"index": f"{SCHEMA}.{blocker.name}"},
    )
    return [_bare(name) for (name,) in rows]


def _refused(refusal: str, left: list[Blocker]) -> Blocker | None:
    """The blocker ``refusal`` is about (None: a refusal of no kind the probe drops): Citus's
    messages name the kind of constraint (a foreign key, or a key or unique index) but not
    which one."""
    text = refusal.lower()
    if "foreign key" in text:
        kinds = {"foreign key"}
    elif "unique" in text or "primary key" in text or "constraint" in text:
        kinds = {"primary key", "unique", "unique index"}
    else:
        return None
    return next((b for b in left if b.kind.split(" (")[0] in kinds), None)


def exercise(url: sa.URL) -> list[tuple[str, str | None]]:
    """The README's walk through the store (a team, an agent, a send, a turn claimed, drained,
    appended to and ended, the transcript read) on the distributed schema: each step and the
    error it raised (None: it ran). Steps after a failed one that need it are not run."""
    from agent_router import MessageType, Router, Settings

    steps: list[tuple[str, str | None]] = []
    router = Router(Settings(database_url=url.render_as_string(hide_password=False)))

    def step(name: str, action: Callable[[], Any]) -> Any:
        try:
            result = action()
        except Exception as error:
            steps.append((name, _database_error(error)))
            return None
        steps.append((name, None))
        return result

    try:
        team = step("create_team", router.create_team)
        if team is None:
            return steps
        step("create_agent", lambda: router.create_agent(team.id, role="UI Operator"))
        step(
            "send",
            lambda: router.send(
                team.id,
                to="UI Operator_1",
                content="Build the login page.",
                sender="Team Leader",
                type=MessageType.TASK,
            ),
        )
        turn = step("claim_turn", lambda: router.claim_turn(team.id, "UI Operator_1"))
        if turn is not None:
            step("drain", lambda: list(turn.drain()))
            step(
                "append_assistant",
                lambda: turn.append_assistant({"role": "assistant", "content": "Done."}),
            )
            step("end", turn.end)
        step("transcript", lambda: router.transcript(team.id, "UI Operator_1"))
        step("ledger", lambda: router.ledger(team.id))
    finally:
        router.close()
    return steps


def _database_error(error: BaseException) -> str:
    """The server's message for ``error`` (and the statement of a function it came from), or
    the error itself where no server answered."""
    seen: BaseException | None = error
    while seen is not None:
        orig = getattr(seen, "orig", None) or seen
        diag = getattr(orig, "diag", None)
        if diag is not None and diag.message_primary:
            where = (diag.context or "").splitlines()
            return str(diag.message_primary) + (f" (CONTEXT: {where[0]})" if where else "")
        seen = seen.__cause__
    return f"{type(error).__name__}: {error}"


def report(title: str, outcomes: list[Outcome]) -> None:
    print(f"== {title}")
    for outcome in outcomes:
        verdict = "done" if outcome.done else "REFUSED"
        print(f"{outcome.table}: {verdict}  [{outcome.plan}]")
        for message, dropped in outcome.refusals:
            print(f"  refused: {message}")
            if dropped:
                print(f"    then dropped: {dropped}")
        for name in outcome.cascaded:
            print(f"  dropped before it was asked, with the key it references: {name}")
        for blocker in outcome.left:
            print(f"  blocker: {blocker.kind} {blocker.name}: {blocker.definition}")
    print()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url", nargs="?", default=DEFAULT_URL, help="the coordinator's URL")
    parser.add_argument("--keep", action="store_true", help=f"leave the schema {SCHEMA}")
    args = parser.parse_args(argv)
    base = sa.make_url(args.url)
    url = base.update_query_dict({"options": f"-csearch_path={SCHEMA}"})
    admin = sa.create_engine(base, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        version = conn.execute(sa.text("SELECT citus_version()")).scalar()
        workers = conn.execute(sa.text("SELECT count(*) FROM citus_get_active_worker_nodes()"))
        print(f"{version}; {workers.scalar()} active workers\n")
    as_is = run_pass(admin, url, drop_blockers=False)
    report("as is: the schema of `agent-router db upgrade`", as_is)
    found = run_pass(admin, url, drop_blockers=True)
    report("blockers: each refused constraint dropped in turn, and asked again", found)
    print("== the store on the schema the blockers pass left (every table distributed)")
    for name, error in exercise(url):
        print(f"{name}: {'ran' if error is None else 'FAILED: ' + error}")
    if not args.keep:
        with admin.connect() as conn:
            conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
    admin.dispose()
    return 0 if all(outcome.done for outcome in as_is) else 1


if __name__ == "__main__":
    sys.exit(main())
