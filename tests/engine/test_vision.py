"""Images in: a tiny random Gemma 3 vision-language model (transformers' config) written as
a text file plus a vision file in llama.cpp's converter layout (tiny_vision.py). The
engine's image features and the logits of prompts with images equal transformers' model
on the same pixels; the scheduler keeps images whole, encodes them a layer per step
beside other streams, and reuses a cached image's state; bad images and mismatched
vision files are refused with a message that says why."""

from __future__ import annotations

import io
from collections import deque

import numpy as np
import pytest
import torch
from PIL import Image

from gguf_serve.engine import WeightError, load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.generate import prompt_for
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import Request, Scheduler
from gguf_serve.engine.vision import ImageError, RopePlan, VisionFileError, decode_image, media_of

from helpers import copy_gguf
from tiny_models import spec, random_model, write_gguf
from tiny_vision import tiny_gemma3_vlm, tiny_qwen35_vlm


def png(seed: int = 0, size=(70, 50), fmt: str = "PNG") -> bytes:
    a = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, fmt)
    return buf.getvalue()


def chat(*images: bytes, text: str = "what is it") -> list[dict]:
    parts = [{"type": "text", "text": "look"}] + [{"type": "image", "image": b} for b in images]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


@pytest.fixture(scope="module")
def f32(tmp_path_factory):
    return tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm32"))


def load(vlm, **kw):
    return load_model(vlm.text_path, config=EngineConfig.resolve(mmproj=vlm.vision_path, n_ctx=512, n_seq=3, **kw))


def reference(vlm, ids: list[int], pixels: list[torch.Tensor]) -> torch.Tensor:
    """transformers' logits for a prompt whose media tokens are the model's image tokens."""
    hf = torch.tensor([[vlm.image_token_id if t < 0 else t for t in ids]])
    with torch.no_grad():
        return vlm.model(input_ids=hf, pixel_values=torch.stack(pixels),
                         token_type_ids=(hf == vlm.image_token_id).long()).logits[0]


def engine_logits(lm, msgs, mrope: bool = False) -> tuple[torch.Tensor, list[int], dict]:
    ids, media = prompt_for(lm, msgs)
    slot = lm.cache.allocate()
    try:
        emb = {k: lm.vision.encode(img) for k, img in media.items()}
        ropes = [RopePlan(ids, media).positions(0, len(ids))] if mrope else None
        return lm.forward(Batch.of([(slot, ids, 0)], "all", media=emb, rope_positions=ropes)), ids, media
    finally:
        lm.cache.free(slot)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("text_mix,vision_ftype,tol", [("F32", "F32", 1e-4), ("Q8_0", "F16", 1e-4),
                                                       ("Q4_K_M", "Q8_0", 1e-4), ("F32", "BF16", 1e-4)])
def test_features_and_logits_equal_transformers(tmp_path, text_mix, vision_ftype, tol):
    vlm = tiny_gemma3_vlm(tmp_path, text_mix=text_mix, vision_ftype=vision_ftype)
    lm = load(vlm, kernels="reference")
    msgs = chat(png(1), png(2, size=(30, 90)))
    logits, ids, media = engine_logits(lm, msgs)
    images = [media[media_of(t)[0]] for i, t in enumerate(ids) if t < 0 and media_of(t)[1] == 0]
    assert len(images) == 2 and sum(t < 0 for t in ids) == 2 * vlm.n_tokens
    for img in images:
        with torch.no_grad():
            want = vlm.model.model.get_image_features(img.plan.pixels[None]).pooler_output[0]
        assert rel(lm.vision.encode(img), want) < tol
    want = reference(vlm, ids, [img.plan.pixels for img in images])
    assert rel(logits, want) < tol
    # the image's tokens see each other both ways: a causal-only model is far off
    with torch.no_grad():
        hf = torch.tensor([[vlm.image_token_id if t < 0 else t for t in ids]])
        causal = vlm.model(input_ids=hf, pixel_values=torch.stack([i.plan.pixels for i in images])).logits[0]
    assert rel(logits, causal) > 100 * tol


def test_native_kernels_close_to_transformers(f32):
    lm = load(f32)
    logits, ids, media = engine_logits(lm, chat(png(3)))
    (img,) = media.values()
    assert rel(logits, reference(f32, ids, [img.plan.pixels])) < 1e-4


