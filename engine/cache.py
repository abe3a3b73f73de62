"""The KV cache for generation: transformers' DynamicCache, with each full-attention
layer appending into a buffer with spare room instead of `torch.cat`-ing the whole
cache every step (a copy of all cached keys and values per layer per token: on a
4B-shaped model ~11 ms per token at 50 tokens of context, and growing with it)."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # positions allocated at first; the buffer doubles when full


class AppendLayer(DynamicLayer):
    """A DynamicLayer whose `keys` / `values` are views of the first `length` positions
    of larger buffers; an update writes only the new positions."""

    _kbuf: torch.Tensor | None = None
    _vbuf: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        old = self.get_seq_length()
        new = old + key_states.shape[-2]
        if self._kbuf is None or new > self._kbuf.shape[-2]:
            self._grow(key_states, value_states, old, new)
        self._kbuf[..., old:new, :].copy_(key_states)
        self._vbuf[..., old:new, :].copy_(value_states)
        self.keys = self._kbuf[..., :new, :]
        self.values = self._vbuf[..., :new, :]
        return self.keys, self.values

    def _grow(self, key_states, value_states, old: int, new: int) -> None:
        capacity = max(MIN_CAPACITY, 2 * new)
        bufs = []
        for cur, states in ((self.keys, key_states), (self.values, value_states)):
            buf = states.new_empty(*states.shape[:-2], capacity, states.shape[-1])
            if old:
                buf[..., :old, :].copy_(cur)
            bufs.append(buf)
        self._kbuf, self._vbuf = bufs

    # the operations below replace keys / values with new tensors: start a new buffer
    def reset(self) -> None:
        self._kbuf = self._vbuf = None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        super().crop(tokens_to_remove)
        self._kbuf = self._vbuf = None

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._kbuf = self._vbuf = None

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._kbuf = self._vbuf = None


def new_cache(config) -> DynamicCache:
    """A DynamicCache for `config` whose plain full-attention layers append in place
    (sliding-window, linear-attention and other layer kinds stay transformers' own)."""
    cache = DynamicCache(config=config)
    cache.layers = [AppendLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
