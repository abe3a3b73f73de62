"""The type table against llama.cpp's gguf-py (the format's reference in Python)."""

import gguf
import pytest

from gguf_serve.gguf_io import GGMLType, GGUFValueType, TYPE_INFO


def test_every_gguf_py_type_is_known_with_the_same_geometry():
    for t in gguf.GGMLQuantizationType:
        ours = GGMLType(int(t))
        assert ours.name == t.name
        block, size = gguf.GGML_QUANT_SIZES[t]
        if ours == GGMLType.Q8_1:
            # gguf-py still lists the old float-scaled layout (40 bytes); ggml's
            # block_q8_1 is two float16 + 32 int8 = 36 bytes (ggml-common.h).
            assert (ours.block_size, ours.type_size) == (32, 36)
            continue
        assert (ours.block_size, ours.type_size) == (block, size), t.name


def test_types_beyond_gguf_py_follow_ggml_common_h():
    # Q2_0 (id 42) is newer than gguf-py 0.19: half d + 64 two-bit values.
    assert (GGMLType.Q2_0.block_size, GGMLType.Q2_0.type_size) == (64, 18)
    assert set(TYPE_INFO) == set(GGMLType)


def test_value_type_codes():
    for t in gguf.GGUFValueType:
        assert GGUFValueType(int(t)).name == t.name


def test_row_nbytes_rejects_partial_blocks():
    assert GGMLType.Q4_K.row_nbytes(512) == 288
    with pytest.raises(ValueError, match="multiple of the block size 256"):
        GGMLType.Q4_K.row_nbytes(100)
