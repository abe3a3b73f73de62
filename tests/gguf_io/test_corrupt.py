"""Malformed files: every case raises GGUFError naming what is at fault, fast, and
a fuzz run over mutated headers and tables never raises anything else."""

import os
import struct
import time

import numpy as np
import pytest

from gguf_serve.gguf_io import GGUFError, GGUFReader


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, value: int) -> bytes:
    return s(key) + struct.pack("<II", 4, value)


def tensor_info(name: str, dims, gtype: int, offset: int) -> bytes:
    return s(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", gtype, offset)


def build(kvs=(), infos=(), data=b"", *, version=3, n_kv=None, n_tensors=None, alignment=32, magic=b"GGUF") -> bytes:
    head = magic + struct.pack("<IQQ", version, len(infos) if n_tensors is None else n_tensors,
                               len(kvs) if n_kv is None else n_kv)
    body = head + b"".join(kvs) + b"".join(infos)
    body += b"\0" * (-len(body) % alignment)
    return body + data


@pytest.fixture
def write(tmp_path):
    def _write(content: bytes, name="bad.gguf") -> str:
        p = tmp_path / name
        p.write_bytes(content)
        return str(p)
    return _write


F32_4 = np.arange(4, dtype=np.float32).tobytes()

CASES = {
    "empty file": (b"", "file is empty"),
    "bad magic": (build(magic=b"GGML"), "not a GGUF file: magic is b'GGML', expected b'GGUF'"),
    "version 1": (build(version=1), "GGUF version 1 is obsolete"),
    "version 7": (build(version=7), "unsupported GGUF version 7"),
    "big endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian GGUF file"),
    "truncated header": (b"GGUF\x03\x00", "file truncated: version"),
    "lying tensor count": (build(n_tensors=2**62), "tensor count is 4611686018427387904, more than"),
    "lying kv count": (build(n_kv=2**40), "metadata key/value count is 1099511627776"),
    "huge key length": (build([struct.pack("<Q", 2**60) + b"abc"]), "key of metadata entry 0: string length 1152921504606846976 exceeds"),
    "unknown value type": (build([s("my.key") + struct.pack("<I", 99)]), "value type of 'my.key': unknown value type code 99"),
    "truncated value": (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + s("my.key") + struct.pack("<I", 4) + b"\x01",
                        "file truncated: value of 'my.key' needs 4 bytes, 1 remain"),
    "lying array length": (build([s("tok.list") + struct.pack("<IIQ", 9, 8, 2**50)]), "array length of 'tok.list' is 1125899906842624"),
    "lying numeric array": (build([s("a.f") + struct.pack("<IIQ", 9, 6, 2**61)]), "array length of 'a.f'"),
    "string element too long": (build([s("a.s") + struct.pack("<IIQ", 9, 8, 1) + struct.pack("<Q", 2**40)]), "element 0 of array 'a.s': string length"),
    "nested too deep": (build([s("deep") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 12]), "nested deeper than 8"),
    "key not utf-8": (build([s(b"k\xff\xfe") + struct.pack("<II", 4, 1)]), "key of metadata entry 0 is not valid UTF-8"),
    "duplicate key": (build([kv_u32("a.b", 1), kv_u32("a.b", 2)]), "duplicate metadata key 'a.b'"),
    "bad alignment": (build([kv_u32("general.alignment", 24)], alignment=24), "'general.alignment' must be a power-of-two UINT32, got 24"),
    "too many dims": (build(infos=[tensor_info("w", [1, 1, 1, 1, 1], 0, 0)]), "tensor 'w' has 5 dimensions"),
    "unknown ggml type": (build(infos=[tensor_info("w", [4], 31, 0)], data=F32_4), "tensor 'w' has unknown ggml type code 31"),
    "partial block": (build(infos=[tensor_info("w", [33], 2, 0)], data=b"\0" * 64), "tensor 'w' (Q4_0): row length 33 is not a multiple of the block size 32"),
    "partial MXFP4 block": (build(infos=[tensor_info("w", [48, 2], 39, 0)], data=b"\0" * 64),
                            "tensor 'w' (MXFP4): row length 48 is not a multiple of the block size 32"),
    "misaligned offset": (build(infos=[tensor_info("w", [4], 0, 8)], data=F32_4 * 4), "tensor 'w': data offset 8 is not aligned to 32"),
    "data beyond file": (build(infos=[tensor_info("w", [1024], 0, 0)], data=F32_4), "tensor 'w': data [64, 4160) lies beyond the end of the file (80 bytes)"),
    "absurd dims": (build(infos=[tensor_info("w", [2**40, 2**40], 0, 0)], data=F32_4), "lies beyond the end of the file"),
    "overlap": (build(infos=[tensor_info("a", [8], 0, 0), tensor_info("b", [8], 0, 0)], data=F32_4 * 2), "tensors 'a' and 'b' overlap"),
    "duplicate tensor": (build(infos=[tensor_info("a", [4], 0, 0), tensor_info("a", [4], 0, 32)], data=F32_4 * 8), "duplicate tensor name 'a'"),
    "data section cut": (build(infos=[tensor_info("a", [4], 0, 0)])[:-4], "tensor data would start at byte 64"),
    "split without name": (build([kv_u32("split.count", 3)]), "does not follow '<name>-00001-of-0000N.gguf'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_file_names_the_fault(write, case):
    content, message = CASES[case]
    path = write(content)
    t = time.perf_counter()
    with pytest.raises(GGUFError) as e:
        GGUFReader(path)
    assert time.perf_counter() - t < 0.5
    assert message in str(e.value)
    assert path in str(e.value)


def test_every_truncation_of_a_real_header_is_an_error(write, small_model):
    path, _ = small_model
    content = open(path, "rb").read()
    header_end = GGUFReader(path).data_offset
    for cut in range(0, header_end + 64):
        p = write(content[:cut], name="cut.gguf")
        with pytest.raises(GGUFError):
            GGUFReader(p)


def test_opening_does_not_read_tensor_data(write, small_model):
    # a file whose tensor bytes are all garbage still opens: only tables are parsed
    path, written = small_model
    content = bytearray(open(path, "rb").read())
    start = GGUFReader(path).data_offset
    content[start:] = os.urandom(len(content) - start)
    r = GGUFReader(write(bytes(content)))
    assert list(r.tensors) == list(written["tensors"])


def _mutate(rng: np.random.Generator, content: bytes, header_end: int) -> bytes:
    b = bytearray(content)
    kind = rng.integers(0, 6)
    if kind == 0:  # bit flips in the header and tables
        for _ in range(rng.integers(1, 5)):
            i = rng.integers(0, header_end)
            b[i] ^= 1 << rng.integers(0, 8)
    elif kind == 1:  # a random count, length or offset
        i = rng.integers(4, header_end - 8)
        value = [0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1, int(rng.integers(0, 2**62))][rng.integers(0, 7)]
        b[i:i + 8] = value.to_bytes(8, "little")
    elif kind == 2:  # a random u32 (type codes, n_dims)
        i = rng.integers(4, header_end - 4)
        b[i:i + 4] = int(rng.integers(0, 2**32)).to_bytes(4, "little")
    elif kind == 3:  # cut anywhere
        b = b[: rng.integers(0, len(b))]
    elif kind == 4:  # bytes inserted or removed inside the tables
        i = rng.integers(0, header_end)
        if rng.random() < 0.5:
            del b[i:i + rng.integers(1, 9)]
        else:
            b[i:i] = rng.integers(0, 256, rng.integers(1, 9), dtype=np.uint8).tobytes()
    else:  # random garbage over a stretch of the header
        i = rng.integers(0, header_end)
        n = int(rng.integers(1, 32))
        b[i:i + n] = rng.integers(0, 256, n, dtype=np.uint8).tobytes()[: len(b[i:i + n])]
    return bytes(b)


def test_fuzz_mutated_headers_read_or_raise_gguf_error(tmp_path, small_model):
    path, _ = small_model
    content = open(path, "rb").read()
    header_end = GGUFReader(path).data_offset
    rng = np.random.default_rng(1234)
    target = tmp_path / "fuzz.gguf"
    outcomes = {"read": 0, "error": 0}
    slowest = 0.0
    for _ in range(3000):
        target.write_bytes(_mutate(rng, content, header_end))
        t = time.perf_counter()
        try:
            r = GGUFReader(target)
            for info in r.tensors.values():  # whatever it accepted is usable
                info.dequantize()
            outcomes["read"] += 1
        except GGUFError:
            outcomes["error"] += 1
        slowest = max(slowest, time.perf_counter() - t)
    assert slowest < 1.0
    assert outcomes["error"] > 1000 and outcomes["read"] > 100, outcomes
