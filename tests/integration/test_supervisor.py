"""The supervisor of ``agent-router worker``: a child that dies is started again, a child that
exits cleanly or is told to stop is not, and a supervisor killed outright takes its child with
it (Linux). The children are small Python processes, signalled for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from agent_router.ops.supervisor import supervise

TIMEOUT = 30.0


def _child(tmp_path: Path, body: str) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(body))
    return [sys.executable, str(script), str(tmp_path)]


def _supervisor(command: list[str]) -> subprocess.Popen[bytes]:
    code = (
        "import sys; from agent_router.ops.supervisor import supervise; "
        f"sys.exit(supervise({command!r}))"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def _wait_for(path: Path) -> str:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its new parent) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_a_dying_child_is_started_again_until_it_exits_cleanly(tmp_path: Path) -> None:
    command = _child(tmp_path, """
        import sys
        from pathlib import Path
        runs = Path(sys.argv[1]) / "runs"
        n = int(runs.read_text()) + 1 if runs.exists() else 1
        runs.write_text(str(n))
        sys.exit(1 if n < 3 else 0)  # dies twice, then exits cleanly
    """)  # fmt: skip
    assert supervise(command) == 0
    assert (tmp_path / "runs").read_text() == "3"


def test_sigterm_is_passed_on_and_ends_the_supervisor(tmp_path: Path) -> None:
    command = _child(tmp_path, """
        import os, signal, sys, time
        from pathlib import Path
        def stop(signum, frame):
            (Path(sys.argv[1]) / "got").write_text(str(signum))
            sys.exit(3)  # not 0: a child stopped by a signal is not started again all the same
        signal.signal(signal.SIGTERM, stop)
        (Path(sys.argv[1]) / "pid").write_text(str(os.getpid()))
        time.sleep(60)
    """)  # fmt: skip
    proc = _supervisor(command)
    _wait_for(tmp_path / "pid")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(TIMEOUT) == 3
    assert _wait_for(tmp_path / "got") == str(int(signal.SIGTERM))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG)")
def test_a_killed_supervisor_takes_its_child_with_it(tmp_path: Path) -> None:
    command = _child(tmp_path, """
        import os, sys, time
        from pathlib import Path
        (Path(sys.argv[1]) / "pid").write_text(str(os.getpid()))
        time.sleep(60)
    """)  # fmt: skip
    proc = _supervisor(command)
    child = int(_wait_for(tmp_path / "pid"))
    assert _alive(child)
    proc.send_signal(signal.SIGKILL)
    proc.wait(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while _alive(child):
        assert time.monotonic() < deadline, "the child outlived its supervisor"
        time.sleep(0.05)
