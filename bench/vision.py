"""Images, side by side with llama.cpp (llama-server and llama-mtmd-cli with --mmproj):

- encode: one 448x448 image through the vision tower (gguf-serve: the engine's
  VisionModel.encode in-process, median of --repeat; llama.cpp: llama-mtmd-cli's own
  "mtmd batch encoding done in N ms").
- chat: over HTTP, time to first token of a chat with one image and a short question,
  then of a follow-up question about the same image (the prefix cache should make it
  pay for the new text only); a new random image every round.
- memory: the engine's resident memory before the vision file, after loading it, and
  after encoding one image, against the vision file's size.

The text model is the real Gemma 3 270M file with a Gemma 3 chat template added (it has
none); the vision file is synthetic (written here: random F16 weights at the shape of
Gemma 3's SigLIP tower, 27 layers of width 1152, 896x896 images, 256 tokens, projected
to the 270M's width of 640). Its images mean nothing, and speed does not care.

    python bench/vision.py [--threads 2] [--repeat 3] [--llama-bin DIR]

DIR holds llama-server and llama-mtmd-cli (bench/README.md: built from the
llama-cpp-python 0.3.36 sdist, targets llama-server llama-mtmd-cli)."""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from server_speed import free_port, sse_chunks, wait_ready  # noqa: E402

from gguf_serve.gguf_io import GGMLType, GGUFReader, GGUFWriter, quantize  # noqa: E402

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}"
    "{% if m['content'] is string %}{{ m['content'] | trim }}"
    "{% else %}{% for item in m['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}{{ '<start_of_image>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
SIGLIP = dict(image=896, patch=14, hidden=1152, ffn=4304, layers=27, heads=16)


def text_with_template(out: str) -> str:
    """The Gemma 3 270M file with TEMPLATE as its chat template."""
    from gguf_serve.server.models.default_model import default_model_path

    if os.path.exists(out):
        return out
    r = GGUFReader(default_model_path())
    with GGUFWriter(out) as w:
        for k, v in r.metadata.items():
            if k not in ("general.alignment", "tokenizer.chat_template"):
                w.add(k, v, r.metadata_types[k])
        w.add("tokenizer.chat_template", TEMPLATE)
        for t in r.tensors.values():
            w.add_tensor(t.name, np.asarray(t.data), ggml_type=t.ggml_type, shape=t.shape)
    return out


def synthetic_mmproj(out: str, text_width: int = 640, seed: int = 0) -> str:
    """Gemma 3's vision tower at its real shape, random weights, F16 as mmproj-F16 files are."""
    if os.path.exists(out):
        return out
    s, rng = SIGLIP, np.random.default_rng(seed)
    h, f, side = s["hidden"], s["ffn"], s["image"] // s["patch"]

    def mat(rows, cols):
        return quantize((rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)), GGMLType.F16)

    with GGUFWriter(out) as w:
        for k, v in [("general.architecture", "clip"), ("general.type", "mmproj"), ("general.file_type", 1),
                     ("clip.has_vision_encoder", True), ("clip.vision.projection_dim", text_width),
                     ("clip.vision.image_size", s["image"]), ("clip.vision.patch_size", s["patch"]),
                     ("clip.vision.embedding_length", h), ("clip.vision.feed_forward_length", f),
                     ("clip.vision.block_count", s["layers"]), ("clip.vision.attention.head_count", s["heads"]),
                     ("clip.vision.image_mean", [0.5, 0.5, 0.5]), ("clip.vision.image_std", [0.5, 0.5, 0.5]),
                     ("clip.projector_type", "gemma3"), ("clip.vision.attention.layer_norm_epsilon", 1e-6),
                     ("clip.use_gelu", True)]:
            w.add(k, v)
        w.add_tensor("mm.input_projection.weight", mat(h, text_width), ggml_type=GGMLType.F16, shape=(h, text_width))
        w.add_tensor("mm.soft_emb_norm.weight", np.ones(h, np.float32))
        w.add_tensor("v.patch_embd.weight", (rng.standard_normal((h, 3, s["patch"], s["patch"]), dtype=np.float32)
                                             / np.float32(np.sqrt(3 * s["patch"] ** 2))))
        w.add_tensor("v.patch_embd.bias", np.zeros(h, np.float32))
        w.add_tensor("v.position_embd.weight", 0.02 * rng.standard_normal((side * side, h), dtype=np.float32))
        for i in range(s["layers"]):
            b = f"v.blk.{i}."
            for n in ("ln1", "ln2"):
                w.add_tensor(b + n + ".weight", np.ones(h, np.float32))
                w.add_tensor(b + n + ".bias", np.zeros(h, np.float32))
            for n, rows, cols in (("attn_q", h, h), ("attn_k", h, h), ("attn_v", h, h), ("attn_out", h, h),
                                  ("ffn_up", f, h), ("ffn_down", h, f)):
                w.add_tensor(b + n + ".weight", mat(rows, cols), ggml_type=GGMLType.F16, shape=(rows, cols))
                w.add_tensor(b + n + ".bias", np.zeros(rows, np.float32))
        w.add_tensor("v.post_ln.weight", np.ones(h, np.float32))
        w.add_tensor("v.post_ln.bias", np.zeros(h, np.float32))
    return out


