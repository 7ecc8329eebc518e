"""What a model names, found the way a sloppy model names it: agents by display name (case,
spaces and punctuation ignored, an unambiguous near-miss accepted) and questions by id (in the
forms a model saw or makes up). A name or id that matches nothing is refused with what would
have matched: the roster, or the open questions.
"""

from __future__ import annotations

import difflib
import itertools
import re
from typing import TYPE_CHECKING, Any

from agent_router import errors
from agent_router import validation as check
from agent_router.domain import Agent, MessageType, Question, QuestionKind

if TYPE_CHECKING:
    from agent_router.router import Router


def roster_line(agents: list[Agent]) -> str:
    return ", ".join(f"{a.display_name} ({a.role}, {a.state.value})" for a in agents)


def _key(name: str) -> str:
    return "".join(c for c in name.casefold() if c.isalnum())


def agent_named(router: Router, team_id: int, name: str, *, asking: int) -> Agent:
    """The team's agent called ``name``, or the one agent whose name it unambiguously spells
    (``ui operator 1`` for ``UI Operator_1``). ``asking``: the id of the agent looking."""
    # A name with hidden or look-alike characters is refused, never matched loosely.
    name = check.name(name)
    agents = router.agents(team_id)
    exact = [a for a in agents if a.display_name == name]
    if exact:
        return exact[0]
    near = [a for a in agents if _key(a.display_name) == _key(name)]
    if not near:
        keys = {_key(a.display_name): a for a in agents}
        close = difflib.get_close_matches(_key(name), list(keys), n=2, cutoff=0.85)
        near = [keys[k] for k in close]
    if len(near) == 1:
        return near[0]
    others = [a for a in agents if a.id != asking]
    raise errors.UnknownAgentError(
        f"no agent {name!r} in your team; the team is: {roster_line(others) or 'only you'}"
    )


def open_questions_to(router: Router, team_id: int, agent_id: int) -> list[Question]:
    """Open questions addressed to the agent, oldest first (asks only: a wait for a sub-agent's
    output is no question)."""
    statuses = router.reads.agent_statuses(team_id)
    mine = next((s for s in statuses if s.agent.id == agent_id), None)
    questions = [router.question(q) for q in (mine.questions_to_answer if mine else ())]
    return [q for q in questions if q.kind is QuestionKind.ASK]


def listed(router: Router, questions: list[Question]) -> str:
    if not questions:
        return "you have no open questions"
    askers = {q.id: router.reads.agent_by_id(q.asker_agent_id) for q in questions}
    return "your open questions: " + ", ".join(
        f"{q.id} (from {askers[q.id].display_name})" for q in questions
    )


def question_id(router: Router, team_id: int, agent_id: int, value: Any) -> int:
    """The question an answer is for. Accepts ``4``, ``"4"``, ``"q-4"``, ``"question 4"`` and
    the message_id of the ask; defaults to the only open question when none is given."""
    open_ = open_questions_to(router, team_id, agent_id)
    if value is None or (isinstance(value, str) and not value.strip()):
        if len(open_) == 1:
            return open_[0].id
        raise errors.UnknownQuestionError(f"`question_id` is missing; {listed(router, open_)}")
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and len(digits := re.findall(r"\d+", value)) == 1:
        if len(digits[0]) > len(str(check.MAX_ID)):  # no id is that long (nor convertible)
            shown = f"{digits[0][:20]}… ({len(digits[0])} digits)"
            raise errors.UnknownQuestionError(f"no question {shown}; {listed(router, open_)}")
        number = int(digits[0])
    if number is None:
        raise errors.UnknownQuestionError(
            "`question_id` must be the number in the question's question_id attribute; "
            f"{listed(router, open_)}"
        )
    if not 0 < number <= check.MAX_ID:  # no row has such an id
        raise errors.UnknownQuestionError(
            f"no question {check.shown(number)}; {listed(router, open_)}"
        )
    if any(q.id == number for q in open_):
        return number
    by_message = _question_of_message(router, agent_id, number)
    return by_message if by_message is not None else number


def _question_of_message(router: Router, agent_id: int, message_id: int) -> int | None:
    """The question an ``ask`` message to the agent carried (a model may pass its message_id)."""
    try:
        message = router.reads.message(message_id)
    except errors.AgentRouterError:
        return None
    mine = message.target_agent_id == agent_id and message.type is MessageType.ASK
    return message.question_id if mine else None


def cycle_advice(exc: errors.AskRefusedError, me: str) -> str:
    """A refused wait, said so that the model knows what to do instead."""
    if not exc.cycle:
        return str(exc)
    names = ["you" if n == me else n for n in exc.cycle]
    links = [f"{a} is waiting on {b}" for a, b in itertools.pairwise(names[1:])]
    chain = "; ".join([f"you would wait on {names[1]}", *links])
    return (
        f"refused: waiting would deadlock ({chain}). Instead, answer the open question of "
        f"{names[1]} first (then ask again if you still need to), or send it a message "
        "that needs no answer and carry on."
    )
