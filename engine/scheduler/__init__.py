"""Continuous batching: one scheduler per loaded model runs every admitted request's
sequences through one batch forward per step.

A step holds the next token of every decoding sequence plus chunks of the prompts
being prefilled (at most `prefill_chunk` prompt tokens while others decode, so a long
prompt never stalls the running streams for its whole prefill; the whole `max_batch`
when nothing decodes). After the forward, each sequence that got logits samples its
next token (bias, penalties, its logits processor, then the sampler) and applies its
stopping rules; finished or cancelled sequences leave between steps and new requests
join. `generate()` is this scheduler with one request.

Sequences live in the KV cache's slots. A request with `n` choices takes `n` slots:
the prompt is prefilled once in the first, copied into the others, and the choices
decode side by side.

- loop: the Scheduler, its step as phases (admit, build the batch, forward, sample,
  emit, draft, retire), and `run_one`;
- state: Request, the running request, the per-choice sampling and stopping, the rows;
- prefix: which slot a prompt starts in and what the slots hold (reuse, LRU, checkpoints);
- speculation: the drafts fed, their verification, the MTP and draft-model passes;
- media: image chunking and encoding, the batch's image arguments;
- slots: the slots as llama-server's /slots lists, saves and restores them."""

from . import slots
from .loop import PREFILL_CHUNK, Scheduler, run_one
from .prefix import CHECKPOINT_BEFORE_END, CHECKPOINT_EVERY
from .speculation import check_speculative
from .state import Request

__all__ = ["CHECKPOINT_BEFORE_END", "CHECKPOINT_EVERY", "PREFILL_CHUNK", "Request", "Scheduler",
           "check_speculative", "run_one", "slots"]