@pytest.mark.parametrize("family", ["gemma3", "qwen35"])
def test_bfloat16_products_close_to_float32_and_transformers(tmp_path, family):
    """On CPUs that compute bfloat16 natively the towers' F16/BF16 matrices multiply in it
    by default (several times float32's rate): the features stay within bfloat16's rounding
    of the float32 ones, which are transformers' (the tests above; the suite runs float32
    towers: conftest)."""
    make = tiny_gemma3_vlm if family == "gemma3" else tiny_qwen35_vlm
    vlm = make(tmp_path, vision_ftype="F16")
    data = png(7, size=(64, 64))
    feats = {}
    for dt in ("float32", "bfloat16"):
        lm = load(vlm, vision_dtype=dt)
        feats[dt] = lm.vision.encode(lm.vision.prepare(data))
    assert not torch.equal(feats["float32"], feats["bfloat16"])  # the products did change dtype
    assert rel(feats["bfloat16"], feats["float32"]) < 3e-2
    cos = torch.nn.functional.cosine_similarity(feats["bfloat16"], feats["float32"], dim=-1)
    assert float(cos.min()) > 0.999


def test_the_towers_products_default_to_bfloat16_where_the_cpu_computes_it():
    from gguf_serve.engine.vision import vision_products

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert vision_products(None, cpu, native=True) is torch.bfloat16
    assert vision_products(None, cpu, native=False) is None
    assert vision_products("float32", cpu, native=True) is None
    assert vision_products("bfloat16", cpu, native=False) is torch.bfloat16
    assert vision_products(None, cuda, native=True) is None  # the GPU's own dtype
    with pytest.raises(ValueError, match="vision_dtype='float16'.*GGUF_SERVE_VISION_DTYPE"):
        EngineConfig(vision_dtype="float16")


def test_preprocessing_is_transformers_image_processor(f32):
    """Resize (bilinear), rescale and normalize as Gemma 3's image processor does."""
    from transformers import Gemma3ImageProcessorPil

    lm = load(f32, kernels="reference")
    data = png(4, size=(97, 41))
    proc = Gemma3ImageProcessorPil(size={"height": f32.image_size, "width": f32.image_size},
                                   image_mean=[0.5] * 3, image_std=[0.5] * 3)
    want = proc(Image.open(io.BytesIO(data)), return_tensors="pt")["pixel_values"][0]
    got = lm.vision.prepare(data).plan.pixels
    assert got.shape == want.shape and float((got - want).abs().max()) < 1e-5


def test_generate_with_an_image_is_transformers_greedy(f32):
    lm = load(f32, kernels="reference")
    msgs = chat(png(5))
    got = [s.token_id for s in lm.generate(msgs, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))]
    ids, media = prompt_for(lm, msgs)
    (img,) = media.values()
    want = []
    for _ in range(6):
        want.append(int(reference(f32, ids + want, [img.plan.pixels])[-1].argmax()))
    assert got == want


def run(sched: Scheduler, reqs: list[Request]) -> int:
    for r in reqs:
        sched.add(r)
    steps = 0
    while sched.busy:
        sched.step()
        steps += 1
    return steps


def request(lm, msgs, n: int = 4, out=None):
    ids, media = prompt_for(lm, msgs)
    out = out if out is not None else deque()
    p = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, speculative="off")
    return Request(ids, [p], out.append, media=media), out


def tokens(out) -> list[int]:
    return [s.token_id for s in out if s is not None and not isinstance(s, Exception)]


def test_image_reused_from_the_prefix_cache_and_not_encoded_again(f32):
    lm = load(f32, kernels="reference")
    sched = Scheduler(lm)
    first, out1 = request(lm, chat(png(6)))
    run(sched, [first])
    calls = []
    encode = lm.vision.tower.encode_steps
    lm.vision.tower.encode_steps = lambda plan: (calls.append(1), (yield from encode(plan)))[1]
    lm.vision.encoded.clear()  # the tower would run again, were the image needed
    follow = chat(png(6), text="what is it") + [{"role": "assistant", "content": "a thing"},
                                                {"role": "user", "content": "and its colour"}]
    second, out2 = request(lm, follow)
    run(sched, [second])
    cached = [s for s in out2 if s is not None][-1].cached_tokens
    n_image_end = max(i for i, t in enumerate(second.prompt_ids) if t < 0) + 1
    assert cached >= n_image_end and calls == []
    # a different image at the same place is not a hit past the text before it
    third, out3 = request(lm, chat(png(7)))
    run(sched, [third])
    first_image = min(i for i, t in enumerate(third.prompt_ids) if t < 0)
    assert [s for s in out3 if s is not None][-1].cached_tokens <= first_image and calls == [1]


