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

from gguf_serve.engine import load_model
from gguf_serve.engine.batch import Batch
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.generate import prompt_for
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.scheduler import Request, Scheduler
from gguf_serve.engine.vision import ImageError, VisionFileError, decode_image, media_of

from tiny_models import spec, random_model, write_gguf
from tiny_vision import tiny_gemma3_vlm


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
    return load_model(vlm.text_path, config=EngineConfig(mmproj=vlm.vision_path, n_ctx=512, n_seq=3, **kw))


def reference(vlm, ids: list[int], pixels: list[torch.Tensor]) -> torch.Tensor:
    """transformers' logits for a prompt whose media tokens are the model's image tokens."""
    hf = torch.tensor([[vlm.image_token_id if t < 0 else t for t in ids]])
    with torch.no_grad():
        return vlm.model(input_ids=hf, pixel_values=torch.stack(pixels),
                         token_type_ids=(hf == vlm.image_token_id).long()).logits[0]


def engine_logits(lm, msgs) -> tuple[torch.Tensor, list[int], dict]:
    ids, media = prompt_for(lm, msgs)
    slot = lm.cache.allocate()
    try:
        emb = {k: lm.vision.encode(img) for k, img in media.items()}
        return lm.forward(Batch.of([(slot, ids, 0)], "all", media=emb)), ids, media
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
    lm = load_model(f32.text_path, config=EngineConfig(n_ctx=256, n_seq=1))
    with pytest.raises(ImageError, match="no vision file"):
        prompt_for(lm, chat(png(0)))


def test_mismatched_vision_files_are_refused_at_load(tmp_path, f32):
    with pytest.raises(VisionFileError, match="not a vision file"):
        load_model(f32.text_path, config=EngineConfig(mmproj=f32.text_path, n_ctx=256, n_seq=1))
    s = spec("qwen3")
    other = tmp_path / "qwen3.gguf"
    write_gguf(s, random_model(s), other, "F32")
    with pytest.raises(VisionFileError, match="goes with gemma3 text models, not qwen3"):
        load_model(str(other), config=EngineConfig(mmproj=f32.vision_path, n_ctx=256, n_seq=1))


def test_vision_writer_is_the_converter(tmp_path):
    """llama.cpp's own converter (convert_hf_to_gguf.py --mmproj, from the llama-cpp-python
    0.3.36 sdist that .ci/run unpacks and names in LLAMA_CPP_SRC) on the same tiny
    transformers model writes the keys and tensors tiny_vision writes, byte for byte."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file, save_file

    from gguf_serve.gguf_io import GGUFReader
    from tiny_vision import gemma3_vlm_config, write_gemma3_mmproj, _randomize
    from transformers import Gemma3ForConditionalGeneration

    src = os.environ.get("LLAMA_CPP_SRC")
    if not src or not os.path.exists(os.path.join(src, "convert_hf_to_gguf.py")):
        if os.environ.get("CI"):
            pytest.fail("LLAMA_CPP_SRC (llama.cpp's source with its converter) is not set; .ci/run sets it")
        pytest.skip("LLAMA_CPP_SRC is not set (.ci/run unpacks llama.cpp's converter; skipped here)")
    model = Gemma3ForConditionalGeneration(gemma3_vlm_config()).eval()
    _randomize(model, 3)
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
    for ftype in ("f32", "f16", "q8_0"):
        theirs, ours = tmp_path / f"theirs-{ftype}.gguf", tmp_path / f"ours-{ftype}.gguf"
        subprocess.run([sys.executable, os.path.join(src, "convert_hf_to_gguf.py"), str(hf), "--mmproj", "--outtype",
                        ftype, "--outfile", str(theirs)], check=True, env=env, capture_output=True)
        write_gemma3_mmproj(model, ours, ftype.upper())
        a, b = GGUFReader(str(ours)), GGUFReader(str(theirs))
        skip = {"general.name", "general.size_label", "general.quantization_version"}
        assert {k: v for k, v in a.metadata.items() if k not in skip} == \
            {k: v for k, v in b.metadata.items() if k not in skip}
        assert sorted(a.tensors) == sorted(b.tensors)
        for name, t in a.tensors.items():
            u = b.tensors[name]
            assert (t.shape, t.ggml_type) == (u.shape, u.ggml_type), name
            assert np.array_equal(np.asarray(t.data), np.asarray(u.data)), name
