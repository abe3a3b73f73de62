"""Idle unloading on a test clock: the server's residency (server.models.residency) over a
catalog of two real tiny models, loaded by the engine, with a clock the test steps, so
keep_alive and --idle-unload are checked at the seconds they name, without waiting."""

from __future__ import annotations

import pytest

from gguf_serve.server.models.catalog import Catalog
from gguf_serve.server.models.residency import Residency
from gguf_serve.server.settings import ServerSettings
from server_harness import THINKING_TEMPLATE
from tiny_models import tiny_chat_model


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("idle")
    tiny_chat_model(d, "a.gguf", 5, THINKING_TEMPLATE, think=True)
    tiny_chat_model(d, "b.gguf", 7, THINKING_TEMPLATE, think=True)
    return d


@pytest.fixture
def residency(folder):
    settings = ServerSettings(models=[str(folder)], idle_unload=60, ctx_size=128, parallel=1)
    catalog = Catalog(settings)
    catalog.add(str(folder))
    res = Residency(catalog, settings, clock=Clock())
    yield res
    for entry in list(res.entries.values()):
        if entry.lm is not None:
            res.unload(entry)


def use(res: Residency, name: str, keep_alive=None, seconds: float = 0.0):
    """A request for `name` that holds it `seconds` of the test clock."""
    entry = res.entries[name]
    res.acquire(entry, keep_alive)
    res.clock.now += seconds
    res.release(entry)
    return entry


def loaded(res: Residency) -> set[str]:
    return {name for name, e in res.entries.items() if e.lm is not None}


def test_idle_unload_counts_from_the_last_request(residency):
    clock = residency.clock
    use(residency, "a.gguf", seconds=5)
    assert residency.unload_idle() == pytest.approx(5.0)  # the reaper's next look, at most 5 s away
    clock.now += 59.9
    residency.unload_idle()
    assert loaded(residency) == {"a.gguf"}  # 59.9 s idle of --idle-unload's 60
    use(residency, "a.gguf")  # a request starts the count again
    clock.now += 59.9
    residency.unload_idle()
    assert loaded(residency) == {"a.gguf"}
    clock.now += 0.2
    residency.unload_idle()
    assert loaded(residency) == set()


def test_keep_alive_overrides_idle_unload_until_the_next_request(residency):
    clock = residency.clock
    use(residency, "a.gguf", keep_alive=3600)  # Ollama's "1h"
    use(residency, "b.gguf", keep_alive=-1)  # for ever
    clock.now += 3599
    residency.unload_idle()
    assert loaded(residency) == {"a.gguf", "b.gguf"}
    clock.now += 2
    residency.unload_idle()
    assert loaded(residency) == {"b.gguf"}
    clock.now += 10 ** 6
    residency.unload_idle()
    assert loaded(residency) == {"b.gguf"}
    use(residency, "b.gguf")  # no keep_alive: --idle-unload's 60 s again
    clock.now += 61
    residency.unload_idle()
    assert loaded(residency) == set()


def test_keep_alive_zero_unloads_at_once_and_a_held_model_stays(residency):
    entry = use(residency, "a.gguf", keep_alive=0)
    residency.unload_idle()
    assert entry.lm is None
    residency.acquire(entry, 0)  # held by a request: not idle, whatever the clock says
    residency.clock.now += 10 ** 6
    residency.unload_idle()
    assert entry.lm is not None
    residency.release(entry)
    residency.unload_idle()
    assert entry.lm is None
