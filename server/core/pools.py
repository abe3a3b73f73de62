"""Bounded pools for the blocking work a request needs (tokenizing, decoding images and audio,
loading models), one per kind, instead of asyncio's shared default executor: a kind of
work that stalls (a slow tokenizer call, a large image, a load) fills its own pool, not
the others'. Each pool has a few threads, room for a bounded number of waiting items
(past it: a 503 at once) and a deadline per item (past it: the caller gets a 503; a
thread cannot be stopped, so its work goes on and the pool counts it as overdue, which
/health reports). An item whose caller goes away before it starts never runs."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from .errors import Unavailable


class _Item:
    __slots__ = ("call", "started")

    def __init__(self, call):
        self.call, self.started = call, None


class Pool:
    """`workers` threads for one kind of work (`what`, as errors name it), `waiting` more
    items queued at most, each answered within `deadline` seconds (None: the work keeps
    its own deadline, as a model's load does with --load-wait)."""

    def __init__(self, name: str, workers: int, waiting: int, deadline: float | None, what: str):
        self.name, self.workers, self.room, self.deadline, self.what = name, workers, waiting, deadline, what
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"{name}-pool")
        self._lock = threading.Lock()
        self._items: set[_Item] = set()  # submitted, not finished (waiting, or running since `started`)

    async def run(self, fn, *args, **kwargs):
        """`fn(*args, **kwargs)` on one of the pool's threads, within the deadline."""
        item = _Item(lambda: fn(*args, **kwargs))
        with self._lock:
            if len(self._items) >= self.workers + self.room:
                raise Unavailable(f"the server's {self.what} workers are all busy ({self.workers} running, "
                                  f"{self.room} waiting); retry shortly", headers={"Retry-After": "1"})
            self._items.add(item)
        future = self._executor.submit(self._work, item)
        future.add_done_callback(lambda _: self._done(item))
        try:  # cancelled (a deadline, a caller gone): an item not yet started never runs
            return await asyncio.wait_for(asyncio.wrap_future(future), self.deadline)  # (None: no deadline)
        except TimeoutError:
            raise Unavailable(f"{self.what} took more than {self.deadline:g} s; retry shortly",
                              headers={"Retry-After": "5"}) from None

    def _work(self, item: _Item):
        item.started = time.monotonic()
        return item.call()

    def _done(self, item: _Item) -> None:
        with self._lock:
            self._items.discard(item)

    def state(self) -> dict:
        """Its load, as /health reports it: items running and waiting, those running past the
        deadline (`overdue`: a thread held by work that cannot be stopped), and whether new
        work is refused (`full`)."""
        now = time.monotonic()
        with self._lock:
            started = [i.started for i in self._items if i.started is not None]
            pending = len(self._items)
        return {"running": len(started), "waiting": pending - len(started),
                "overdue": sum(1 for t in started if self.deadline is not None and now - t > self.deadline),
                "full": pending >= self.workers + self.room}

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def loads_pool() -> Pool:
    """The threads requests wait on for their model's load (or for room), each until
    --load-wait: the load keeps its own deadline."""
    return Pool("loads", 8, 64, None, "model loading")


class Pools:
    """The server's pools, sized for the machine: tokenizing (and grammars, measuring), image
    and audio decoding, and model loads (a request waiting for its model's load, or for room, holds a
    thread of this pool until --load-wait)."""

    def __init__(self):
        cpus = os.cpu_count() or 2
        self.prompts = Pool("prompts", max(2, cpus), 64, 60.0, "tokenizing")
        self.images = Pool("images", max(2, min(4, cpus)), 32, 60.0, "image and audio decoding")
        self.loads = loads_pool()

    def all(self) -> tuple[Pool, ...]:
        return self.prompts, self.images, self.loads

    def trouble(self) -> dict:
        """The pools that refuse work or hold overdue work, with their state (none: all well)."""
        return {p.name: st for p in self.all() if (st := p.state())["full"] or st["overdue"]}

    async def aclose(self) -> None:
        for p in self.all():
            p.close()
