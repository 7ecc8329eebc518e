"""The timeline's screenshots in ``docs/images/``, made again: teams routed for real through the
router (``tests/support/teams.py``: a scripted clock moves each step to its time), each written
as the page ``agent-router timeline TEAM -o team.html`` writes, opened in headless Chromium
(selenium and the Debian ``chromium`` and ``chromium-driver`` packages, as the browser tests)
at 1400 x 900.

    .venv/bin/python scripts/screenshots.py [--out docs/images]

- ``timeline-team-of-30.png``: a team of 30 agents and about 2,000 messages over 80 s, whole;
- ``timeline-team-of-30-focus.png``: the same, focused on Backend Engineer_2;
- ``timeline-spans-team-of-30.png``: the same zoomed to nine seconds, its model calls and tool
  calls inside their turns, one of them clicked;
- ``timeline-slow-model-call.png``: a turn whose one model call took 25 s, drawn as work;
- ``timeline-now-blocked.png``: an agent blocked on the lead for 40 s, at the top of the page;
- ``timeline-asks-table.png``: the team of 30's asks, sorted by how long they waited;
- ``timeline-100-agents-page-2.png``: page 2 of a team of 100 agents, with the lead.

Each PNG is made smaller with ``pngquant`` (the Debian package) when it is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the teams and the browser of the tests' support

from selenium.webdriver.common.by import By  # noqa: E402
from tests.support.browser import chromium  # noqa: E402
from tests.support.teams import (  # noqa: E402
    MODEL,
    blocked_team,
    busy_team,
    fill_huge_team,
    slow_model_team,
)

from agent_router import Router, Settings  # noqa: E402
from agent_router.ops.timeline import render_html, team_timeline  # noqa: E402
from agent_router.outbox import RecordingPublisher  # noqa: E402
from agent_router.settings import ModelSpec  # noqa: E402

#: The scripted model's prices, so that the calls have a cost.
PRICES = {MODEL: ModelSpec(input=0.4, output=1.6)}


def click(driver: object, css: str) -> None:
    """Click the first element ``css`` names, as a user would (the event bubbles)."""
    driver.execute_script(  # type: ignore[attr-defined]
        "document.querySelector(arguments[0]).dispatchEvent("
        "new MouseEvent('click', {bubbles: true}))",
        css,
    )


def shoot(driver: object, path: Path) -> None:
    time.sleep(0.3)
    driver.save_screenshot(str(path))  # type: ignore[attr-defined]
    if shutil.which("pngquant"):  # a palette of 256 colours: a third of the size, same look
        subprocess.run(
            ["pngquant", "--force", "--skip-if-larger", "--quality", "70-95", "--speed", "1",
             "--output", str(path), str(path)],
            check=False,
        )  # fmt: skip
    print(f"{path}: {path.stat().st_size // 1024} KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/teams.db"
        router = Router(Settings(database_url=url, models=PRICES), publisher=RecordingPublisher())
        router.create_schema()
        thirty = busy_team(router, agents=30, messages=2000, seconds=80.0).team_id
        slow = slow_model_team(router)
        blocked = blocked_team(router)
        hundred = fill_huge_team(router.store.engine, 99).team_id
        pages = {team: Path(tmp, f"team-{team}.html") for team in (thirty, slow, blocked, hundred)}
        for team, page in pages.items():
            page.write_text(render_html(team_timeline(router, team)))
        router.close()
        with chromium() as driver:
            driver.get(pages[thirty].as_uri())
            shoot(driver, out / "timeline-team-of-30.png")
            click(driver, "g.lane[data-agent='Backend Engineer_2'] .lane-label")
            shoot(driver, out / "timeline-team-of-30-focus.png")
            driver.get(pages[thirty].as_uri())
            # Nine seconds of the first wave: each call's model and tokens, or tool, in its span.
            driver.execute_script("window.swimlane.setWindow(6, 15)")
            click(driver, "g.call[data-kind='model'][data-agent='Backend Engineer_2']")
            shoot(driver, out / "timeline-spans-team-of-30.png")
            driver.get(pages[slow].as_uri())
            click(driver, "g.call[data-kind='model']")
            shoot(driver, out / "timeline-slow-model-call.png")
            driver.get(pages[blocked].as_uri())
            click(driver, "#now li.now-item")
            shoot(driver, out / "timeline-now-blocked.png")
            driver.get(pages[thirty].as_uri())
            for _ in range(2):  # waited, longest first
                click(driver, "#asks th button[data-key='waited']")
            click(driver, "#asks tbody tr")
            driver.execute_script("document.getElementById('asks').scrollIntoView()")
            driver.execute_script("window.scrollBy(0, -330)")
            shoot(driver, out / "timeline-asks-table.png")
            driver.get(pages[hundred].as_uri())
            driver.find_element(By.CSS_SELECTOR, "button[title='Next agents']").click()
            shoot(driver, out / "timeline-100-agents-page-2.png")


if __name__ == "__main__":
    main()