QWEN_VIT = dict(patch=16, hidden=1024, ffn=4096, layers=24, heads=16, positions=2304, merge=2)


def synthetic_qwen_mmproj(out: str, text_width: int = 2560, seed: int = 0) -> str:
    """Qwen3.5-4B's vision tower and merger at their real shape (24 layers of width 1024, a
    48x48 position table, the 2x2 merger to 2560), random weights, F16 as mmproj-F16 files."""
    if os.path.exists(out):
        return out
    s, rng = QWEN_VIT, np.random.default_rng(seed)
    h, f, ps, merged = s["hidden"], s["ffn"], s["patch"], s["hidden"] * s["merge"] ** 2

    def mat(rows, cols):
        return quantize((rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)), GGMLType.F16)

    with GGUFWriter(out) as w:
        for k, v in [("general.architecture", "clip"), ("general.type", "mmproj"), ("general.file_type", 1),
                     ("clip.has_vision_encoder", True), ("clip.vision.projection_dim", text_width),
                     ("clip.vision.image_size", int(s["positions"] ** 0.5) * ps), ("clip.vision.patch_size", ps),
                     ("clip.vision.embedding_length", h), ("clip.vision.feed_forward_length", f),
                     ("clip.vision.block_count", s["layers"]), ("clip.vision.attention.head_count", s["heads"]),
                     ("clip.vision.image_mean", [0.5, 0.5, 0.5]), ("clip.vision.image_std", [0.5, 0.5, 0.5]),
                     ("clip.projector_type", "qwen3vl_merger"), ("clip.use_gelu", True),
                     ("clip.vision.spatial_merge_size", s["merge"]), ("clip.vision.attention.layer_norm_epsilon", 1e-6),
                     ("clip.vision.is_deepstack_layers", [False] * s["layers"])]:
            w.add(k, v)
        for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
            w.add_tensor(name, mat(h, 3 * ps * ps), ggml_type=GGMLType.F16, shape=(h, 3, ps, ps))
        w.add_tensor("v.patch_embd.bias", np.zeros(h, np.float32))
        w.add_tensor("v.position_embd.weight", 0.02 * rng.standard_normal((s["positions"], h), dtype=np.float32))
        for i in range(s["layers"]):
            b = f"v.blk.{i}."
            for n in ("ln1", "ln2"):
                w.add_tensor(b + n + ".weight", np.ones(h, np.float32))
                w.add_tensor(b + n + ".bias", np.zeros(h, np.float32))
            for n, rows, cols in (("attn_qkv", 3 * h, h), ("attn_out", h, h), ("ffn_up", f, h), ("ffn_down", h, f)):
                w.add_tensor(b + n + ".weight", mat(rows, cols), ggml_type=GGMLType.F16, shape=(rows, cols))
                w.add_tensor(b + n + ".bias", np.zeros(rows, np.float32))
        w.add_tensor("v.post_ln.weight", np.ones(h, np.float32))
        w.add_tensor("v.post_ln.bias", np.zeros(h, np.float32))
        for n, rows, cols in (("mm.0", merged, merged), ("mm.2", text_width, merged)):
            w.add_tensor(n + ".weight", mat(rows, cols), ggml_type=GGMLType.F16, shape=(rows, cols))
            w.add_tensor(n + ".bias", np.zeros(rows, np.float32))
    return out


