"""llama.cpp's mtmd (what llama-server --mmproj runs) on a prompt with media, in a child
process (a crash inside llama.cpp fails the calling test only): the chunks it makes of the
prompt, each media chunk's embeddings, the prompt's last logits and the first greedy
tokens. The oracle for the engine's image and audio input."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from helpers import no_llama_cpp

MARKER = "<__media__>"  # mtmd_default_marker(): where each media item goes in the prompt

MTMD_RUN = r"""
import ctypes, json, sys
import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp as m

job = json.loads(open(sys.argv[1]).read())
N_CTX = N_BATCH = job["n_ctx"]
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
mp.n_gpu_layers = 0
model = llama_cpp.llama_model_load_from_file(job["text"].encode(), mp)
assert model, "llama.cpp did not load the text file " + job["text"]
cp = llama_cpp.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch = N_CTX, N_BATCH, N_BATCH  # a media chunk decodes in one batch
cp.n_threads = cp.n_threads_batch = 2
cp.no_perf = True
if job["f32"]:  # llama-server -fa off -ctk f32 -ctv f32
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.type_k = cp.type_v = 0  # GGML_TYPE_F32
lctx = llama_cpp.llama_init_from_model(model, cp)
assert lctx, "llama.cpp did not make a context"
p = m.mtmd_context_params_default()
p.use_gpu, p.print_timings, p.n_threads, p.warmup = False, False, 2, False
# (warmup off or not, a tower settles "auto" flash attention by a warmup pass on its first encode)
if job["f32"]:
    p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
mctx = m.mtmd_init_from_file(job["mmproj"].encode(), model, p)
assert mctx, "mtmd did not load the mmproj file " + job["mmproj"]
assert m.mtmd_default_marker().decode() == job["marker"], m.mtmd_default_marker()

bitmaps = []
for item in job["media"]:
    data = open(item["path"], "rb").read()
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    if "width" in item:
        bitmap = m.mtmd_bitmap_init(item["width"], item["height"], buf)
    else:
        bitmap = m.mtmd_helper_bitmap_init_from_buf(mctx, buf, len(data), False, None)
    assert bitmap, "mtmd could not decode media item %d (%s)" % (len(bitmaps), item["path"])
    bitmaps.append(bitmap)

prompt = job["prompt"].encode()
text_in = m.mtmd_input_text(prompt, len(prompt), True, True)
chunks = m.mtmd_input_chunks_init()
arr = (m.mtmd_bitmap_p_ctypes * max(len(bitmaps), 1))(*bitmaps)
rc = m.mtmd_tokenize(mctx, chunks, ctypes.byref(text_in), arr, len(bitmaps))
assert rc == 0, "mtmd_tokenize returned %d (1: markers and media differ in number, 2: media failed to preprocess)" % rc

n_embd = llama_cpp.llama_model_n_embd(model)
n_inp = llama_cpp.llama_model_n_embd_inp(model)  # wider than n_embd where media carry deepstack slices (Qwen3-VL)
kinds = {m.MTMD_INPUT_CHUNK_TYPE_TEXT: "text", m.MTMD_INPUT_CHUNK_TYPE_IMAGE: "image",
         m.MTMD_INPUT_CHUNK_TYPE_AUDIO: "audio"}
out = {"chunks": [], "embeddings": [], "n_embd": n_embd}
for i in range(m.mtmd_input_chunks_size(chunks)):
    chunk = m.mtmd_input_chunks_get(chunks, i)
    kind = kinds[m.mtmd_input_chunk_get_type(chunk)]
    n = m.mtmd_input_chunk_get_n_tokens(chunk)
    entry = {"type": kind, "n_tokens": n, "n_pos": m.mtmd_input_chunk_get_n_pos(chunk)}
    if kind == "text":
        count = ctypes.c_size_t(0)
        toks = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
        entry["tokens"] = [toks[j] for j in range(count.value)]
    else:
        assert m.mtmd_encode_chunk(mctx, chunk) == 0, "mtmd could not encode chunk %d" % i
        embd = np.ctypeslib.as_array(m.mtmd_get_output_embd(mctx), shape=(n * n_inp,)).reshape(n, n_inp)
        out["embeddings"].append(embd.tolist())
        entry["non_causal"] = bool(m.mtmd_decode_use_non_causal(mctx, chunk))
    out["chunks"].append(entry)

n_past = llama_cpp.llama_pos(0)
rc = m.mtmd_helper_eval_chunks(mctx, lctx, chunks, 0, 0, N_BATCH, True, ctypes.byref(n_past))
assert rc == 0, "mtmd_helper_eval_chunks returned %d" % rc
out["n_past"] = n_past.value
vocab = llama_cpp.llama_model_get_vocab(model)
n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)

