"""The HOT run: how ar_agents' updates are written with and without room in its pages. On a
private database of the PostgreSQL server at 127.0.0.1, AGENTS agents each run a turn; ROUNDS
times each is sent a message (its next sequence number) and appends an assistant entry (its
next position). Printed per fillfactor: ar_agents' updates, the share written HOT, and the
table's and its indexes' size; each with and without a snapshot held open meanwhile (a long
report, a lagging replica with hot_standby_feedback): dead versions it may still see can be
neither pruned in their page nor vacuumed.

    .venv/bin/python scripts/agents_hot_run.py [AGENTS ROUNDS]   (default: 400 50)
"""

from __future__ import annotations

import sys
import time

import sqlalchemy as sa

from agent_router.ops.chaos_processes import private_database
from agent_router.outbox import RecordingPublisher
from agent_router.router import Router
from agent_router.settings import Settings
from agent_router.waker import InProcessWaker

SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def measure(fillfactor: int, agents: int, rounds: int, *, hold: bool) -> str:
    with private_database(SERVER) as name:
        url = sa.engine.make_url(SERVER).set(database=name).render_as_string(hide_password=False)
        router = Router(Settings(database_url=url), publisher=RecordingPublisher(),
                        waker=InProcessWaker())  # fmt: skip
        router.create_schema()
        with router.store.engine.begin() as conn:
            conn.execute(sa.text(f"ALTER TABLE ar_agents SET (fillfactor = {fillfactor})"))
        turns = []
        for _ in range(agents // 4):
            team = router.create_team()
            for role in ("Engineer", "Designer", "Writer"):
                router.create_agent(team.id, role=role)
            for agent in router.agents(team.id):
                router.send(team.id, to=agent.display_name, content="start", sender="user")
                turn = router.claim_turn(team.id, agent.display_name)
                assert turn is not None
                turn.drain()
                turns.append(turn)
        with router.store.engine.connect() as conn:
            base = conn.execute(sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'ar_agents'")).one()  # fmt: skip
        holder = sa.create_engine(url, isolation_level="REPEATABLE READ")
        held = holder.connect()
        if hold:
            held.execute(sa.text("SELECT count(*) FROM ar_agents")).scalar_one()
        for n in range(rounds):
            for turn in turns:
                router.send(turn.team_id, to=turn.display_name, content=f"m{n}", sender="user")
                turn.append_assistant({"role": "assistant", "content": f"step {n}"})
        held.close()
        holder.dispose()
        router.close()  # the backends exit: their statistics are flushed
        time.sleep(1.5)
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            upd, hot = conn.execute(sa.text(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
                "WHERE relname = 'ar_agents'")).one()  # fmt: skip
            table = conn.execute(sa.text("SELECT pg_relation_size('ar_agents')")).scalar_one()
            indexes = conn.execute(sa.text("SELECT pg_indexes_size('ar_agents')")).scalar_one()
        engine.dispose()
        upd, hot = upd - base[0], hot - base[1]
        return (
            f"fillfactor {fillfactor:3d}, snapshot {'held' if hold else 'none'}: "
            f"{len(turns)} agents, {upd} updates, {hot} HOT "
            f"({100 * hot / max(upd, 1):.1f}%), table {table // 1024} KiB, "
            f"indexes {indexes // 1024} KiB"
        )


def main() -> None:
    agents, rounds = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (400, 50)
    for hold in (False, True):
        for fillfactor in (100, 50):
            print(measure(fillfactor, agents, rounds, hold=hold), flush=True)


if __name__ == "__main__":
    main()