def qwen_text(out: str) -> str:
    from synthetic import WRITERS

    if not os.path.exists(out):
        WRITERS["qwen35-4b"](out)
    return out


def image_png(seed: int, size: int = 448) -> bytes:
    from PIL import Image

    a = np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def ours_encode(text: str, mmproj: str, threads: int, repeat: int) -> dict:
    """In a child process: RSS around loading the vision file and one encode, and encode times."""
    code = f"""
import time, json, torch, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from vision import rss_mib, image_png
from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.vision import load_vision, vision_products
lm = load_model({text!r}, config=EngineConfig(threads={threads}, n_ctx=4096, n_seq=1))
before = rss_mib()
lm.vision = load_vision({mmproj!r}, lm.gguf, lm.params.hidden, lm.device, lm.dtype, True,
                        products=vision_products(lm.config.vision_dtype, lm.device))
lm.vision.bind(lm.tokenizer)
lm.vision.threads = lm.threads
loaded = rss_mib()
times = []
for i in range({repeat}):
    img = lm.vision.prepare(image_png(100 + i))
    t = time.perf_counter(); lm.vision.encode(img); times.append((time.perf_counter() - t) * 1e3)
print(json.dumps(dict(times=times, before=before, loaded=loaded, after=rss_mib())))
"""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"the engine's encode failed:\n{out.stderr[-3000:]}")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def llama_encode(binary: str, text: str, mmproj: str, threads: int, repeat: int) -> list[float]:
    times = []
    for i in range(repeat):
        path = os.path.join(tempfile.gettempdir(), f"bench-vision-{i}.png")
        Path(path).write_bytes(image_png(100 + i))
        out = subprocess.run([binary, "-m", text, "--mmproj", mmproj, "--image", path, "-p", "What is this?", "-n",
                              "1", "-t", str(threads), "--temp", "0"], capture_output=True, text=True)
        m = re.search(r"(?:image slice encoded in|mtmd batch encoding done in) (\d+) ms", out.stdout + out.stderr)
        if m is None:
            raise RuntimeError(f"llama-mtmd-cli printed no encode time:\n{(out.stdout + out.stderr)[-2000:]}")
        times.append(float(m.group(1)))
    return times


def chat_turns(url: str, model: str, seed: int) -> tuple[float, float, dict, dict]:
    """TTFT (ms) of an image + question, then of a follow-up about it; the two usages."""
    data = "data:image/png;base64," + base64.b64encode(image_png(seed)).decode()
    first = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data}},
                                          {"type": "text", "text": "What is in this image?"}]}]
    follow = first + [{"role": "assistant", "content": "Noise."},
                      {"role": "user", "content": "What colour is it mostly?"}]
    out = []
    for msgs in (first, follow):
        body = {"model": model, "messages": msgs, "max_tokens": 4, "temperature": 0, "stream": True,
                "ignore_eos": True, "stream_options": {"include_usage": True}}
        start, ttft, usage = time.perf_counter(), None, {}
        for chunk in sse_chunks(url, "/v1/chat/completions", body):
            usage = chunk.get("usage") or usage
            delta = ((chunk.get("choices") or [{}])[0].get("delta") or {})
            if ttft is None and delta.get("content"):
                ttft = (time.perf_counter() - start) * 1e3
        out.append((ttft or (time.perf_counter() - start) * 1e3, usage))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def serve(cmd: list[str], url: str, model: str, rounds: list[int]) -> list[tuple]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(url, proc, timeout=600)
        return [chat_turns(url, model, seed) for seed in rounds]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


