"""Commands that draw a team: ``timeline`` (a swimlane page or a Mermaid diagram) and ``web``
(the live, read-only UI)."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated

import typer

from agent_router.ops import preflight
from agent_router.ops.cli.common import (
    DatabaseUrlOption,
    TeamArgument,
    _one_line_errors,
    _router,
    app,
    http_port_option,
)


class TimelineFormat(enum.StrEnum):
    HTML = "html"
    MERMAID = "mermaid"


@app.command()
@_one_line_errors
def timeline(
    team: TeamArgument,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            envvar="AGENT_ROUTER_TIMELINE_OUTPUT",
            help="File to write (default: standard output).",
        ),
    ] = None,
    fmt: Annotated[
        TimelineFormat,
        typer.Option(
            "--format",
            envvar="AGENT_ROUTER_TIMELINE_FORMAT",
            help="html: a self-contained swimlane page (no network needed to view it); "
            "mermaid: a sequence diagram.",
        ),
    ] = TimelineFormat.HTML,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Draw a team's story: one lane per agent, turns as bars coloured by trigger, messages as
    arrows coloured by routing outcome, asks linked to their answers; hover or click one to
    read its ledger line and the message."""
    from agent_router.ops.timeline import render_html, render_mermaid, team_timeline

    with _router(database_url, preflight.existing_database) as router:
        data = team_timeline(router, team)
    text = render_mermaid(data) if fmt is TimelineFormat.MERMAID else render_html(data)
    if output is None or str(output) == "-":
        sys.stdout.write(text)
        return
    output.write_text(text, encoding="utf-8")
    print(
        f"{output}: team {team}, {len(data['lanes'])} lanes, {len(data['turns'])} turns, "
        f"{len(data['messages'])} messages",
        file=sys.stderr,
    )


@app.command()
@_one_line_errors
def web(
    database_url: DatabaseUrlOption = None,
    host: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_WEB_HOST",
            help="Address to listen on. The UI has no login: keep it on 127.0.0.1 (or behind "
            "an authenticating proxy).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, http_port_option("AGENT_ROUTER_WEB_PORT")] = 8765,
) -> None:
    """Serve a read-only live UI of the router's database: the teams, each team's agents with
    their state and counts, its swimlane following new events, and an agent's transcript with
    the provenance of every entry. Ctrl-C stops it."""
    from agent_router.ops.web.server import make_server

    with _router(database_url, preflight.database_ready) as router:
        server = make_server(router, host, port)
        print(
            f"agent-router web on http://{host}:{server.server_port}/", file=sys.stderr, flush=True
        )
        try:
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()


@app.command("metrics")
@_one_line_errors
def metrics_exporter(
    database_url: DatabaseUrlOption = None,
    port: Annotated[int, http_port_option("AGENT_ROUTER_CLUSTER_METRICS_PORT")] = 9101,
    address: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_METRICS_ADDRESS",
            help="Address to listen on (0.0.0.0 for a scraper on another host).",
        ),
    ] = "127.0.0.1",
) -> None:
    """Serve the deployment's cluster-wide Prometheus gauges, read from the database at each
    scrape: mailbox depth and agents by state, the oldest pending message's age, open questions,
    unpublished outbox rows. Run one (workers serve only their own counters). Ctrl-C stops it."""
    import threading

    from prometheus_client import CollectorRegistry

    from agent_router.worker import metrics

    with _router(database_url, preflight.database_ready) as router:
        server = metrics.serve(
            port, store=lambda: router.store, registry=CollectorRegistry(), addr=address
        )
        print(
            f"agent-router metrics on http://{address}:{server.server_port}/metrics",
            file=sys.stderr,
        )
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
        finally:
            server.shutdown()
