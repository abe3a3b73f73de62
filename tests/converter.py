"""llama.cpp's own converter (convert_hf_to_gguf.py from the llama-cpp-python 0.3.36
sdist, which .ci/run unpacks and names in LLAMA_CPP_SRC) run on a tiny transformers
model, to hold the test writers to the files users have: the same metadata and the
same tensors, byte for byte. The vocabulary is left out (the tiny models' tokenizers
are ours; the converter only recognizes real ones by hash), so the comparison covers
the architecture's keys and tensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_serve.gguf_io import GGUFReader

# run the converter with its vocabulary step skipped
_RUN = """
import importlib, pkgutil, runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion
import conversion.base as base
for info in pkgutil.iter_modules(conversion.__path__):
    importlib.import_module("conversion." + info.name)
todo = [base.TextModel]
while todo:
    cls = todo.pop()
    cls.set_vocab = lambda self: None
    todo += cls.__subclasses__()
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""

# run it whole, its vocabulary too, naming the pre-tokenizer "default" (its table knows real tokenizers by hash)
_RUN_WITH_VOCAB = """
import importlib, pkgutil, runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
import conversion
import conversion.base as base
for info in pkgutil.iter_modules(conversion.__path__):
    importlib.import_module("conversion." + info.name)
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
if "--raw-config" in sys.argv:  # config.json as it is, not through transformers' class for the model type
    import json
    sys.argv.remove("--raw-config")
    base.ModelBase.load_hparams = staticmethod(lambda d, is_mistral_format=False: json.loads((d / "config.json").read_text()))
sys.argv = [src + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(src + "/convert_hf_to_gguf.py", run_name="__main__")
"""

SKIP_KEYS = ("general.", "tokenizer.")


def llama_cpp_src() -> str:
    src = os.environ.get("LLAMA_CPP_SRC")
    if not src or not os.path.exists(os.path.join(src, "convert_hf_to_gguf.py")):
        if os.environ.get("CI"):
            pytest.fail("LLAMA_CPP_SRC (llama.cpp's source with its converter) is not set; .ci/run sets it")
        pytest.skip("LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's converter; skipped here)")
    return src


# what transformers 5 writes in config.json where the Hub's checkpoints have their own words
# (the converter reads those): Granite 4's layer kinds
HUB_CONFIG = {"GraniteMoeHybridForCausalLM": {"layer_types": {"linear_attention": "mamba", "full_attention": "attention"}}}


def convert(model, folder: Path, outtype: str, extra_args: tuple[str, ...] = ()) -> str:
    """`model` saved as a checkpoint in folder/hf (unless one is there) and converted at
    `outtype` (f32, f16, q8_0), with the converter's `extra_args`."""
    src = llama_cpp_src()
    hf = folder / "hf"
    if not hf.exists():
        model.save_pretrained(hf)
        config = json.loads((hf / "config.json").read_text())
        for key, words in HUB_CONFIG.get(type(model).__name__, {}).items():
            config[key] = [words.get(v, v) for v in config[key]]
        (hf / "config.json").write_text(json.dumps(config))
        # Gemma's converters trim the embedding to the tokenizer's size: a tokenizer.json of the vocabulary's
        n_vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
        (hf / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {f"t{i}": i for i in range(n_vocab)}},
                                                       "added_tokens": []}))
    out = folder / f"converted-{outtype}.gguf"
    run = subprocess.run([sys.executable, "-c", _RUN, src, str(hf), "--outtype", outtype, "--outfile", str(out),
                          *extra_args],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(out)


def assert_same_file(ours: str, theirs: str) -> None:
    """The architecture's metadata and every tensor (name, shape, type, bytes) agree."""
    a, b = GGUFReader(ours), GGUFReader(theirs)
    keys = lambda r: {k: v for k, v in r.metadata.items() if not k.startswith(SKIP_KEYS)}  # noqa: E731
    ka, kb = keys(a), keys(b)
    differ = {k: (ka.get(k), kb.get(k)) for k in set(ka) | set(kb) if ka.get(k) != kb.get(k)}
    assert not differ, f"metadata (ours, converter's): {differ}"
    assert sorted(a.tensors) == sorted(b.tensors), (sorted(set(a.tensors) - set(b.tensors)),
                                                    sorted(set(b.tensors) - set(a.tensors)))
    for name, t in a.tensors.items():
        u = b.tensors[name]
        assert (tuple(t.shape), t.ggml_type) == (tuple(u.shape), u.ggml_type), name
        assert np.array_equal(np.asarray(t.data), np.asarray(u.data)), name


def convert_with_vocab(hf: Path, out: Path, outtype: str, extra_args: tuple[str, ...] = ()) -> str:
    """A checkpoint folder with its own tokenizer (a WordPiece one, say) converted whole, with
    the converter's `extra_args` (and ours: "--raw-config" reads config.json as the checkpoint
    has it, where transformers 5's class for the model type would add keys the converter
    misreads, as NemotronHConfig's expert settings, which make a dense model MoE)."""
    run = subprocess.run([sys.executable, "-c", _RUN_WITH_VOCAB, llama_cpp_src(), str(hf), "--outtype", outtype,
                          "--outfile", str(out), *extra_args], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(out)
