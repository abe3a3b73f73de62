"""Chat templates rendered where a bad one cannot hold the server: in worker processes
(engine/template_worker.py, transformers' own renderer), each render within a time
limit and a memory limit. A render past its time is ended by killing its worker (a
thread cannot be stopped; a process can), and so is one whose caller went away; a new
worker takes its place on the next render. The workers are few (`size`), shared by
every model, and a render waits for a free one within the same time limit; one
template (one model's) holds at most size - 1 of them, so that a template that loops
never stops the other models' renders.

For asyncio callers (the server); a library caller renders in its own process with
engine.chat.render."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time

from .errors import TemplateError

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "template_worker.py")
START_TIMEOUT = 30.0  # seconds for a new worker to import its renderer
MEMORY = 1 << 30  # bytes of address space a worker may add to what it holds at start
RESERVED = ("conversations", "chat_template", "return_assistant_tokens_mask")  # the renderer's own arguments


class TemplateWorkers:
    """`size` worker processes that render chat templates, each render (with its wait for a
    worker) within `timeout` seconds."""

    def __init__(self, size: int = 2, timeout: float = 10.0, memory: int = MEMORY):
        self.size, self.timeout, self.memory = size, timeout, memory
        self._slots: asyncio.Queue | None = None  # a live worker, or None where one is to be started
        self._loop = None
        self._procs: set[asyncio.subprocess.Process] = set()
        self._reaping: set[asyncio.Task] = set()
        self._lines: dict[int, asyncio.Semaphore] = {}  # per template: at most size - 1 of the workers
        self._waits: dict[object, float] = {}  # the renders waiting for a worker, since when (monotonic)
        self.busy = 0  # renders running
        self.closing = False

    def _queue(self) -> asyncio.Queue:
        loop = asyncio.get_running_loop()
        if self._slots is None or self._loop is not loop:  # made in the running loop, on first use
            self.close(stopping=False)  # an earlier loop's workers (a caller's asyncio.run) are out of reach
            self._slots, self._loop, self._lines = asyncio.Queue(), loop, {}
            for _ in range(self.size):
                self._slots.put_nowait(None)
        return self._slots

    async def render(self, template: str, messages: list[dict], *, special_tokens: dict, max_chars: int,
                     **kwargs) -> str:
        """The prompt `template` renders for `messages` (kwargs: the template's variables,
        `tools`, `add_generation_prompt` (default True), `continue_final_message`), at most
        `max_chars` long. TemplateError with its kind when it cannot be had."""
        bad = [k for k in RESERVED if k in kwargs]
        if bad:
            raise TemplateError(f"the template's variables may not include {', '.join(bad)}")
        cfm = bool(kwargs.pop("continue_final_message", False))
        request = {"template": template, "messages": messages, "tools": kwargs.pop("tools", None),
                   "documents": kwargs.pop("documents", None),
                   "add_generation_prompt": bool(kwargs.pop("add_generation_prompt", True)) and not cfm,
                   "continue_final_message": cfm, "kwargs": {**special_tokens, **kwargs}, "max_chars": max_chars,
                   "memory_mib": self.memory >> 20}
        try:
            payload = json.dumps(request, ensure_ascii=False).encode() + b"\n"
        except (TypeError, ValueError) as e:
            raise TemplateError(f"the template's variables must be JSON values: {e}") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        slots = self._queue()
        line = self._lines.setdefault(hash(template), asyncio.Semaphore(max(1, self.size - 1)))
        token = object()
        self._waits[token] = time.monotonic()
        acquired = False
        try:  # one template (one model) never takes every worker: the others' renders go on beside it
            await asyncio.wait_for(line.acquire(), self.timeout)
            acquired = True
            proc = await asyncio.wait_for(slots.get(), max(0.0, deadline - loop.time()))
        except BaseException as e:
            if acquired:
                line.release()
            if isinstance(e, TimeoutError):
                raise TemplateError(f"no chat-template worker was free for this model within {self.timeout:g} s "
                                    f"({self.size} in all, busy)", "busy") from None
            raise
        finally:
            self._waits.pop(token, None)
        try:
            return await self._render(proc, payload, deadline, slots)
        finally:
            line.release()

    def state(self) -> dict:
        """Its load, as /health reports it (`full`: a render has waited more than a second for a worker)."""
        now = time.monotonic()
        return {"running": self.busy, "waiting": len(self._waits), "overdue": 0,
                "full": any(now - t > 1.0 for t in self._waits.values())}

    async def _render(self, proc, payload: bytes, deadline: float, slots: asyncio.Queue) -> str:
        loop = asyncio.get_running_loop()
        self.busy += 1
        done = False
        try:
            if proc is None or proc.returncode is not None:
                proc = await asyncio.wait_for(self._start(), max(0.0, deadline - loop.time()) + START_TIMEOUT)
            proc.stdin.write(payload)
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), max(0.0, deadline - loop.time()))
            if not line:
                if self.closing:
                    raise TemplateError("the server is stopping", "busy")
                raise TemplateError("the chat-template worker ended while rendering", "memory")
            reply = json.loads(line)
            done = True
        except TimeoutError:
            raise TemplateError(f"the chat template ran past its {self.timeout:g} s limit on these messages "
                                f"(--template-timeout)", "timeout") from None
        except (OSError, ValueError) as e:  # a worker that died (a broken pipe) or answered nonsense
            raise TemplateError(f"the chat-template worker failed: {type(e).__name__}", "memory") from None
        finally:
            self.busy -= 1
            if not done:  # past its time, its caller gone, or broken: it goes, a new one comes on demand
                self._kill(proc)
                proc = None
            slots.put_nowait(proc)
        if "error" in reply:
            raise TemplateError(reply["error"], reply["kind"])
        return reply["text"]

    async def _start(self) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, WORKER, str(self.memory), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, limit=1 << 30)
        self._procs.add(proc)
        line = await proc.stdout.readline()
        if not line.startswith(b'{"ready"'):
            self._kill(proc)
            raise TemplateError("a chat-template worker did not start", "busy")
        return proc

    def _kill(self, proc) -> None:
        if proc is None:
            return
        _end(proc)
        task = asyncio.ensure_future(proc.wait())  # reaped in the background
        self._reaping.add(task)
        task.add_done_callback(self._reaping.discard)
        self._procs.discard(proc)

    def close(self, stopping: bool = True) -> None:
        """End every worker now (from any thread, or with their loop gone); renders running
        end with a 'stopping' error."""
        self.closing = stopping
        for proc in list(self._procs):
            _end(proc)
        self._procs.clear()

    async def aclose(self) -> None:
        """End every worker and wait until each has exited (in the loop that started them)."""
        procs = list(self._procs)
        self.close()
        for proc in procs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(proc.wait(), 5)


def _end(proc) -> None:
    """Kill a worker by its pid (its transport may belong to a loop already closed)."""
    if proc.returncode is None:
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
