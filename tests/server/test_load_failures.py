"""A model load's failure keeps its cause: a file's own fault (corrupt, unsupported) is
kept on its entry and answered 500 from then on; one that may pass (the file gone for
a moment, memory) is a 503 naming it, with Retry-After, and the next request loads
again. Real files, a real catalog and residency, and one server over HTTP."""

from __future__ import annotations

import json
import os
import shutil

import httpx
import pytest

from gguf_serve.engine import FileError, WeightError, is_file_error, is_transient
from gguf_serve.gguf_io import GGUFError
from gguf_serve.server.core.errors import ModelLoadFailed, Unavailable
from gguf_serve.server.models.catalog import Catalog
from gguf_serve.server.models.residency import Residency
from gguf_serve.server.settings import ServerSettings
from helpers import write_small_model
from server_harness import THINKING_TEMPLATE, server
from tiny_models import tiny_chat_model


def two_models(tmp_path):
    """A folder of two tiny models, and a good copy of a.gguf kept aside."""
    d = tmp_path / "models"
    d.mkdir()
    tiny_chat_model(d, "a.gguf", 5, THINKING_TEMPLATE)
    tiny_chat_model(d, "b.gguf", 7, THINKING_TEMPLATE)
    keep = tmp_path / "a.keep"
    shutil.copy(d / "a.gguf", keep)
    return d, keep


@pytest.fixture
def served(tmp_path):
    """A served folder of two tiny models, listed (described) before any load, and its
    residency; (residency, folder, a good copy of a.gguf kept aside)."""
    d, keep = two_models(tmp_path)
    settings = ServerSettings(models=[str(d)], ctx_size=128, parallel=1)
    catalog = Catalog(settings)
    catalog.add(str(d))
    res = Residency(catalog, settings)
    yield res, d, keep
    for entry in list(res.entries.values()):
        if entry.lm is not None:
            res.unload(entry)


def test_a_file_gone_between_listing_and_load_is_a_503_and_loads_once_back(served):
    res, d, keep = served
    entry = res.entries["a.gguf"]
    os.unlink(d / "a.gguf")  # listed and described; gone when the load opens it
    with pytest.raises(Unavailable) as e:
        res.ensure_loaded(entry)
    assert e.value.status == 503 and e.value.headers.get("Retry-After")
    assert "a.gguf" in e.value.message and "FileNotFoundError" in e.value.message
    assert entry.error is None and res.state(entry) == "unloaded"  # not kept
    shutil.copy(keep, d / "a.gguf")  # the cause is gone: the next request loads it
    res.ensure_loaded(entry)
    assert res.state(entry) == "loaded"


def test_a_corrupt_file_stays_failed_with_its_reason(served):
    res, d, keep = served
    entry = res.entries["a.gguf"]
    size = os.path.getsize(d / "a.gguf")
    with open(d / "a.gguf", "r+b") as f:  # listed whole; its tensor data cut short before the load
        f.truncate(size // 2)
    with pytest.raises(ModelLoadFailed) as e:
        res.ensure_loaded(entry)
    assert e.value.status == 500 and "a.gguf" in e.value.message
    reason = entry.error
    assert "beyond the end of the file" in reason and res.state(entry) == "failed"  # the format layer's reason
    shutil.copy(keep, d / "a.gguf")  # kept: the file's own fault is not retried
    with pytest.raises(ModelLoadFailed) as again:
        res.ensure_loaded(entry)
    assert again.value.message == reason
    res.ensure_loaded(res.entries["b.gguf"])  # the other model is not affected
    assert res.state(res.entries["b.gguf"]) == "loaded"


def test_which_errors_are_the_files_and_which_may_pass():
    assert is_file_error(GGUFError("bad magic")) and is_file_error(WeightError("no tensor"))
    assert isinstance(WeightError("x"), (FileError, ValueError))
    for e in (MemoryError(), FileNotFoundError("gone"), TimeoutError(), PermissionError("denied")):
        assert is_transient(e) and not is_file_error(e)
    for e in (GGUFError("bad"), WeightError("x"), ValueError("unsupported type")):
        assert not is_transient(e)


def test_over_http_a_transient_failure_is_a_503_with_retry_after_then_the_model_answers(tmp_path):
    d, keep = two_models(tmp_path)
    body = {"model": "a.gguf", "prompt": "hi", "max_tokens": 2}
    with server(str(d), "--ctx-size", "128") as base:
        os.unlink(d / "a.gguf")
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 503 and r.headers.get("retry-after")
        assert "FileNotFoundError" in r.json()["error"]["message"]
        shutil.copy(keep, d / "a.gguf")
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


def test_errors_name_no_server_paths_and_quote_nothing_at_length(tmp_path):
    """(issue 39) A file whose metadata holds a megabyte where its architecture's name goes:
    the error a client sees (in /v1/models, public without a key, and in the refusal) names
    the file as listed, not the server's folder, and quotes the value's start, not all of it."""
    folder = tmp_path / "private-folder"
    folder.mkdir()
    write_small_model(folder / "huge.gguf", extra_metadata={"general.architecture": "x" * (1 << 20)})
    with server(str(folder)) as base:
        for text in (json.dumps(httpx.get(f"{base}/v1/models").json()),
                     httpx.post(f"{base}/v1/completions", json={"model": "huge.gguf", "prompt": "hi"}).text):
            assert "huge.gguf" in text and "private-folder" not in text and str(tmp_path) not in text
            assert "x" * 300 not in text and len(text) < 4000
