"""The C kernels checked by native_check.c, built as a plain program: on this machine
(every x86-64 level) and as an AArch64 program run under qemu-user (the NEON level),
which is how the NEON kernels are tested without an ARM machine. `.ci/run` installs the
cross compiler and qemu (Debian: gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
qemu-user); without them the AArch64 check is skipped."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [str(Path(__file__).with_name("native_check.c"))] + sorted(str(p) for p in (ROOT / "engine/kernels/csrc").rglob("*.c"))
FLAGS = ["-O2", "-std=c11", "-fno-strict-aliasing", "-ffp-contract=off", "-Wall", "-Werror"]
TYPES = {"Q4_K", "Q6_K", "Q8_0", "Q5_K", "Q5_0", "Q4_0", "Q4_1", "Q5_1", "Q3_K", "Q2_K", "IQ4_NL", "IQ4_XS", "MXFP4",
         "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0", "F16", "BF16"}


def _check(output: str, levels: list[str]) -> None:
    assert output.strip().endswith("PASSED"), output
    seen = re.findall(r"^(\S+) (\S+) path=(\S+) error/bound=\S+ vs_scalar=\S+ ok$", output, re.M)
    assert {(t, lvl) for t, lvl, _ in seen} == {(t, lvl) for t in TYPES for lvl in levels}
    assert all(lvl == path for _, lvl, path in seen)  # each level ran its own kernels


def test_native_check_on_this_machine(tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler builds the package's kernels; it should be here"
    exe = tmp_path / "native_check"
    subprocess.run([cc, *FLAGS, "-o", str(exe), *SOURCES, "-lm", "-lpthread"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300).stdout
    best = out.splitlines()[0].split()[1]
    levels = ["scalar", "avx2", "avx512"]
    _check(out, levels[:levels.index(best) + 1] if best in levels else ["scalar"])


def test_neon_kernels_under_qemu(tmp_path):
    cc, qemu = shutil.which("aarch64-linux-gnu-gcc"), shutil.which("qemu-aarch64")
    if not (cc and qemu):
        pytest.skip("aarch64-linux-gnu-gcc or qemu-aarch64 missing (.ci/run installs them)")
    exe = tmp_path / "native_check_aarch64"
    subprocess.run([cc, *FLAGS, "-static", "-o", str(exe), *SOURCES, "-lm", "-lpthread"], check=True)
    out = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=300).stdout
    assert out.startswith("best neon"), out
    _check(out, ["scalar", "neon"])