FAMILIES = {
    "gemma3": dict(label="Gemma 3 vision tower (SigLIP 27 x 1152, 896 px, 256 tokens; synthetic F16) with the real "
                         "Gemma 3 270M text file",
                   files=lambda tmp: (text_with_template(os.path.join(tmp, "gguf-serve-gemma270m-template.gguf")),
                                      synthetic_mmproj(os.path.join(tmp, "gguf-serve-synthetic-mmproj-gemma3-F16.gguf")))),
    "qwen35": dict(label="Qwen3.5-4B vision tower (ViT 24 x 1024, 2x2 merger; synthetic F16) with the synthetic "
                         "Qwen3.5-4B Q4_K_M text file",
                   files=lambda tmp: (qwen_text(os.path.join(tmp, "gguf-serve-synthetic-qwen35-4b.gguf")),
                                      synthetic_qwen_mmproj(os.path.join(tmp, "gguf-serve-synthetic-mmproj-qwen35-4b-F16.gguf")))),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="gemma3,qwen35")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_BIN"))
    args = ap.parse_args()
    for family in args.families.split(","):
        run_family(FAMILIES[family], args)


def run_family(fam: dict, args) -> None:
    tmp = tempfile.gettempdir()
    text, mmproj = fam["files"](tmp)
    size_mib = os.path.getsize(mmproj) / 2 ** 20
    tool = lambda name: os.path.join(args.llama_bin, name) if args.llama_bin else None  # noqa: E731

    ours = ours_encode(text, mmproj, args.threads, args.repeat)
    rows = {"gguf-serve": statistics.median(ours["times"])}
    if tool("llama-mtmd-cli"):
        rows["llama.cpp (mtmd)"] = statistics.median(llama_encode(tool("llama-mtmd-cli"), text, mmproj, args.threads,
                                                                  args.repeat))
    print(f"\n{fam['label']}; vision file {size_mib:.0f} MiB; one 448x448 PNG; {args.threads} threads; medians of "
          f"{args.repeat}")
    for name, ms in rows.items():
        print(f"  encode   {name:18s} {ms:9.0f} ms" + (f"   {ms / rows['gguf-serve']:.2f}x ours" if name != "gguf-serve"
                                                      else ""))
    print(f"  memory   RSS {ours['before']:.0f} MiB -> {ours['loaded']:.0f} with the vision file "
          f"(+{ours['loaded'] - ours['before']:.0f}, file {size_mib:.0f}) -> {ours['after']:.0f} after encoding "
          f"(+{ours['after'] - ours['loaded']:.0f})")

    seeds = list(range(args.repeat))
    port = free_port()
    results = {"gguf-serve": serve([sys.executable, "-m", "gguf_serve.server.cli", text, "--mmproj", mmproj, "--port",
                                    str(port), "--threads", str(args.threads), "--parallel", "2", "--ctx-size",
                                    "4096"], f"http://127.0.0.1:{port}", os.path.basename(text), seeds)}
    if tool("llama-server"):
        port = free_port()
        results["llama-server"] = serve([tool("llama-server"), "-m", text, "--mmproj", mmproj, "--port", str(port),
                                         "-t", str(args.threads), "-np", "2", "-c", "8192", "--jinja"],
                                        f"http://127.0.0.1:{port}", "model", seeds)
    print(f"\nchat with one image over HTTP (streamed, TTFT ms); medians of {args.repeat} images")
    med = {}
    for name, rs in results.items():
        first, follow = statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs)
        med[name] = (first, follow)
        u1, u2 = rs[-1][2], rs[-1][3]
        print(f"  {name:14s} image + question {first:8.0f}   follow-up {follow:7.0f} ({follow / first:.2f}x)   "
              f"prompt tokens {u1.get('prompt_tokens')} / {u2.get('prompt_tokens')} "
              f"(cached {(u2.get('prompt_tokens_details') or {}).get('cached_tokens')})")
    if "llama-server" in med:
        (a1, a2), (b1, b2) = med["gguf-serve"], med["llama-server"]
        print(f"  gguf-serve / llama-server: {a1 / b1:.2f}x first turn, {a2 / b2:.2f}x follow-up (lower is faster)")


if __name__ == "__main__":
    main()
