"""The repository explains itself: no tracked file points a reader at a document, ticket or
numbered scenario that is not in the repository (a design section, an issue number, a scenario
of an outside note, a work session, a path of some machine). Facts are stated where they are
needed, and the design contract is docs/design.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

POINTERS = [
    re.compile("DESIGN" + r"(\.md| section| §|\s+\d)"),
    re.compile(r"\bshared" + "/"),
    re.compile(r"(?i)\b(issue|ticket)s?\s+#?\d"),
    re.compile(r"(?i)\(" + r"(issue|ticket)\b"),
    re.compile(r"(?i)\bseed(?:'s)?\s+(\d|team|scenario|role|roles)\b"),
    re.compile(r"(?i)\bthe seed\b"),
    re.compile(r"(?i)\bsession\s+\d"),
    re.compile(r"(?i)\bsection\s+\d+(\.\d+)?\s+of\s+the\s+(design|contract)"),
    re.compile("ARCHITECTURE" + "-NOTES|STYLE" + r"\.md"),
    re.compile(r"/" + "work/"),
]


def tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    files = []
    for name in names:
        path = ROOT / name.decode()
        if path == Path(__file__).resolve():
            continue  # this file spells the patterns out
        if name and path.is_file() and path.suffix not in {".png", ".jpg", ".ico"}:
            files.append(path)
    return files


def pointers_in(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in POINTERS:
            match = pattern.search(line)
            if match:
                found.append(f"{number}: {match.group(0)!r} in {line.strip()[:100]}")
    return found


def test_no_tracked_file_points_outside_the_repository() -> None:
    problems = []
    for path in tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        problems += [f"{path.relative_to(ROOT)}:{p}" for p in pointers_in(text)]
    assert not problems, "\n".join(problems)


def test_the_patterns_catch_each_kind_of_pointer() -> None:
    for line in [
        "the figures of DESIGN" + " section 7",
        "see shared" + "/DESIGN" + ".md",
        "added for operations (" + "issue" + " 7)",
        "Issue" + " 6's volume",
        "seed" + " 3.4: messages land while",
        "the seed" + "'s team",
        "a five-minute run in session" + " 3",
    ]:
        assert pointers_in(line), line
    for line in [
        "rng = random.Random(profile.seed)",
        "self.router.store.seed_mailbox(agent.id, queued)",
        "scenario 3.4 of docs/design.md",
        "a test session's turn tasks",
    ]:
        assert not pointers_in(line), line
