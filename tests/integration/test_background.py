"""Background jobs: a Celery task started on an agent's behalf comes back as one notice, through
its link callback or, if that was lost, through the sweeper's poller; completions close together
wake the agent once."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery

from agent_router import MessageType, Router, Settings
from agent_router.broker import CeleryPublisher
from agent_router.domain import JobStatus
from agent_router.ops.checks import check_team
from agent_router.ops.demo import wait_quiescent, wait_until
from agent_router.worker.runtime import Runtime

TIMEOUT = 60.0
JOB = "tests.background_job"
FAILING_JOB = "tests.failing_job"


@pytest.fixture
def job_tasks(celery_app: Celery, celery_settings: Settings) -> Celery:
    """Job tasks registered before the worker starts (it refuses unregistered tasks), on the
    queue the test's worker consumes: a job is a host's task, which goes where the host routes
    it (the router's app makes no queue of its own the default one)."""
    jobs = {"queue": celery_settings.queue}
    celery_app.conf.update(
        task_routes={**celery_app.conf.task_routes, JOB: jobs, FAILING_JOB: jobs}
    )

    @celery_app.task(name=JOB, shared=False)  # not on every later test app
    def background_job(i: int, delay: float) -> str:
        time.sleep(delay)
        return f"result {i}"

    @celery_app.task(name=FAILING_JOB, shared=False)
    def failing_job() -> None:
        raise ValueError("disk full")

    return celery_app


def _debug(router: Router, team_id: int, agent_id: int) -> str:
    lines = [f"job {j.id} finished {j.finished_at}" for j in router.background_jobs(team_id)]
    turns = router.store.reads.turns(agent_id)
    lines += [f"turn {t.id} {t.trigger} {t.started_at}..{t.ended_at}" for t in turns]
    return "\n".join(lines)


def _notices(router: Router, team_id: int, agent_id: int) -> list[Any]:
    return [
        m
        for m in router.messages(team_id)
        if m.type is MessageType.NOTICE and m.target_agent_id == agent_id
    ]


def test_twenty_jobs_finishing_together_start_one_or_two_turns(
    job_tasks: Celery, inproc_worker: Runtime
) -> None:
    router = inproc_worker.router
    team = router.create_team()
    agent = router.create_agent(team.id, role="Full-Stack Engineer")
    jobs = [
        router.track_background(
            team.id, agent.display_name, job_tasks.signature(JOB, args=(i, 0.025 * i))
        )
        for i in range(20)
    ]
    wait_until(
        lambda: all(j.status is not JobStatus.RUNNING for j in router.background_jobs(team.id)),
        "every job to be reported",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team.id, timeout=TIMEOUT)

    turns = router.store.reads.turns(agent.id)
    assert 1 <= len(turns) <= 2, _debug(router, team.id, agent.id)
    finished = router.background_jobs(team.id)
    assert [j.status for j in finished] == [JobStatus.SUCCEEDED] * 20
    notices = _notices(router, team.id, agent.id)
    assert sorted(m.id for m in notices) == sorted(j.notice_message_id or 0 for j in finished)
    assert {m.source_name for m in notices} == {f"job:{JOB}"}
    entries = router.store.reads.transcript_entries(agent.id)
    in_transcript = [e["message_id"] for e in entries if e["message_id"] is not None]
    for job, notice in zip(jobs, sorted(notices, key=lambda m: m.id), strict=True):
        assert in_transcript.count(notice.id) == 1, job
    texts = " ".join(str(e["payload"].get("content")) for e in entries)
    assert all(f"result {i}" in texts for i in range(20))
    assert check_team(router, team.id, quiescent=True).ok


def test_failed_job_is_reported_through_link_error(
    job_tasks: Celery, inproc_worker: Runtime
) -> None:
    router = inproc_worker.router
    team = router.create_team()
    agent = router.create_agent(team.id, role="Full-Stack Engineer")
    router.track_background(team.id, agent.display_name, job_tasks.signature(FAILING_JOB))
    wait_until(
        lambda: router.background_jobs(team.id)[0].status is JobStatus.FAILED,
        "the failure to be reported",
        timeout=TIMEOUT,
    )
    wait_quiescent(router, team.id, timeout=TIMEOUT)
    (notice,) = _notices(router, team.id, agent.id)
    assert "failed" in notice.content and "ValueError: disk full" in notice.content
    assert check_team(router, team.id, quiescent=True).ok


@pytest.mark.own_database
def test_job_whose_callback_was_lost_is_reported_by_the_poller(
    job_tasks: Celery, inproc_worker: Runtime
) -> None:
    settings = inproc_worker.router.settings.model_copy(update={"sweep_seconds": 0.2})
    router = Router(settings, publisher=CeleryPublisher(job_tasks))
    try:
        team = router.create_team()
        agent = router.create_agent(team.id, role="Full-Stack Engineer")
        job = router.store.start_job(team.id, agent.display_name, name=JOB, task_id="lost-1")
        # Sent as track_background would, but without its link: the callback is "lost".
        job_tasks.signature(JOB, args=(7, 0.0)).apply_async(
            task_id=job.task_id, ignore_result=False
        )
        wait_until(
            lambda: CeleryPublisher(job_tasks).job_outcome(job.task_id) is not None,
            "the job to finish",
            timeout=TIMEOUT,
        )
        assert router.background_jobs(team.id)[0].status is JobStatus.RUNNING
        time.sleep(settings.sweep_seconds)
        report = router.sweep()
        assert (report.jobs_reported, report.taken_over, report.reenqueued) == (1, 0, 0)
        (reported,) = router.background_jobs(team.id)
        assert reported.status is JobStatus.SUCCEEDED and reported.result == "result 7"
        wait_quiescent(router, team.id, timeout=TIMEOUT)
        (notice,) = _notices(router, team.id, agent.id)
        assert notice.dedup_key == f"job:{job.id}"
        # A late callback after the poller reported it changes nothing.
        router.finish_background(job.id, ok=True, result="result 7")
        assert len(_notices(router, team.id, agent.id)) == 1
        assert check_team(router, team.id, quiescent=True).ok
    finally:
        router.close()
