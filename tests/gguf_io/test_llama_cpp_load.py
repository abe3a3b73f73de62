"""A model file written by our writer loads and runs in llama.cpp (where
llama-cpp-python is installed; .ci/run builds it, so CI always runs it)."""

import subprocess
import sys

import pytest

from gguf_serve.gguf_io import GGMLType

from helpers import no_llama_cpp, write_tiny_llama

SCRIPT = """
import sys, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
assert m.n_vocab() == 300, m.n_vocab()
out = m.create_completion([1, 270, 271], max_tokens=4, temperature=0)
print("OK", m.n_vocab(), out["usage"]["completion_tokens"])
"""


@pytest.mark.parametrize("qtype", [GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.F16])
def test_llama_cpp_loads_and_runs_a_model_we_wrote(tmp_path, qtype):
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        no_llama_cpp()
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, qtype=qtype)
    # run in a child so that a crash inside llama.cpp fails this test, not the whole run
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("OK 300")
