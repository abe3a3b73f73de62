"""LoRA adapters loaded and unloaded at run time (vLLM's POST /v1/load_lora_adapter and
/v1/unload_lora_adapter, with --lora-runtime): an adapter file is read and checked
against its model on the model's worker between two steps, then served as the model its
`lora_name` names (listed in /v1/models); unloading waits for no request, it refuses
while one uses it (409). Ids are never given twice: a cache that holds rows computed
under an unloaded adapter is never matched again."""

from __future__ import annotations

import os

from ...engine import AdapterError
from ..core.errors import BadRequest, Conflict, not_supported
from ..models.catalog import Catalog
from ..models.residency import Residency
from .protocol import LoadLoraAdapter, UnloadLoraAdapter


def _uses(sched, adapter_id: int) -> bool:
    reqs = [r.req for r in sched.running] + list(sched.waiting)
    return any(adapter_id == i for req in reqs for i, _ in req.lora)


class RuntimeAdapters:
    def __init__(self, catalog: Catalog, residency: Residency):
        self.catalog, self.residency = catalog, residency

    def _enabled(self) -> None:
        if not self.catalog.settings.lora_runtime:
            raise not_supported("loading LoRA adapters at run time is off: start the server with --lora-runtime")

    async def load(self, req: LoadLoraAdapter) -> str:
        self._enabled()
        name, path = req.lora_name.strip(), req.lora_path
        taken = self.catalog.adapter_names.keys() | self.catalog.entries.keys() | self.catalog.aliases.keys()
        if not name or name in taken:
            raise BadRequest(f"lora_name {name!r} is {'taken' if name else 'empty'}: give a name no model or "
                             "adapter has", param="lora_name")
        if not os.path.isfile(path):
            raise BadRequest(f"no such LoRA adapter file: {path}", param="lora_path")
        async with self.residency.holding(req.model) as entry:
            if entry.worker.scheduler is None:
                raise BadRequest(f"{entry.id} is an embedding model: it takes no adapters", param="model")
            adapter_id = self.catalog.add_adapter(entry, path)  # its id taken now: loads may run side by side
            try:
                adapter = await entry.worker.between_steps(lambda s: s.lm.load_adapter(path, adapter_id))
            except AdapterError as e:
                entry.adapters[adapter_id] = None
                raise BadRequest(str(e), param="lora_path") from None
            except BaseException:
                entry.adapters[adapter_id] = None
                raise
            self.catalog.name_adapter(entry, name, adapter_id)
            self.residency.resized(entry, adapter.nbytes)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, req: UnloadLoraAdapter) -> str:
        self._enabled()
        name = req.lora_name.strip()
        if name not in self.catalog.adapter_names:
            raise BadRequest(f"no LoRA adapter named {name!r} (GET /v1/models)", param="lora_name")
        model_id, adapter_id = self.catalog.adapter_names[name]
        entry = self.catalog.entries[model_id]
        if entry.worker is not None and entry.worker.scheduler is not None:
            def drop(sched) -> int:
                if _uses(sched, adapter_id):
                    raise Conflict(f"LoRA adapter {name!r} is in use by a request; try again once it has ended")
                adapter = sched.lm.adapters.get(adapter_id)
                sched.lm.unload_adapter(adapter_id)
                return adapter.nbytes if adapter is not None else 0
            self.residency.resized(entry, -await entry.worker.between_steps(drop))
        self.catalog.remove_adapter(name)
        return f"Success: LoRA adapter '{name}' removed successfully."
