"""Writer → reader round trips, checked by our reader, gguf-py's reader, and
llama.cpp's gguf parser where installed."""

import os

import gguf
import numpy as np
import pytest

from gguf_serve.gguf_io import GGMLType, GGUFError, GGUFReader, GGUFValueType as V, GGUFWriter, TYPE_INFO, dequantize

from helpers import llama_cpp_gguf_counts, no_llama_cpp, random_packed, write_small_model

A = V.ARRAY
EVERY_VALUE = {
    "t.u8": (200, V.UINT8), "t.i8": (-100, V.INT8), "t.u16": (60000, V.UINT16), "t.i16": (-30000, V.INT16),
    "t.u32": (4_000_000_000, V.UINT32), "t.i32": (-2_000_000_000, V.INT32), "t.f32": (0.5, V.FLOAT32),
    "t.bool": (True, V.BOOL), "t.str": ("héllo ✓ 日本", V.STRING), "t.u64": (2**63 + 5, V.UINT64),
    "t.i64": (-(2**62), V.INT64), "t.f64": (1e300, V.FLOAT64), "t.empty_str": ("", V.STRING),
    "t.arr_u8": ([1, 2, 255], (A, V.UINT8)), "t.arr_i8": ([-1, 2], (A, V.INT8)),
    "t.arr_u16": ([65535], (A, V.UINT16)), "t.arr_i16": ([-5], (A, V.INT16)),
    "t.arr_u32": ([1, 2**32 - 1], (A, V.UINT32)), "t.arr_i32": ([-7, 7], (A, V.INT32)),
    "t.arr_f32": ([0.25, -1.5], (A, V.FLOAT32)), "t.arr_bool": ([True, False, True], (A, V.BOOL)),
    "t.arr_str": (["a", "", "ü", "<0x0A>"], (A, V.STRING)), "t.arr_u64": ([2**64 - 1], (A, V.UINT64)),
    "t.arr_i64": ([-(2**63)], (A, V.INT64)), "t.arr_f64": ([1.0 / 3], (A, V.FLOAT64)),
    "t.arr_empty": ([], (A, V.INT32)),
    "t.nested": ([[1, 2], [3], []], (A, (A, V.INT32))),
    "t.nested_str": ([["x", "y"], ["z"]], (A, (A, V.STRING))),
    "t.nested3": ([[[1.5]], [[2.5, 3.5]]], (A, (A, (A, V.FLOAT32)))),
}


def test_every_metadata_type_round_trips(tmp_path):
    path = tmp_path / "meta.gguf"
    with GGUFWriter(path) as w:
        for k, (v, spec) in EVERY_VALUE.items():
            w.add(k, v, spec)
    r = GGUFReader(path)
    for k, (v, spec) in EVERY_VALUE.items():
        assert r.metadata_types[k] == spec, k
        if spec == V.FLOAT32:
            assert r.metadata[k] == pytest.approx(v)
        else:
            assert r.metadata[k] == v, k
    # gguf-py reads the same keys and values
    g = gguf.GGUFReader(path)
    assert g.fields["t.str"].contents() == "héllo ✓ 日本"
    assert g.fields["t.arr_str"].contents() == ["a", "", "ü", "<0x0A>"]
    assert g.fields["t.u64"].contents() == 2**63 + 5
    # (gguf-py flattens nested arrays in contents(), so it is no oracle for those)


def test_inferred_types_follow_llama_cpp_conventions(tmp_path):
    path = tmp_path / "infer.gguf"
    with GGUFWriter(path) as w:
        w.add("a.count", 5)
        w.add("a.neg", -5)
        w.add("a.big", 2**40)
        w.add("a.eps", 1e-6)
        w.add("a.flag", False)
        w.add("a.ids", [0, 1, 2])
        w.add("a.scores", [0.0, -1.0])
        w.add("a.np", np.array([1, 2], dtype=np.uint16))
    t = GGUFReader(path).metadata_types
    assert t["a.count"] == V.UINT32 and t["a.neg"] == V.INT32 and t["a.big"] == V.INT64
    assert t["a.eps"] == V.FLOAT32 and t["a.flag"] == V.BOOL
    assert t["a.ids"] == (A, V.INT32) and t["a.scores"] == (A, V.FLOAT32) and t["a.np"] == (A, V.UINT16)


