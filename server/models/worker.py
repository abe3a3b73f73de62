"""One generation worker per loaded model: a thread running the model's scheduler
(engine.scheduler), never the event loop. Requests (`Job`) wait in a bounded queue
(429 beyond it) and join the running batch in arrival order; their Steps come back to
the event loop through each job's queue, at most MAX_UNREAD of them unread."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from ...engine import Request, SamplingParams, Scheduler, embed, embed_tokens, rank
from ..core.errors import Overloaded
from ..core.metrics import BLOCK_SIZE

log = logging.getLogger("gguf_serve.server")

# steps a reply's reader may leave unread before its generation is cancelled: a streamed reply
# whose client stops reading (its socket full) is not generated on into memory
MAX_UNREAD = 1024


@dataclass(eq=False)
class Job:
    """A request on its way to the model's scheduler: its Steps (then None, or an
    Exception) come back into `out` on the event loop."""

    prompt_ids: list[int]
    params: list[SamplingParams]  # one per choice
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue
    cancel: threading.Event = field(default_factory=threading.Event)
    done_callbacks: list = field(default_factory=list)  # called on the worker's thread once it has ended
    media: dict = field(default_factory=dict)  # the prompt's media by content key (engine.media.PromptMedia)
    progress: bool = False  # the prompt's processing reported as it goes (llama-server's return_progress)
    lora: tuple = ()  # ((adapter id, scale), ...) it runs with (engine.lora)

    def emit(self, item) -> None:
        if self.out.qsize() >= MAX_UNREAD and not self.cancel.is_set():  # (a racy read: a bound, not a count)
            log.warning("a client stopped reading its reply (%d steps unread): its generation is cancelled",
                        MAX_UNREAD)
            self.cancel.set()
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)
        if item is None or isinstance(item, Exception):
            for f in self.done_callbacks:
                f()

    def request(self) -> Request:
        return Request(self.prompt_ids, self.params, self.emit, self.cancel, media=self.media, progress=self.progress,
                       lora=self.lora)


WAKE = object()  # put on a worker's queue to have it look at its controls


def settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result=None,
           error: BaseException | None = None) -> None:
    """From the worker's thread: `future`'s result (or `error`) set on its event loop."""
    def done():
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)
    loop.call_soon_threadsafe(done)


@dataclass(eq=False)
class Control:
    """A call to run on a worker's thread between two steps (a slot action): `fn(scheduler)`'s
    result, or its exception, is set on `future` on the event loop."""

    fn: Callable
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future

    def settle(self, result=None, error: BaseException | None = None) -> None:
        settle(self.loop, self.future, result, error)


class _Queued:
    """A model's bounded request queue (429 beyond it), its requests not yet ended
    (`live`), and the stop that ends its thread."""

    jobs: queue.Queue
    live: set
    stopping: threading.Event

    def _enqueue(self, job) -> None:
        self.live.add(job)
        job.done_callbacks.append(lambda: self.live.discard(job))
        try:
            self.jobs.put_nowait(job)
        except queue.Full:
            self.live.discard(job)
            raise Overloaded("the model's request queue is full; retry shortly",
                             headers={"Retry-After": "1"}) from None

    def stop(self) -> None:
        """Finish what runs (and, for a scheduler, what waits in it), then end the thread;
        what is still queued is refused (retry). Never blocks: the caller may be the event loop."""
        self.stopping.set()
        try:
            self.jobs.put_nowait(None)  # wakes a worker waiting for work (its queue is then empty)
        except queue.Full:
            pass  # a full queue means the worker is busy: it sees `stopping` at its next step


class Worker(_Queued):
    """One thread per loaded model, running its scheduler (engine.scheduler): requests
    wait in a bounded queue (429 beyond it) and join the running batch, first come first
    served, as sequence slots free up; each step is one forward over all of them."""

    def __init__(self, name: str, lm, max_queue: int, metrics=None):
        self.name = name
        self.metrics = metrics
        self.lm = lm
        self.scheduler = Scheduler(lm)
        self.jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._hits = 0
        self._checkpoint_hits = 0
        self._disk_seen = {"written": 0, "hits": 0, "dropped": 0}
        self._drafted = self._accepted = 0
        self._lora_seen: tuple[str, str, str] | None = None
        self.live: set[Job] = set()  # submitted and not finished
        self.controls: queue.SimpleQueue[Control] = queue.SimpleQueue()
        self._gauge_lock = threading.Lock()
        if metrics:  # the cache's layout in vLLM's blocks, for routers that read it (vllm:cache_config_info)
            cells = self.scheduler.cells_in_use()[1]
            metrics.vllm_cache_config.labels(name, str(BLOCK_SIZE), str(cells // BLOCK_SIZE)).set(1)
            metrics.vllm_kv_usage.labels(name).set(0)
            metrics.kv_usage.labels(name).set(0)
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"gen-{name}", daemon=True)
        self.thread.start()

    def cancel_all(self) -> None:
        """Cancel every request queued or running (shutdown): each leaves at the next step,
        its stream closed with a finish reason. Callable from any thread."""
        for job in list(self.live):
            job.cancel.set()

    def submit(self, job: Job) -> None:
        self._enqueue(job)
        self._set_queue_depth()

    async def between_steps(self, fn: Callable):
        """`fn(scheduler)` run on the worker's thread between two steps; its result."""
        if self.stopping.is_set():
            raise Overloaded("the model is being unloaded; retry shortly", headers={"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        control = Control(fn, loop, loop.create_future())
        self.controls.put(control)
        try:
            self.jobs.put_nowait(WAKE)  # a worker waiting for work looks at once
        except queue.Full:
            pass  # a full queue: the worker is busy and looks at its next step
        return await control.future

    def _run_controls(self, error: BaseException | None = None) -> None:
        while True:
            try:
                c = self.controls.get_nowait()
            except queue.Empty:
                return
            if error is not None:
                c.settle(error=error)
                continue
            try:
                c.settle(c.fn(self.scheduler))
            except Exception as e:  # this call's own failure
                c.settle(error=e)

    def _set_queue_depth(self) -> None:
        """The queue-depth gauge from the state now, set under a lock: from the submitting
        thread and the worker's, the last value set is the last one computed (a submission's
        count could otherwise land after the worker's, the job long done)."""
        if self.metrics:
            with self._gauge_lock:
                waiting = self.jobs.qsize() + len(self.scheduler.waiting)
                self.metrics.queue_depth.labels(self.name).set(waiting)
                self.metrics.vllm_waiting.labels(self.name).set(waiting)

    def _take(self) -> bool:
        """Move queued jobs into the scheduler while it has slots for them (waiting for
        one when it has nothing to do); False once told to stop."""
        s = self.scheduler
        block = not s.busy
        while s.has_room():
            if self.stopping.is_set():
                return False
            try:
                job = self.jobs.get(block=block)
            except queue.Empty:
                return True
            block = False
            if job is WAKE:
                continue
            if job is None:
                return False
            try:
                s.add(job.request())
            except Exception as e:  # refused by the scheduler (the service checks first): this job only
                job.emit(e)
        return True

    def _run(self) -> None:
        s = self.scheduler
        going = True
        while going or s.busy:
            self._run_controls()
            if going:
                going = self._take()
            try:
                n = s.step()
            except Exception:  # the requests in that step got the error; the others go on
                log.exception("generation step failed")
                n = 0
            self._observe(n)
        s.close()
        self._run_controls(Overloaded("the model was unloaded; retry shortly", headers={"Retry-After": "1"}))
        while True:  # queued behind the stop: the model is gone, the client may retry
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                self._set_queue_depth()  # 0: the last step's count may have held the stop's own None
                return
            if job is not None and job is not WAKE:
                job.emit(Overloaded("the model was unloaded; retry shortly", headers={"Retry-After": "1"}))

    def _lora_info(self, m, s) -> None:
        """vllm:lora_requests_info: the adapters of the running and the waiting requests
        (by id), one series set to now whenever they change (as vLLM's, which routers read
        for adapter affinity)."""
        info = (str(len(self.lm.adapters)), _adapters(r.req for r in s.running),
                _adapters(s.waiting))
        if info != self._lora_seen:
            if self._lora_seen is not None:
                m.vllm_lora.remove(*self._lora_seen)
            m.vllm_lora.labels(*info).set(time.time())
            self._lora_seen = info

    def _observe(self, n_tokens: int) -> None:
        m, s = self.metrics, self.scheduler
        if not m:
            return
        self._set_queue_depth()
        m.running.labels(self.name).set(len(s.running))
        m.vllm_running.labels(self.name).set(len(s.running))
        m.sequences_running.labels(self.name).set(s.n_running)
        used, cells = s.cells_in_use()
        m.kv_usage.labels(self.name).set(used / cells)
        m.vllm_kv_usage.labels(self.name).set(used / cells)
        self._lora_info(m, s)
        if n_tokens:
            m.batch_tokens.labels(self.name).observe(n_tokens)
        if s.prefix_hit_tokens != self._hits:
            m.prefix_hit_tokens.labels(self.name).inc(s.prefix_hit_tokens - self._hits)
            self._hits = s.prefix_hit_tokens
        if s.drafted_tokens != self._drafted:
            m.drafted.labels(self.name).inc(s.drafted_tokens - self._drafted)
            m.accepted.labels(self.name).inc(s.accepted_tokens - self._accepted)
            self._drafted, self._accepted = s.drafted_tokens, s.accepted_tokens
        ck = s.cache.checkpoint_stats
        m.checkpoints.labels(self.name).set(ck.held)
        m.checkpoint_bytes.labels(self.name).set(ck.bytes)
        if ck.hits != self._checkpoint_hits:
            m.checkpoint_hits.labels(self.name).inc(ck.hits - self._checkpoint_hits)
            self._checkpoint_hits = ck.hits
        for state, count in s.slots().items():
            m.kv_slots.labels(self.name, state).set(count)
        disk = s.prefix.disk
        if disk is not None:
            for event, seen in self._disk_seen.items():
                now = getattr(disk.stats, event)
                if now != seen:
                    m.prompt_disk.labels(self.name, event).inc(now - seen)
                    self._disk_seen[event] = now
            m.prompt_disk_bytes.labels(self.name).set(disk.nbytes)


def _adapters(requests) -> str:
    return ",".join(sorted({str(a) for r in requests for a, _ in r.lora}))


@dataclass(eq=False)
class EmbedJob:
    """Token id lists to embed ("embed"), score ("rank") or give every token's vector of
    ("tokens") on an embedding model's worker; the result (a float32 tensor, a list of them
    for "tokens") or the exception is set on `future` on the event loop."""

    kind: str
    inputs: list[list[int]]
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    done_callbacks: list = field(default_factory=list)

    def finish(self, result=None, error: Exception | None = None) -> None:
        settle(self.loop, self.future, result, error)
        for f in self.done_callbacks:
            f()


class EmbedWorker(_Queued):
    """An embedding or reranking model's thread: requests wait in a bounded queue (429
    beyond it) and run one after another, each one's inputs several to a forward
    (engine.embed). The same face as Worker to the residency."""

    def __init__(self, name: str, lm, max_queue: int, metrics=None):
        self.name, self.lm, self.metrics = name, lm, metrics
        self.scheduler = None
        self.jobs: queue.Queue[EmbedJob | None] = queue.Queue(maxsize=max_queue)
        self.live: set[EmbedJob] = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"embed-{name}", daemon=True)
        self.thread.start()

    def submit(self, job: EmbedJob) -> None:
        self._enqueue(job)

    def cancel_all(self) -> None:
        pass  # each request is one forward or a few: they finish

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            try:
                run = {"embed": embed, "rank": rank, "tokens": embed_tokens}[job.kind]
                job.finish(run(self.lm, job.inputs))
            except Exception as e:  # this request only
                if not isinstance(e, ValueError):
                    log.exception("embedding failed")
                job.finish(error=e)
            if self.metrics:
                self.metrics.prompt_tokens.labels(self.name).inc(sum(len(x) for x in job.inputs))


def worker_for(name: str, lm, max_queue: int, metrics=None):
    """The worker a loaded model gets: a generation scheduler, or for an embedding or
    reranking file, an EmbedWorker."""
    return (EmbedWorker if lm.pooling is not None else Worker)(name, lm, max_queue, metrics)
