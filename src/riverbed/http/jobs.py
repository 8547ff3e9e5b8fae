"""Long operations of the admin API as jobs: a thread each, watched over HTTP.

    GET /api/v1/jobs          the jobs of this process, newest first
    GET /api/v1/jobs/{id}     one: {id, kind, target, status, progress, result, error, ...}

A route that starts one (`subscription reset`, `reshard`, `dlq replay`)
checks its input first, so a refused request is a 4xx with nothing changed;
then `Jobs.start` runs the work, which is what the command line runs, on a
thread of its own and answers 202 at once, with `Location: .../jobs/{id}`
(`accepted`). The work reports `progress(done, total)` as it goes; it ends
`succeeded` with its result, or `failed` with the error's message (the
traceback goes to the server's log, never to the client).

Jobs live in the process: a restart forgets them, and one running then stops
where it is (each step of these operations commits in one transaction, so
nothing is half done; run it again). Finished jobs are kept, the last
`KEEP` of them. One job at a time per target: a second one while the first
runs is refused (409).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from riverbed.clock import now_us
from riverbed.errors import NotFound, RiverbedError
from riverbed.http.errors import ApiError
from riverbed.log.jsonlines import format_time

log = logging.getLogger(__name__)

KEEP = 100
"""Finished jobs kept for `GET /jobs` (running ones are always kept)."""

Progress = Callable[[int, int | None], None]
"""`(done, total)`: what the work reports; total None while unknown."""
Work = Callable[[Progress], dict[str, Any]]
"""A job's work: given its progress callback, it returns the job's result."""


class JobStatus(Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(slots=True)
class Job:
    """One job; its fields change under `Jobs`' lock only."""

    id: str
    kind: str
    target: str
    created_us: int
    status: JobStatus = JobStatus.RUNNING
    done: int = 0
    total: int | None = None
    result: dict[str, Any] | None = None
    error: str | None = None
    finished_us: int | None = None

    def view(self) -> dict[str, Any]:
        """The job as the API shows it."""
        return {
            "id": self.id,
            "kind": self.kind,
            "target": self.target,
            "status": self.status.value,
            "progress": {"done": self.done, "total": self.total},
            "result": self.result,
            "error": self.error,
            "created": format_time(self.created_us),
            "finished": None if self.finished_us is None else format_time(self.finished_us),
        }


@dataclass
class Jobs:
    """The jobs of this process (`HttpContext.jobs`)."""

    keep: int = KEEP
    _jobs: dict[str, Job] = field(default_factory=dict)
    """By id, oldest first (insertion order)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, kind: str, target: str, work: Work) -> dict[str, Any]:
        """Run `work` on a thread of its own as job `kind` on `target`; returns
        the job's view. `ApiError(409)` while a job on `target` runs."""
        with self._lock:
            for other in self._jobs.values():
                if other.target == target and other.status is JobStatus.RUNNING:
                    raise ApiError(
                        409,
                        f"job {other.id} ({other.kind}) is still running on {target!r}:"
                        f" wait for it (GET /api/v1/jobs/{other.id})",
                    )
            job = Job(uuid.uuid4().hex, kind, target, now_us())
            self._jobs[job.id] = job
            self._forget_old()
            view = job.view()
        threading.Thread(
            target=self._run, args=(job, work), name=f"riverbed-job-{kind}", daemon=True
        ).start()
        return view

    def _run(self, job: Job, work: Work) -> None:
        def progress(done: int, total: int | None) -> None:
            with self._lock:
                job.done, job.total = done, total

        try:
            result = work(progress)
        except RiverbedError as exc:
            self._finish(job, JobStatus.FAILED, error=str(exc))
        except Exception as exc:  # a bug: its traceback is for the server's log
            log.exception("job %s (%s on %r) failed", job.id, job.kind, job.target)
            self._finish(job, JobStatus.FAILED, error=f"{type(exc).__name__}: {exc}")
        else:
            self._finish(job, JobStatus.SUCCEEDED, result=result)

    def _finish(
        self,
        job: Job,
        status: JobStatus,
        *,
        result: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> None:
        with self._lock:
            job.status, job.result, job.error = status, result, error
            job.finished_us = now_us()
            if status is JobStatus.SUCCEEDED:
                # Done means done: a total never reported is what was done.
                job.done = job.total = job.total if job.total is not None else job.done
            self._forget_old()

    def _forget_old(self) -> None:
        finished = [j.id for j in self._jobs.values() if j.status is not JobStatus.RUNNING]
        for old in finished[: max(0, len(finished) - self.keep)]:
            del self._jobs[old]

    def get(self, job_id: str) -> dict[str, Any]:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise NotFound(
                    f"job {job_id!r} is not known here (jobs are forgotten when the server"
                    f" restarts, and all but the last {self.keep} finished ones before)"
                )
            return job.view()

    def views(self) -> list[dict[str, Any]]:
        """Every job kept, newest first."""
        with self._lock:
            return [job.view() for job in reversed(self._jobs.values())]


def accepted(request: Request, job: dict[str, Any]) -> JSONResponse:
    """202 with the job, and `Location` where to follow it."""
    where = request.url_for("get_job", job_id=job["id"]).path
    return JSONResponse(job, status_code=202, headers={"Location": where})


JOB_RESPONSES: dict[int | str, dict[str, Any]] = {
    202: {"description": "started: the job, followed at the `Location` header's URL"},
    409: {"description": "a job on this subscription is still running"},
}


class HasJobs(Protocol):
    """What the job routes need of the app's context (`http.context.HttpContext`,
    which holds the `Jobs`: this module stays below it)."""

    @property
    def jobs(self) -> Jobs: ...


def routes(context: HasJobs) -> APIRouter:
    """The job routes over `context.jobs` (the module docstring)."""
    jobs = context.jobs
    api = APIRouter()

    @api.get("/jobs", tags=["jobs"])
    def list_jobs() -> list[dict[str, Any]]:
        """The jobs of this process (running, and the last finished ones), newest first."""
        return jobs.views()

    @api.get("/jobs/{job_id}", tags=["jobs"], name="get_job", responses={404: {}})
    def get_job(job_id: str) -> dict[str, Any]:
        """One job: status, progress {done, total}, and its result or error."""
        return jobs.get(job_id)

    return api
