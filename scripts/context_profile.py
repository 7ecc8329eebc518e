"""Where the router's time goes for one model call as a transcript grows: the CPU per model call
(``agent_router.ops.bench.model_call_cpu``, a model that answers at once) at 10, 100 and 1,000
transcript entries on SQLite and PostgreSQL, and the functions that took it (cProfile, sorted by
cumulative time).

    .venv/bin/python scripts/context_profile.py [--postgres-url URL] [--top N]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import tempfile

from agent_router.ops.bench import TRANSCRIPT_ENTRIES, model_call_cpu
from agent_router.router import Router
from agent_router.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres-url", default="postgresql+psycopg://root@127.0.0.1:5432/test")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        targets = {
            "sqlite": f"sqlite:///{tmp}/profile.db",
            "postgresql": args.postgres_url,
        }
        for backend, url in targets.items():
            settings = Settings(database_url=url, broker_url="memory://", work_seconds=0.0)
            router = Router(settings, publisher=None)
            router.create_schema()
            try:
                for entries in TRANSCRIPT_ENTRIES:
                    profile = cProfile.Profile()
                    profile.enable()
                    per_call, calls = model_call_cpu(router, entries)
                    profile.disable()
                    print(
                        f"== {backend}, {entries} entries: CPU per model call "
                        f"{statistics.median(per_call) * 1e3:.2f} ms (median of {len(per_call)} "
                        f"turns, {calls} calls)"
                    )
                    out = io.StringIO()
                    pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(args.top)
                    print(out.getvalue())
            finally:
                router.close()


if __name__ == "__main__":
    main()