def test_writer_rejects_values_that_do_not_fit(tmp_path):
    w = GGUFWriter(tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="'k': 300 does not fit UINT8"):
        w.add("k", 300, V.UINT8)
    with pytest.raises(ValueError, match="duplicate metadata key"):
        w.add("j", 1)
        w.add("j", 2)
    with pytest.raises(ValueError, match="power-of-two"):
        w.add("general.alignment", 48, V.UINT32)


@pytest.mark.parametrize("gtype", list(GGMLType), ids=lambda t: t.name)
def test_every_tensor_type_round_trips(tmp_path, gtype):
    rng = np.random.default_rng(int(gtype))
    info = TYPE_INFO[gtype]
    path = tmp_path / f"{gtype.name}.gguf"
    rows = 3
    if info.quantized or gtype == GGMLType.BF16:
        data = random_packed(rng, gtype, rows, 2)
        shape = (rows, 2 * info.block_size)
    else:
        data = (rng.standard_normal((rows, 8)) * 100).astype(info.dtype)
        shape = data.shape
    with GGUFWriter(path) as w:
        w.add("general.architecture", "test")
        w.add_tensor("t", data, ggml_type=gtype)
        w.add_tensor("after", np.arange(5, dtype=np.float32))
    r = GGUFReader(path)
    t = r.tensors["t"]
    assert (t.ggml_type, t.shape, t.nbytes) == (gtype, shape, data.nbytes)
    assert t.offset % r.alignment == 0
    assert np.array_equal(t.data.reshape(-1), data.reshape(-1).view(np.uint8))
    assert np.array_equal(r.tensors["after"].array(), np.arange(5, dtype=np.float32))
    if int(gtype) in {int(x) for x in gguf.GGMLQuantizationType} and gtype != GGMLType.Q8_1:  # gguf-py's Q8_1 size is stale
        g = gguf.GGUFReader(path)
        gt = {x.name: x for x in g.tensors}["t"]
        assert int(gt.tensor_type) == int(gtype)
        assert np.array_equal(np.ascontiguousarray(gt.data).view(np.uint8).reshape(-1), data.reshape(-1).view(np.uint8))


def test_float_arrays_quantized_while_writing(tmp_path):
    x = np.random.default_rng(0).standard_normal((4, 512)).astype(np.float32)
    path = tmp_path / "q.gguf"
    with GGUFWriter(path) as w:
        for t in (GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.F16, GGMLType.BF16):
            w.add_tensor(t.name, x, ggml_type=t)
    r = GGUFReader(path)
    for name, t in r.tensors.items():
        assert t.shape == (4, 512) and t.ggml_type.name == name
        np.testing.assert_allclose(t.dequantize(), x, atol=0.3)


def test_custom_alignment_and_gguf_py_and_llama_cpp_agree(tmp_path):
    path = tmp_path / "aligned.gguf"
    written = write_small_model(path, alignment=64)
    r = GGUFReader(path)
    assert r.alignment == 64 and r.data_offset % 64 == 0
    assert all(t.offset % 64 == 0 for t in r.tensors.values())
    g = gguf.GGUFReader(path)
    assert [t.name for t in g.tensors] == list(r.tensors)
    for gt in g.tensors:
        t = r.tensors[gt.name]
        assert t.offset == gt.data_offset
        np.testing.assert_array_equal(
            t.dequantize(), gguf.quants.dequantize(gt.data, gt.tensor_type).reshape(t.shape))
    assert r.metadata["tokenizer.ggml.tokens"] == written["metadata"]["tokenizer.ggml.tokens"]
    try:
        counts = llama_cpp_gguf_counts(path)
    except LookupError:
        return  # llama.cpp not installed: gguf-py is the oracle here
    assert counts == (len(r.metadata), len(r.tensors))


def test_llama_cpp_reads_every_type_we_write(tmp_path):
    """llama.cpp's gguf parser accepts a file holding every tensor type (where installed).
    It refuses arrays of arrays (a limit of its parser), so those keys are left out."""
    try:
        llama_cpp_gguf_counts(os.devnull)
    except LookupError:
        no_llama_cpp()
    path = tmp_path / "all.gguf"
    rng = np.random.default_rng(0)
    with GGUFWriter(path) as w:
        flat = {k: v for k, v in EVERY_VALUE.items() if not k.startswith("t.nested")}
        for k, (v, spec) in flat.items():
            w.add(k, v, spec)
        for t in GGMLType:
            info = TYPE_INFO[t]
            if info.quantized or t == GGMLType.BF16:
                w.add_tensor(t.name, random_packed(rng, t, 2, 1), ggml_type=t)
            else:
                w.add_tensor(t.name, np.zeros((2, 4), info.dtype), ggml_type=t)
    assert llama_cpp_gguf_counts(path) == (len(flat), len(GGMLType))


