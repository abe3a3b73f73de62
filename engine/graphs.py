"""Decode steps replayed from CUDA graphs: on a GPU a decode step's hundreds of small
launches cost more host time than the GPU spends on them, so each step shape (how many
sequences, how many tokens each, whether every row's logits come back) is captured once
as a CUDA graph over static buffers for its tokens, slots and positions, and replayed for
every later step of that shape.

What a captured step may read: the batch's tensors, never its Python-side sequences (a
replay runs the launches recorded, with whatever slots and positions the buffers hold): the
layers' decode paths index their states through the slot tensor, and graphs are used only
with dense ops that do too (`graph_safe`: kernels.triton_attention's, whose decode attention
takes the sequences' ends as a tensor). The cache's bookkeeping (`KVCache.begin`) runs on
the host before each replay. A step's first occurrence runs eagerly (and compiles its
kernels); the capture follows. A capture that fails (an op that syncs with the host) turns
graphs off for the model, with one log line saying why.

`StepGraphs(..., emulate=True)` replays a step by running it again over its buffers, with
placeholder sequences: how tests on a CPU check that a family's decode step reads only the
batch's tensors."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .batch import Batch, Seq
from .kernels.triton_attention import DECODE_TOKENS

log = logging.getLogger("gguf_serve.engine")


def capturing(t: torch.Tensor) -> bool:
    """Whether a CUDA graph is being captured on the current stream of `t`'s device (a host
    check on a value, a sync, is then not allowed: the ops that make one skip it)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


@dataclass
class _Step:
    """One captured step shape: its input buffers, the batch over them, its graph and logits."""

    batch: Batch
    offsets: torch.Tensor  # per token, its sequence's end less its position
    graph: object = None
    logits: torch.Tensor | None = None

    @classmethod
    def make(cls, n_seqs: int, n: int, device: torch.device) -> "_Step":
        t = n_seqs * n
        zeros = lambda: torch.zeros(t, dtype=torch.long, device=device)  # noqa: E731
        # placeholder sequences: the ops of a graphable step read the tensors, not these
        seqs = tuple(Seq(slot=i, start=i * n, n=n, pos=0) for i in range(n_seqs))
        batch = Batch(zeros(), zeros(), zeros(), seqs, torch.arange(t, device=device), static=True)
        offsets = n - torch.arange(t, device=device) % n
        return cls(batch, offsets)

    def run(self, model, cache) -> torch.Tensor:
        """The step's work over its buffers (what a capture records)."""
        b = self.batch
        b.memo.clear()
        b.memo["ends"] = b.positions + self.offsets
        return model.run(b, cache)

    def load(self, batch: Batch) -> None:
        self.batch.tokens.copy_(batch.tokens)
        self.batch.slots.copy_(batch.slots)
        self.batch.positions.copy_(batch.positions)


class StepGraphs:
    """A model's captured decode steps, by shape (see the module's docstring)."""

    def __init__(self, model, cache, device: torch.device, emulate: bool = False):
        self.model, self.cache, self.device, self.emulate = model, cache, torch.device(device), emulate
        self.steps: dict[tuple[int, int], _Step] = {}
        self.off: str | None = None  # why graphs stopped
        self.replays = 0
        self._pool = None

    @classmethod
    def make(cls, model, cache, device: torch.device, enabled: bool) -> tuple["StepGraphs | None", str]:
        """The graphs for a model loaded on `device`, or None, with the load line's words."""
        if torch.device(device).type != "cuda":
            return None, ""
        if not enabled:
            return None, "CUDA graphs off (the setting)"
        if not getattr(model.ops, "graph_safe", False):
            return None, f"CUDA graphs off: {model.ops.name} ops (triton is not installed?)"
        return cls(model, cache, device), "CUDA graphs for decode steps"

    def key(self, batch: Batch) -> tuple[int, int] | None:
        """The step shape (sequences, tokens each) a batch replays as, or None where it runs eagerly:
        media, adapters, kept hidden states, an encoder's batch, unequal sequences, a subset of rows."""
        if self.off is not None or batch.media is not None or batch.media_spans or batch.lora or batch.keep_hidden \
                or batch.both_ways or batch.mrope is not None:
            return None
        n = batch.seqs[0].n
        if n > DECODE_TOKENS or any(s.n != n for s in batch.seqs) or batch.n_tokens > self.cache.max_batch:
            return None
        if n > 1 and self.cache.has_linear:  # the recurrent layers' tensor-only path takes one token a sequence
            return None
        if batch.rows.numel() != batch.n_tokens:
            return None
        return len(batch.seqs), n

    def forward(self, batch: Batch) -> torch.Tensor | None:
        """The logits of a decode step through its shape's graph (a new shape runs eagerly, then is
        captured); None where the batch is not one (the caller runs it)."""
        key = self.key(batch)
        if key is None:
            return None
        step = self.steps.get(key)
        if step is None:
            logits = self.model.forward(batch, self.cache)
            self._capture(key)
            return logits
        self.cache.begin(batch)
        step.load(batch)
        if self.emulate:
            step.logits = step.run(self.model, self.cache)
        else:
            step.graph.replay()
        self.replays += 1
        return step.logits.clone()

    def _capture(self, key: tuple[int, int]) -> None:
        step = _Step.make(*key, self.device)
        if self.emulate:
            self.steps[key] = step
            return
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                step.logits = step.run(self.model, self.cache)
        except Exception as e:  # an op that syncs with the host, or a launch capture refuses
            self.off = f"{type(e).__name__}: {e}"
            self.steps.clear()
            log.warning("CUDA graphs off for this model: capturing a decode step of %d x %d tokens failed (%s); "
                        "decode steps run eagerly", key[0], key[1], self.off)
            return
        step.graph = graph
        self.steps[key] = step
        log.info("CUDA graph captured for decode steps of %d sequences x %d tokens", *key)
