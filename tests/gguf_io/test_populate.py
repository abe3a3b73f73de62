"""Faulting a mapped file in at once (what the engine does at load): afterwards the
process's resident set holds the whole file, and the data are unchanged."""

import numpy as np

from gguf_serve.gguf_io import GGUFReader, GGUFWriter
from gguf_serve.gguf_io import reader as reader_module


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


def test_populate_maps_every_page_and_keeps_the_data(tmp_path, monkeypatch):
    path = tmp_path / "t.gguf"
    data = np.arange(4_000_000, dtype=np.float32)  # 16 MB
    with GGUFWriter(path) as w:
        w.add("general.architecture", "llama")
        w.add_tensor("x", data)
    for advice in (reader_module.MADV_POPULATE_READ, -1):  # -1: refused, as by an older kernel: a read per page
        monkeypatch.setattr(reader_module, "MADV_POPULATE_READ", advice)
        r = GGUFReader(path)
        before = _rss_file_kb()
        r.populate()
        assert _rss_file_kb() - before > 15_000, advice
        assert np.array_equal(r.tensors["x"].array(), data)
        del r