def test_callable_sources_stream_one_at_a_time(tmp_path):
    calls = []

    def source(i):
        def make():
            calls.append(i)
            return np.full((8, 32), i, dtype=np.float32)
        return make

    path = tmp_path / "lazy.gguf"
    w = GGUFWriter(path)
    for i in range(5):
        w.add_tensor(f"t{i}", source(i), ggml_type=GGMLType.Q8_0 if i % 2 else GGMLType.F32, shape=(8, 32))
    assert calls == []  # nothing pulled before write
    assert not path.exists()
    w.write()
    assert calls == [0, 1, 2, 3, 4]
    r = GGUFReader(path)
    for i in range(5):
        np.testing.assert_allclose(r.tensors[f"t{i}"].dequantize(), np.full((8, 32), i, np.float32), rtol=1e-3)
    with pytest.raises(RuntimeError, match="already written"):
        w.add("late", 1)


def test_failed_write_leaves_nothing_behind(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"previous contents")

    def boom():
        raise MemoryError("source failed")

    w = GGUFWriter(path)
    w.add_tensor("ok", np.zeros(32, np.float32))
    w.add_tensor("bad", boom, ggml_type=GGMLType.F32, shape=(32,))
    with pytest.raises(MemoryError):
        w.write()
    assert path.read_bytes() == b"previous contents"
    assert os.listdir(tmp_path) == ["model.gguf"]


def test_writer_validates_tensors(tmp_path):
    w = GGUFWriter(tmp_path / "v.gguf")
    with pytest.raises(ValueError, match="not a multiple of Q4_K's block size 256"):
        w.add_tensor("a", np.zeros((2, 100), np.float32), ggml_type=GGMLType.Q4_K)
    with pytest.raises(ValueError, match="longer than 63 bytes"):
        w.add_tensor("x" * 64, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="needs 288 bytes, data has 287"):
        w.add_tensor("b", np.zeros((1, 287), np.uint8), ggml_type=GGMLType.Q4_K, shape=(1, 512))
    with pytest.raises(ValueError, match="needs ggml_type and shape"):
        w.add_tensor("c", lambda: None)


def _write_shards(folder, n=3):
    rng = np.random.default_rng(0)
    tensors = {f"blk.{i}.w": rng.standard_normal((4, 32)).astype(np.float32) for i in range(6)}
    names = list(tensors)
    per = -(-len(names) // n)
    for s in range(n):
        with GGUFWriter(folder / f"model-{s + 1:05d}-of-{n:05d}.gguf") as w:
            if s == 0:
                w.add("general.architecture", "llama")
                w.add("general.name", "sharded")
            w.add("split.no", s, V.UINT16)
            w.add("split.count", n, V.UINT16)
            w.add("split.tensors.count", len(names), V.INT32)
            for name in names[s * per:(s + 1) * per]:
                w.add_tensor(name, tensors[name])
    return tensors


def test_shards_open_as_one_model(tmp_path):
    tensors = _write_shards(tmp_path)
    for shard in (1, 2, 3):
        r = GGUFReader(tmp_path / f"model-{shard:05d}-of-00003.gguf")
        assert len(r.files) == 3
        assert r.metadata["general.name"] == "sharded"
        assert list(r.tensors) == list(tensors)
        for name, x in tensors.items():
            np.testing.assert_array_equal(r.tensors[name].array(), x)


def test_missing_shard_is_a_clear_error(tmp_path):
    _write_shards(tmp_path)
    os.unlink(tmp_path / "model-00002-of-00003.gguf")
    with pytest.raises(GGUFError, match="shard 2 of 3 is missing"):
        GGUFReader(tmp_path / "model-00001-of-00003.gguf")


def test_tensor_views_are_zero_copy(small_model):
    path, _ = small_model
    r = GGUFReader(path)
    t = r.tensors["blk.0.attn_q.weight"]
    assert t.data.base is not None and not t.data.flags.owndata and not t.data.flags.writeable
    assert t.data.shape == (64, GGMLType.Q8_0.row_nbytes(64))
    with pytest.raises(TypeError, match="quantized type: use dequantize"):
        t.array()
    np.testing.assert_allclose(t.dequantize(), dequantize(t.data, t.ggml_type, t.shape))
