"""`gguf-serve inspect`, run as a user runs it: the installed console script."""

import json
import subprocess

import pytest

from server_harness import serve_command


def run(*args):
    cmd = serve_command(*args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_inspect_gemma_json(gemma_path):
    p = run("inspect", gemma_path, "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["architecture"] == "gemma3"
    assert d["name"] == "Gemma 3 270m"
    assert d["parameters"] == 268_098_176
    assert d["file_type"] == "MOSTLY_Q4_K_M"
    assert set(d["quant_mix"]) == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert d["context_length"] == 32768
    assert d["chat_template"] is False
    assert d["vocab_size"] == 262144
    assert len(d["tensors"]) == 236
    emb = next(t for t in d["tensors"] if t["name"] == "token_embd.weight")
    assert emb == {"name": "token_embd.weight", "type": "Q8_0", "shape": [262144, 640], "bytes": 178257920}


def test_inspect_text_of_a_small_file(small_model):
    path, _ = small_model
    p = run("inspect", path)
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "architecture    llama" in out
    assert "chat template   absent" in out
    assert "blk.0.ffn_up.weight" in out and "Q4_K" in out
    assert "quant mix       " in out and "Q8_0" in out and "F16" in out


def test_inspect_without_file_shows_the_embedded_default():
    p = run("inspect", "--no-tensors")
    assert p.returncode == 0, p.stderr
    assert "gemma3" in p.stdout and "tensor " not in p.stdout


@pytest.mark.parametrize("content,message", [
    (b"not a model", "not a GGUF file: magic is b'not '"),
    (b"GGUF\x03\x00\x00\x00" + (2**60).to_bytes(8, "little") + b"\0" * 8, "tensor count is 1152921504606846976"),
])
def test_inspect_bad_file_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    p = run("inspect", str(path))
    assert p.returncode == 1
    assert message in p.stderr and "Traceback" not in p.stderr


def test_inspect_missing_file(tmp_path):
    p = run("inspect", str(tmp_path / "nope.gguf"))
    assert p.returncode == 1 and "No such file" in p.stderr
