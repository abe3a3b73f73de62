"""What the scheduler tests share: random prompts, greedy sampling, and a sequence's
tokens generated alone (generate(), its own scheduler) to hold a batched one to."""

from __future__ import annotations

import torch

from gguf_serve.engine.sampling import SamplingParams


def prompts(*lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 200, (n,), generator=g).tolist() for n in lengths]


def greedy(n, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


def alone(lm, prompt, params):
    return [s.token_id for s in lm.generate(prompt, params) if s.token_id is not None]
