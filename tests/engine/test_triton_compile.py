"""Our Triton kernels compiled for sm_90 down to a cubin (tests/triton_compile.py, in a process
without the interpreter the other Triton tests run under): what only the compiler refuses."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gguf_serve.engine.kernels import triton_ops

pytestmark = pytest.mark.skipif(not triton_ops.AVAILABLE, reason="the triton package is not installed "
                                "(the test extra installs it)")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "triton_compile.py")


def test_every_kernel_compiles_for_hopper(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compiled here, not found in a cache
    got = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    lines = got.stdout.splitlines()
    assert got.returncode == 0 and not any(line.startswith("FAILED") for line in lines), got.stdout + got.stderr[-3000:]
    assert sum(line.startswith("ok get_rows") for line in lines) == len(triton_ops.TYPES)
    assert sum(line.startswith("ok attention") for line in lines) == 4
