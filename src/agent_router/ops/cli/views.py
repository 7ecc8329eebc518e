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
    _settings,
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
            help="File to write (default: standard output). A Mermaid diagram split in parts "
            "is written to FILE-1.mmd, FILE-2.mmd, ... beside it.",
        ),
    ] = None,
    fmt: Annotated[
        TimelineFormat,
        typer.Option(
            "--format",
            envvar="AGENT_ROUTER_TIMELINE_FORMAT",
            help="html: a self-contained swimlane page (no network needed to view it); "
            "mermaid: a sequence diagram (summarised and split in parts past Mermaid's "
            "50,000-character limit).",
        ),
    ] = TimelineFormat.HTML,
    by_agent: Annotated[
        bool,
        typer.Option(
            "--by-agent",
            envvar="AGENT_ROUTER_TIMELINE_BY_AGENT",
            help="mermaid: one participant per agent, however many (a team of more than "
            "16 agents and outside senders is otherwise summarised by role).",
        ),
    ] = False,
    database_url: DatabaseUrlOption = None,
) -> None:
    """Draw a team's story: one lane per agent, turns as bars, messages as arrows coloured by
    kind (task, ask, answer, report, message, notice) with the routing outcome as their tip,
    each ask linked to its answer with the time its asker waited; idle gaps compressed, zoom,
    pan, an overview strip, filters by agent and kind, and a view focused on one agent."""
    from agent_router.ops.timeline import render_html, render_mermaid, team_timeline

    if output is not None and str(output) != "-" and not output.absolute().parent.is_dir():
        # Said before the team is read: nothing is drawn for a file that cannot be written.
        folder = output.absolute().parent
        raise preflight.NotReadyError(
            f"no directory {folder} to write {output.name} in",
            hint=f"create it with `mkdir -p {folder}`, or pass another --output",
        )
    with _router(database_url, preflight.existing_database) as router:
        data = team_timeline(router, team)
    counts = (
        f"team {team}, {len(data['lanes']['items'])} agents, {len(data['turns'])} turns, "
        f"{len(data['messages'])} messages"
    )
    if fmt is TimelineFormat.HTML:
        _write(output, render_html(data))
        if output is not None and str(output) != "-":
            print(f"{output}: {counts}", file=sys.stderr)
        return
    diagrams = render_mermaid(data, by_agent=by_agent)
    if diagrams[0].by_role:
        print(
            f"agent-router: the diagram of {counts} is summarised by role, one arrow per pair "
            f"and kind (a participant per agent would be too wide to read): "
            f"`agent-router timeline {team} --format mermaid --by-agent` draws every agent",
            file=sys.stderr,
        )
    if len(diagrams) > 1:
        print(
            f"agent-router: the diagram of {counts} is past Mermaid's 50,000-character limit: "
            f"runs of messages between one pair are summarised as one arrow, and it is split "
            f"in {len(diagrams)} parts by time",
            file=sys.stderr,
        )
    if output is None or str(output) == "-":
        sys.stdout.write("\n".join(d.text for d in diagrams))
        return
    if len(diagrams) == 1:
        _write(output, diagrams[0].text)
        print(f"{output}: {counts}", file=sys.stderr)
        return
    for d in diagrams:
        part = output.with_name(f"{output.stem}-{d.part}{output.suffix or '.mmd'}")
        _write(part, d.text)
        print(
            f"{part}: part {d.part} of {d.parts}, {d.start:.1f} s to {d.end:.1f} s", file=sys.stderr
        )


def _write(output: Path | None, text: str) -> None:
    if output is None or str(output) == "-":
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")


@app.command()
@_one_line_errors
def web(
    database_url: DatabaseUrlOption = None,
    host: Annotated[
        str,
        typer.Option(
            envvar="AGENT_ROUTER_WEB_HOST",
            help="Address to listen on. Anything but loopback needs a token (--token).",
        ),
    ] = "127.0.0.1",
    port: Annotated[int, http_port_option("AGENT_ROUTER_WEB_PORT")] = 8765,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="AGENT_ROUTER_WEB_TOKEN",
            help="Token every request must carry (Authorization: Bearer, or the cookie that "
            "opening /?token=TOKEN once sets): at least 16 letters, digits or . _ ~ -.",
            metavar="TOKEN",
            show_default=False,
        ),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            envvar="AGENT_ROUTER_WEB_HOSTS",
            help="A host name the page is reached by, besides 127.0.0.1, localhost and [::1] "
            "(repeatable; in the variable, separated by commas). Requests naming any other "
            "Host are refused.",
            metavar="NAME",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Serve a read-only live UI of the router's database: the teams, each team's agents with
    their state, its swimlane following new events (paged by agents and by time window, so a
    team of any size loads at once), and an agent's transcript with the provenance of every
    entry. Answers only the Host names it serves, asks for a token when given one (required
    off loopback), and holds no thread for a slow or idle connection. Ctrl-C stops it."""
    from agent_router.ops.web.server import access, make_server

    settings = _settings(database_url)
    hosts = allow_host or [settings.web_hosts or ""]
    rules = access(
        host,
        port,
        token=token or settings.web_token,
        names=[name for given in hosts for name in given.split(",")],
    )
    with _router(database_url, preflight.database_ready) as router:
        server = make_server(
            router,
            host,
            port,
            rules=rules,
            threads=settings.web_threads,
            timeout_seconds=settings.web_timeout_seconds,
        )
        shown = f"[{host}]" if ":" in host else host
        print(
            f"agent-router web on http://{shown}:{server.effective_port}/"
            + (" (token required: open /?token=TOKEN once)" if rules.token else ""),
            file=sys.stderr,
            flush=True,
        )
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()


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
            port, reads=lambda: router.reads, registry=CollectorRegistry(), addr=address
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
