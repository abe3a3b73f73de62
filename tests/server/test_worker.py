"""The generation worker of one model, on the tiny model: stopping it never blocks (the
event loop calls it at shutdown), even with its queue full; what runs finishes, what
waits in the queue is refused with a retry."""

from __future__ import annotations

import asyncio
import time

from gguf_serve.engine import load_model
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.server.core.errors import Overloaded
from gguf_serve.server.models.worker import Job, Worker


def test_stop_with_a_full_queue_returns_at_once(tiny_path):
    lm = load_model(tiny_path, n_seq=1)
    worker = Worker("tiny", lm, max_queue=1)

    async def scenario():
        loop = asyncio.get_running_loop()
        params = lambda: [SamplingParams(temperature=0, max_tokens=150, ignore_eos=True)]
        running = Job([1, 2, 3], params(), loop, asyncio.Queue())
        worker.submit(running)
        while not worker.scheduler.busy:  # admitted: its one slot is taken
            await asyncio.sleep(0.01)
        queued = Job([4, 5, 6], params(), loop, asyncio.Queue())
        worker.submit(queued)  # the queue (of one) is now full
        t = time.perf_counter()
        worker.stop()
        assert time.perf_counter() - t < 0.05
        steps = []
        while (item := await asyncio.wait_for(running.out.get(), 60)) is not None:
            steps.append(item)
        assert len(steps) == 150 and steps[-1].finish_reason == "length"  # what ran, finished
        refused = await asyncio.wait_for(queued.out.get(), 60)
        assert isinstance(refused, Overloaded)  # what waited: retry shortly
        worker.thread.join(10)
        assert not worker.thread.is_alive()

    asyncio.run(scenario())
