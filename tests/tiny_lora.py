"""A LoRA adapter as users have them: peft's adapter on a tiny transformers model, written
to GGUF by llama.cpp's own convert_lora_to_gguf.py (from the sdist in LLAMA_CPP_SRC), for
a base file written by our writer from the same model (tests/tiny_models.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from converter import llama_cpp_src

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_RUN = """
import runpy, sys
src = sys.argv[1]
sys.path[:0] = [src, src + "/gguf-py"]
sys.argv = [src + "/convert_lora_to_gguf.py"] + sys.argv[2:]
runpy.run_path(src + "/convert_lora_to_gguf.py", run_name="__main__")
"""


def lora_adapter(dense: torch.nn.Module, folder: Path, outtype: str = "f32", rank: int = 4, alpha: float = 8.0,
                 seed: int = 0, targets: tuple[str, ...] = TARGETS) -> tuple[str, torch.nn.Module]:
    """(the adapter's GGUF file, the dense model with the adapter merged at scale 1) for
    `dense` (the base as its file holds it: write_gguf's return). A and B are random, so
    that the adapter changes every target's output."""
    from peft import LoraConfig, get_peft_model

    src = llama_cpp_src()
    folder.mkdir(parents=True, exist_ok=True)
    base_dir = folder / "base"
    dense.config.architectures = [type(dense).__name__]  # what the converter detects the architecture by
    dense.config.save_pretrained(base_dir)
    peft_model = get_peft_model(_copy(dense), LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets),
                                                         init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    adapter_dir = folder / "adapter"
    peft_model.save_pretrained(adapter_dir)
    out = folder / f"lora-{outtype}.gguf"
    run = subprocess.run([sys.executable, "-c", _RUN, src, str(adapter_dir), "--base", str(base_dir), "--outtype",
                          outtype, "--outfile", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(out), peft_model.merge_and_unload()


def _copy(model: torch.nn.Module) -> torch.nn.Module:
    twin = type(model)(model.config).eval()
    twin.load_state_dict(model.state_dict())
    return twin