def last_logits():
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lctx, -1), shape=(n_vocab,)).copy()

logits = last_logits()
out["logits"] = logits.tolist()
greedy = [int(logits.argmax())]
batch = llama_cpp.llama_batch_init(1, 0, 1)
pos = n_past.value
while len(greedy) < job["n_predict"]:
    batch.n_tokens = 1
    batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.logits[0] = greedy[-1], pos, 1, True
    batch.seq_id[0][0] = 0
    assert llama_cpp.llama_decode(lctx, batch) == 0, "llama_decode failed at position %d" % pos
    pos += 1
    greedy.append(int(last_logits().argmax()))
out["greedy"] = greedy
llama_cpp.llama_batch_free(batch)
for b in bitmaps:
    m.mtmd_bitmap_free(b)
m.mtmd_input_chunks_free(chunks)
m.mtmd_free(mctx)
llama_cpp.llama_free(lctx)
llama_cpp.llama_model_free(model)
open(sys.argv[2], "w").write(json.dumps(out))
"""


def mtmd_prompt(rendered: str, media_tokens: Iterable[str], bos: str | None = None) -> str:
    """A chat template's output as llama-server hands it to mtmd: each media placeholder the
    template wrote (tiny_media's GEMMA4_MEDIA_TOKENS values, say) becomes MARKER, and a
    leading `bos` is dropped (mtmd's tokenizer adds the BOS the file asks for)."""
    if bos and rendered.startswith(bos):
        rendered = rendered[len(bos):]
    for token in media_tokens:
        rendered = rendered.replace(token, MARKER)
    return rendered


def mtmd_available() -> None:
    """Skip (fail in CI) where llama-cpp-python or its mtmd library is missing."""
    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except (ImportError, OSError, FileNotFoundError, RuntimeError):
        no_llama_cpp()


def mtmd_run(text_path: str, mmproj_path: str, prompt: str, media: list[bytes | tuple[int, int, bytes]],
             n_predict: int = 4, n_ctx: int = 2048, f32: bool = False, timeout: float = 300) -> dict:
    """What llama.cpp's mtmd makes of `prompt`, which holds MARKER once per item of `media`
    (a file's bytes: PNG, JPEG, WAV, MP3, FLAC, decoded as mtmd_helper_bitmap_init_from_buf
    decodes them, audio resampled to the projector's rate; or (width, height, RGB bytes)),
    tokenized with BOS and special tokens parsed, in a context of `n_ctx` positions on two
    CPU threads, with llama-server's defaults: flash attention where the CPU has it (in
    the towers too, whose attention then rounds K and V to half precision: media
    embeddings about 1e-3 off float32 ones) and a float16 KV cache. With `f32`, flash
    attention off and a float32 KV cache (llama-server -fa off -ctk f32 -ctv f32): float32
    all through but for the vision patch convolution, which ggml_conv_2d always computes
    on half-precision pixels and weights. Returns:

    - chunks: [{"type": "text" | "image" | "audio", "n_tokens", "n_pos", "tokens" (text),
      "non_causal" (media: whether the text model attends both ways inside it)}]
    - embeddings: per media chunk, its encoded embeddings (n_tokens lists of the model's input
      width: n_embd, or n_embd x (1 + deepstack layers) for Qwen3-VL)
    - logits: the last prompt position's logits, after mtmd_helper_eval_chunks has decoded
      every chunk (each media chunk in one batch)
    - greedy: `n_predict` greedy tokens (argmax of those logits, then of each following
      single-token decode)
    - n_past: the positions the prompt takes; n_embd: the text model's width"""
    mtmd_available()
    with tempfile.TemporaryDirectory(prefix="mtmd-oracle-") as tmp:
        items = []
        for i, item in enumerate(media):
            path = Path(tmp) / f"media-{i}"
            if isinstance(item, tuple):
                width, height, raw = item
                assert len(raw) == width * height * 3, f"media {i}: {len(raw)} bytes is not {width}x{height} RGB"
                path.write_bytes(raw)
                items.append({"path": str(path), "width": width, "height": height})
            else:
                path.write_bytes(item)
                items.append({"path": str(path)})
        job = {"text": str(text_path), "mmproj": str(mmproj_path), "prompt": prompt, "media": items,
               "n_predict": n_predict, "n_ctx": n_ctx, "f32": f32, "marker": MARKER}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        result = Path(tmp) / "out.json"
        p = subprocess.run([sys.executable, "-c", MTMD_RUN, str(Path(tmp) / "job.json"), str(result)],
                           capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0 and result.exists(), f"mtmd failed (exit {p.returncode}): {p.stderr[-4000:]}"
        return json.loads(result.read_text())
