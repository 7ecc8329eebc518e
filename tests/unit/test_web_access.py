"""Who ``agent-router web`` answers: the Host names it serves, and a token it asks for (required
off loopback), decided before any view runs; tested on the WSGI application itself (the
running server is tested in tests/acceptance/test_web.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_router import errors
from agent_router.ops.web.server import WebApp, access, is_loopback

TOKEN = "0123456789abcdef-token"


class NoRouter:
    """Stands for the router where no view may run: every test here is refused before one."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a refused request reached the router ({name})")


def call(app: WebApp, path: str, **environ: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    got: dict[str, Any] = {}

    def start(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"], got["headers"] = status, dict(headers)

    path, _, query = path.partition("?")
    env = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query,
           "REQUEST_URI": path + ("?" + query if query else "")} | environ  # fmt: skip
    body = b"".join(app(env, start))
    json_body = got["headers"].get("Content-Type") == "application/json"
    return got["status"], got["headers"], json.loads(body) if json_body else {"bytes": len(body)}


def test_loopback_names() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.8.9.1", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def test_a_token_is_required_off_loopback_and_must_be_long() -> None:
    with pytest.raises(errors.ConfigurationError, match="needs a token"):
        access("0.0.0.0", 8765, token=None)
    with pytest.raises(errors.ConfigurationError, match="16 characters"):
        access("127.0.0.1", 8765, token="short")
    # A token goes into a header, a cookie and a query string as it is.
    for unsafe in ("0123456789abcdef; Path=/x", "0123456789abcdef\r\nX: y", "0123456789 abcdef+"):
        with pytest.raises(errors.ConfigurationError, match="letters, digits"):
            access("127.0.0.1", 8765, token=unsafe)
    rules = access("0.0.0.0", 8765, token=TOKEN, names=["Router.Internal", " "])
    assert rules.hosts == {"127.0.0.1", "localhost", "[::1]", "router.internal"}
    assert access("10.1.2.3", 80, token=TOKEN).hosts >= {"10.1.2.3"}
    assert access("::1", 80, token=None).hosts >= {"[::1]"}


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost.", "", "[::2]"],
)
def test_other_hosts_are_refused_before_anything_runs(host: str) -> None:
    app = WebApp(NoRouter(), access("127.0.0.1", 8765, token=None))  # type: ignore[arg-type]
    status, _, body = call(app, "/api/teams/1/view", HTTP_HOST=host)
    assert status.startswith("400") and body == {
        "error": "this server does not answer to that Host"
    }


def test_the_token_is_asked_before_anything_runs() -> None:
    app = WebApp(NoRouter(), access("127.0.0.1", 8765, token=TOKEN))  # type: ignore[arg-type]
    ok_host = {"HTTP_HOST": "127.0.0.1:8765"}
    for path in ("/", "/static/app.js", "/api/teams", "/api/teams/1/view", "/api/teams/2"):
        assert call(app, path, **ok_host)[0].startswith("401"), path
    for auth in ("Bearer " + TOKEN[:-1], "Basic " + TOKEN, TOKEN, "Bearer"):
        assert call(app, "/api/teams", HTTP_AUTHORIZATION=auth, **ok_host)[0].startswith("401")
    bad_cookie = "agent_router_web_8765=" + TOKEN + "x"
    assert call(app, "/api/teams", HTTP_COOKIE=bad_cookie, **ok_host)[0].startswith("401")
    other_port = f"agent_router_web_9999={TOKEN}"
    assert call(app, "/api/teams", HTTP_COOKIE=other_port, **ok_host)[0].startswith("401")
    status, headers, _ = call(app, "/", QUERY_STRING=f"token={TOKEN}&x=1", **ok_host)
    assert status.startswith("303") and headers["Location"] == "/?x=1"
    assert headers["Set-Cookie"].startswith(f"agent_router_web_8765={TOKEN}; ")
    status, _, _ = call(app, "/", QUERY_STRING="token=nope", **ok_host)
    assert status.startswith("401")
    # With the token, the page's files are served (they need no router).
    status, headers, body = call(app, "/", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", **ok_host)
    assert status.startswith("200") and headers["Content-Type"].startswith("text/html")
    assert body["bytes"] > 100 and headers["Content-Length"] == str(body["bytes"])


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/\\attacker.example", "/"),
        ("//attacker.example", "/"),
        ("/%5Cattacker.example", "/"),
        ("/\\\\attacker.example/api/teams", "/"),
        ("/nowhere", "/"),
        ("/api/teams/3/view", "/api/teams/3/view"),
        ("/static/app.js", "/static/app.js"),
    ],
)
def test_entering_with_the_token_redirects_only_to_a_path_of_its_own(
    path: str, location: str
) -> None:
    """A path a browser reads as another host (``/\\host`` is ``//host`` to it) is never sent
    back in the Location: the redirect goes to the page instead."""
    app = WebApp(NoRouter(), access("127.0.0.1", 8765, token=TOKEN))  # type: ignore[arg-type]
    status, headers, _ = call(app, f"{path}?token={TOKEN}&x=1", HTTP_HOST="127.0.0.1:8765")
    assert status.startswith("303")
    assert headers["Location"] == f"{location}?x=1"