def test_image_whole_in_small_chunks_beside_decoding_streams(f32):
    """With another stream decoding and 8-token prompt chunks, the 16-token image goes in
    one forward, its tower runs a layer per step, and the output is the image's alone."""
    lm = load(f32, kernels="reference")
    alone, out_alone = request(lm, chat(png(8)), n=5)
    run(Scheduler(lm, prefix_cache=False), [alone])
    sched = Scheduler(lm, prefill_chunk=8, prefix_cache=False)
    other, _ = request(lm, [{"role": "user", "content": "tell me a long story"}], n=40)
    sched.add(other)
    for _ in range(3):
        sched.step()
    sizes = []
    forward = lm.forward
    lm.forward = lambda b: (sizes.append(b.n_tokens), forward(b))[1]
    together, out_together = request(lm, chat(png(8)), n=5)
    run(sched, [together])
    lm.forward = forward
    assert tokens(out_together) == tokens(out_alone)
    n_layers = len(lm.vision.tower.layers)
    assert max(sizes) >= f32.n_tokens + 1  # the image (and a decode token) in one forward
    assert sizes.count(1) >= n_layers + 1  # decode-only steps while the tower ran layer by layer


def test_bad_images_are_refused_with_the_reason(f32):
    with pytest.raises(ImageError, match="does not decode"):
        decode_image(b"not an image at all")
    with pytest.raises(ImageError, match="limit is 100 bytes"):
        decode_image(png(0), max_bytes=100)
    with pytest.raises(ImageError, match="pixels"):
        decode_image(png(0, size=(200, 200)), max_pixels=1000)
    bmp = io.BytesIO()
    Image.new("RGB", (8, 8)).save(bmp, "BMP")
    with pytest.raises(ImageError, match="does not decode"):
        decode_image(bmp.getvalue())
    for fmt in ("JPEG", "WEBP", "GIF"):
        assert decode_image(png(1, fmt=fmt)).size == (70, 50)
    # a GIF's first frame
    frames = [Image.new("RGB", (10, 10), c) for c in ((255, 0, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    assert decode_image(buf.getvalue()).getpixel((5, 5))[0] > 200


def test_images_need_a_vision_file(f32):
    lm = load_model(f32.text_path, config=EngineConfig.resolve(n_ctx=256, n_seq=1))
    with pytest.raises(ImageError, match="no vision file"):
        prompt_for(lm, chat(png(0)))


def test_mismatched_vision_files_are_refused_at_load(tmp_path, f32):
    with pytest.raises(VisionFileError, match="not a vision file"):
        load_model(f32.text_path, config=EngineConfig.resolve(mmproj=f32.text_path, n_ctx=256, n_seq=1))
    s = spec("qwen3")
    other = tmp_path / "qwen3.gguf"
    write_gguf(s, random_model(s), other, "F32")
    with pytest.raises(VisionFileError, match="goes with gemma3 text models, not qwen3"):
        load_model(str(other), config=EngineConfig.resolve(mmproj=f32.vision_path, n_ctx=256, n_seq=1))


@pytest.mark.parametrize("family", ["gemma3", "qwen35"])
def test_vision_writer_is_the_converter(tmp_path, family):
    """llama.cpp's own converter (convert_hf_to_gguf.py --mmproj, from the llama-cpp-python
    0.3.36 sdist that .ci/run unpacks and names in LLAMA_CPP_SRC) on the same tiny
    transformers model writes the keys and tensors tiny_vision writes, byte for byte."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    from gguf_serve.gguf_io import GGUFReader
    import tiny_vision

    src = os.environ.get("LLAMA_CPP_SRC")
    if not src or not os.path.exists(os.path.join(src, "convert_hf_to_gguf.py")):
        if os.environ.get("CI"):
            pytest.fail("LLAMA_CPP_SRC (llama.cpp's source with its converter) is not set; .ci/run sets it")
        pytest.skip("LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's converter; skipped here)")
    (tmp_path / "ours").mkdir()
    if family == "gemma3":
        model, write = tiny_gemma3_vlm(tmp_path / "ours").model, tiny_vision.write_gemma3_mmproj
    else:
        model, write = tiny_qwen35_vlm(tmp_path / "ours").model, tiny_vision.write_qwen35_mmproj
    hf = tmp_path / "hf"
    model.save_pretrained(hf)
    (hf / "preprocessor_config.json").write_text('{"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], '
                                                 '"image_seq_length": 16}')
    weights = hf / "model.safetensors"  # the Hub's checkpoint names (transformers 5 saves its own)
    state = {(k.replace("vision_tower.", "vision_tower.vision_model.", 1)
              if k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model.") else k): v.contiguous()
             for k, v in load_file(weights).items()}
    save_file(state, weights, metadata={"format": "pt"})
    env = {**os.environ, "PYTHONPATH": os.path.join(src, "gguf-py")}
    for ftype in ("f32", "f16", "q8_0", "bf16"):
        theirs, ours = tmp_path / f"theirs-{ftype}.gguf", tmp_path / f"ours-{ftype}.gguf"
        subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), str(hf), "--mmproj", "--outtype",
                        ftype, "--outfile", str(theirs)], check=True, env=env, capture_output=True)
        write(model, ours, ftype.upper())
        a, b = GGUFReader(str(ours)), GGUFReader(str(theirs))
        skip = {"general.name", "general.size_label", "general.quantization_version"}
        assert {k: v for k, v in a.metadata.items() if k not in skip} == \
            {k: v for k, v in b.metadata.items() if k not in skip}
        assert sorted(a.tensors) == sorted(b.tensors)
        for name, t in a.tensors.items():
            u = b.tensors[name]
            assert (t.shape, t.ggml_type) == (u.shape, u.ggml_type), name
            assert np.array_equal(np.asarray(t.data), np.asarray(u.data)), name


# ----------------------------------------------------------------------------- Qwen3.5


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return tiny_qwen35_vlm(tmp_path_factory.mktemp("qwen35vl"))


def qwen_pixels(plan, ps: int = 16, m: int = 2):
    """transformers' pixel_values and image_grid_thw for a plan: patches in merge-block order,
    each (channels, 2 frames, ps, ps) with the frame repeated, as its processor writes them."""
    from gguf_serve.engine.models.qwen35_vision import merge_order

    rows, cols = plan.grid[0] * m, plan.grid[1] * m
    p = torch.nn.functional.unfold(plan.pixels[None], ps, stride=ps)[0].T[merge_order(rows, cols, m)]
    p = p.reshape(-1, 3, 1, ps, ps).expand(-1, 3, 2, ps, ps)
    return p.reshape(p.shape[0], -1), torch.tensor([[1, rows, cols]])


def qwen_reference(vlm, ids: list[int], plans: list) -> torch.Tensor:
    hf = torch.tensor([[vlm.image_token_id if t < 0 else t for t in ids]])
    pixels = [qwen_pixels(p) for p in plans]
    vlm.model.model.rope_deltas = None  # transformers keeps them between calls
    with torch.no_grad():
        return vlm.model(input_ids=hf, pixel_values=torch.cat([p for p, _ in pixels]),
                         image_grid_thw=torch.cat([g for _, g in pixels]),
                         mm_token_type_ids=(hf == vlm.image_token_id).int()).logits[0]


def images_of(ids, media) -> list:
    return [media[media_of(t)[0]] for t in ids if t < 0 and media_of(t)[1] == 0]


@pytest.mark.parametrize("text_mix,vision_ftype", [("F32", "F32"), ("Q8_0", "F16"), ("Q4_K_M", "Q8_0"),
                                                   ("F32", "BF16")])
def test_qwen35_features_and_logits_equal_transformers(tmp_path, text_mix, vision_ftype):
    """The Qwen3-VL tower (2-D rotary, resampled positions, 2x2 merger) and the text model's
    multi-section rotary positions for the image and the text after it."""
    vlm = tiny_qwen35_vlm(tmp_path, text_mix=text_mix, vision_ftype=vision_ftype)
    lm = load(vlm, kernels="reference")
    logits, ids, media = engine_logits(lm, chat(png(1, size=(150, 100)), png(2, size=(40, 300))), mrope=True)
    plans = [img.plan for img in images_of(ids, media)]
    assert len(plans) == 2 and plans[0].grid != plans[1].grid
    for img in images_of(ids, media):
        pv, thw = qwen_pixels(img.plan)
        with torch.no_grad():
            want = vlm.model.model.get_image_features(pv, thw).pooler_output[0]
        assert rel(lm.vision.encode(img), want) < 1e-4
    want = qwen_reference(vlm, ids, plans)
    assert rel(logits, want) < 1e-4
    plain, _, _ = engine_logits(lm, chat(png(1, size=(150, 100)), png(2, size=(40, 300))), mrope=False)
    assert rel(plain, want) > 1e-2  # the image positions matter


def test_qwen35_preprocessing_is_transformers_processor(qwen):
    from transformers import Qwen2VLImageProcessorPil

    lm = load(qwen, kernels="reference")
    proc = Qwen2VLImageProcessorPil(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": 65536, "longest_edge": 1003520})
    for size in ((150, 100), (1200, 900), (33, 500)):
        data = png(3, size=size)
        plan = lm.vision.prepare(data).plan
        want = proc(Image.open(io.BytesIO(data)), return_tensors="pt")
        pv, thw = qwen_pixels(plan)
        assert thw.tolist() == want["image_grid_thw"].tolist()
        assert float((pv - want["pixel_values"]).abs().max()) < 1e-5
    high, low = (lm.vision.prepare(png(4, size=(1600, 1200)), d).n_tokens for d in ("high", "low"))
    auto = lm.vision.prepare(png(4, size=(1600, 1200))).n_tokens
    assert low < auto < high and low <= 262144 // 1024


def test_qwen35_generate_with_images_is_transformers_greedy(qwen):
    lm = load(qwen, kernels="reference")
    msgs = chat(png(5, size=(120, 90)))
    got = [s.token_id for s in lm.generate(msgs, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True,
                                                                speculative="off"))]
    ids, media = prompt_for(lm, msgs)
    plans = [img.plan for img in images_of(ids, media)]
    want = []
    for _ in range(6):
        want.append(int(qwen_reference(qwen, ids + want, plans)[-1].argmax()))
    assert got == want


def test_qwen35_image_split_between_chunks_beside_a_stream(qwen):
    """Qwen3.5's image tokens are causal: an image may run over several prompt chunks (and be
    longer than a forward pass), with the same output as in one."""
    lm = load(qwen, kernels="reference")
    msgs = chat(png(6, size=(200, 150)))
    alone, out_alone = request(lm, msgs, n=5)
    run(Scheduler(lm, prefix_cache=False), [alone])
    sched = Scheduler(lm, prefill_chunk=16, prefix_cache=False)
    other, _ = request(lm, [{"role": "user", "content": "tell me a long story"}], n=60)
    sched.add(other)
    sched.step()
    sizes = []
    forward = lm.forward
    lm.forward = lambda b: (sizes.append(b.n_tokens), forward(b))[1]
    together, out_together = request(lm, msgs, n=5)
    run(sched, [together])
    lm.forward = forward
    n_image = sum(t < 0 for t in together.prompt_ids)
    assert n_image > 17 and max(sizes) <= 17
    assert tokens(out_together) == tokens(out_alone)


def test_qwen35_follow_up_reuses_the_image(qwen):
    lm = load(qwen, kernels="reference")
    sched = Scheduler(lm)
    first = chat(png(7))
    r1, out1 = request(lm, first, n=3)
    run(sched, [r1])
    reply = lm.tokenizer.decode(tokens(out1))
    r2, out2 = request(lm, first + [{"role": "assistant", "content": reply},
                                    {"role": "user", "content": "and its colour"}], n=3)
    run(sched, [r2])
    last_image = max(i for i, t in enumerate(r2.prompt_ids) if t < 0)
    assert [s for s in out2 if s is not None][-1].cached_tokens > last_image


def test_qwen35_native_kernels_close_to_transformers(qwen):
    lm = load(qwen)
    logits, ids, media = engine_logits(lm, chat(png(8, size=(90, 140))), mrope=True)
    assert rel(logits, qwen_reference(qwen, ids, [img.plan for img in images_of(ids, media)])) < 1e-4


# llama.cpp's mtmd (llama-cpp-python built with it) encoding one RGB image with a vision file;
# argv: text file, vision file, width, height, raw RGB path; prints the embeddings as JSON
LLAMA_CPP_ENCODE = """
import ctypes, json, sys
import numpy as np
import llama_cpp
from llama_cpp import mtmd_cpp as m
text, vision, nx, ny, raw = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params()
model = llama_cpp.llama_model_load_from_file(text.encode(), mp)
assert model, "llama.cpp did not load the text file"
p = m.mtmd_context_params_default()
p.use_gpu, p.print_timings, p.n_threads, p.warmup = False, False, 2, False
ctx = m.mtmd_init_from_file(vision.encode(), model, p)
assert ctx, "llama.cpp's mtmd did not load the vision file"
data = np.fromfile(raw, dtype=np.uint8)
buf = (ctypes.c_uint8 * data.size).from_buffer_copy(data.tobytes())
bitmap = m.mtmd_bitmap_init(nx, ny, buf)
prompt = b"look " + m.mtmd_default_marker() + b" here"
text_in = m.mtmd_input_text(prompt, len(prompt), True, True)
chunks = m.mtmd_input_chunks_init()
bitmaps = (ctypes.c_void_p * 1)(bitmap)
assert m.mtmd_tokenize(ctx, chunks, ctypes.byref(text_in), bitmaps, 1) == 0
for i in range(m.mtmd_input_chunks_size(chunks)):
    chunk = m.mtmd_input_chunks_get(chunks, i)
    if m.mtmd_input_chunk_get_type(chunk) == m.MTMD_INPUT_CHUNK_TYPE_IMAGE:
        n = m.mtmd_input_chunk_get_n_tokens(chunk)
        assert m.mtmd_encode_chunk(ctx, chunk) == 0
        width = llama_cpp.llama_model_n_embd(model)
        out = m.mtmd_get_output_embd(ctx)
        print(json.dumps(np.ctypeslib.as_array(out, shape=(n * width,)).reshape(n, width).tolist()))
"""


@pytest.mark.parametrize("family,size", [("gemma3", 64), ("qwen35", 256)])
def test_llama_cpp_mtmd_loads_our_vision_files_and_encodes_the_same(tmp_path, family, size):
    """The vision files we write load in llama.cpp's own loader (mtmd, as llama-server
    --mmproj loads them), and its embeddings of an image (at a size neither resizes)
    equal ours within float rounding."""
    import subprocess
    import sys

    from helpers import no_llama_cpp

    try:
        from llama_cpp import mtmd_cpp  # noqa: F401
    except (ImportError, OSError, FileNotFoundError, RuntimeError):
        no_llama_cpp()
    vlm = (tiny_gemma3_vlm if family == "gemma3" else tiny_qwen35_vlm)(tmp_path)
    lm = load(vlm, kernels="reference")
    rgb = np.random.default_rng(9).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "PNG")
    img = lm.vision.prepare(buf.getvalue())
    ours = lm.vision.encode(img)
    raw = tmp_path / "image.rgb"
    rgb.tofile(raw)
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_ENCODE, vlm.text_path, vlm.vision_path, str(size), str(size),
                        str(raw)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    theirs = torch.tensor(__import__("json").loads(p.stdout.strip().splitlines()[-1]))
    assert theirs.shape == ours.shape
    assert rel(ours, theirs) < 3e-3


def test_vision_weights_stay_in_the_file(f32, qwen):
    """A vision file adds its own size: the towers' unquantized tensors (position tables,
    projections, norms, biases, F32 patch matrices) are views of the map, not copies."""
    for vlm in (f32, qwen):
        v = load(vlm).vision
        base = next(iter(v.reader.tensors.values()))._base
        lo = base.ctypes.data
        hi = lo + base.nbytes
        t = v.tower
        held = ([t.positions, t.proj, t.patch.linear.weight, t.layers[0].ln1[0], t.layers[0].q.bias, t.soft_norm]
                if vlm is f32 else [t.table, t.patch[0].weight, t.patch[1].weight, t.blocks[0].ln2[1], t.fc1.bias])
        for x in held:
            assert lo <= x.data_ptr() < hi, (vlm.vision_path, tuple(x.shape))


def test_deepstack_flags_without_their_mergers_are_refused(tmp_path, qwen):
    """A file whose layers are marked deepstack (Qwen3-VL's) but lacks their mergers is
    refused at load, naming the missing tensor, not run without them."""
    deep = copy_gguf(qwen.vision_path, tmp_path / "mmproj-deepstack.gguf",
                     metadata={"clip.vision.is_deepstack_layers": [True, False]})
    with pytest.raises(WeightError, match="v.deepstack.0.norm.weight"):
        load_model(qwen.text_path, config=EngineConfig.resolve(mmproj=deep, n_ctx=256, n_seq=1))