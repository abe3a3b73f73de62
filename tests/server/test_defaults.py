"""The user's defaults, end to end. The suite's conftest keeps float32 KV rows and float32
vision towers for its comparisons with transformers; this module starts its servers
without those settings, so they run what a user gets with no options: f16 KV rows, and
bfloat16 products in the vision towers where the CPU multiplies bfloat16 natively.

Checked through the real openai client: the load log names those defaults; Gemma's
greedy tokens and their log-probabilities are the engine's with f16 rows, and within
f16's rounding of float32 rows; streamed, batched and prefix-cached replies equal the plain one; a
vision model answers an image the same way twice, streamed or not."""

from __future__ import annotations

import contextlib
import re
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from gguf_serve.engine import load_model
from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.sampling import SamplingParams
from gguf_serve.engine.generate import generate
from server_harness import OUTPUTS, server
from tiny_vision import data_url, image, tiny_gemma3_vlm, user

# the conftest's settings for the rest of the suite, removed here
TEST_ONLY = ("GGUF_SERVE_CACHE_TYPE_K", "GGUF_SERVE_CACHE_TYPE_V", "GGUF_SERVE_VISION_DTYPE")
PROMPT = "The three primary colors are"
N = 24


def cpu_flags() -> set[str]:
    with open("/proc/cpuinfo") as f:
        line = next((x for x in f if x.startswith(("flags", "Features"))), "")
    return set(line.partition(":")[2].split())


@contextlib.contextmanager
def user_server(*args: str):
    """`server(*args)` started with the environment a user has (the process copies it at start)."""
    with pytest.MonkeyPatch.context() as mp:
        for var in TEST_ONLY:
            mp.delenv(var, raising=False)
        started = server(*args)
        base = started.__enter__()
    try:
        yield base
    finally:
        started.__exit__(None, None, None)


@pytest.fixture(scope="module")
def gemma_base(gemma_path):
    with user_server(gemma_path, "--parallel", "2", "--ctx-size", "512") as base:
        yield base


@pytest.fixture(scope="module")
def gemma(gemma_base):
    return openai.OpenAI(base_url=f"{gemma_base}/v1", api_key="x")


def complete(client, **extra):
    return client.completions.create(model=client.models.list().data[0].id,
                                     prompt=PROMPT, max_tokens=N, temperature=0, **extra)


def test_load_log_names_f16_rows(gemma_base):
    log = OUTPUTS[gemma_base]()
    assert "(k f16, v f16)" in log, log


def engine_steps(gemma_path, rows: str):
    lm = load_model(gemma_path, n_ctx=256, n_seq=1, config=EngineConfig(cache_type_k=rows, cache_type_v=rows))
    assert f"(k {rows}, v {rows})" in lm.cache.describe()
    return [s for s in generate(lm, PROMPT, SamplingParams(temperature=0, max_tokens=N, logprobs=0))
            if s.token_id is not None]


def test_greedy_is_the_engines_with_f16_rows(gemma, gemma_path):
    reply = complete(gemma, logprobs=1).choices[0]
    got = reply.logprobs.token_logprobs
    assert len(got) == N and reply.finish_reason == "length"
    f16, f32 = engine_steps(gemma_path, "f16"), engine_steps(gemma_path, "f32")
    # the engine in-process with f16 rows: the same tokens and log-probabilities
    assert reply.text == "".join(s.text for s in f16) == "".join(s.text for s in f32)
    assert max(abs(a - s.logprob) for a, s in zip(got, f16)) < 1e-3
    # float32 rows: the same greedy tokens, log-probabilities within f16's rounding (Gemma's keys are
    # large: up to 0.13 here) and not the same ones (the server did not keep float32 rows)
    off = [abs(a - s.logprob) for a, s in zip(got, f32)]
    assert 0.01 < max(off) < 0.3, off


def test_stream_batch_and_prefix_cache_equal_plain(gemma):
    plain = complete(gemma).choices[0].text
    streamed = "".join(c.choices[0].text for c in complete(gemma, stream=True) if c.choices)
    with ThreadPoolExecutor(2) as pool:  # two at once: one batched forward a step (--parallel 2)
        batched = [f.result().choices[0].text for f in [pool.submit(complete, gemma) for _ in range(2)]]
    again = complete(gemma)  # the prompt's tokens from the prefix cache
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert streamed == plain and batched == [plain, plain] and again.choices[0].text == plain


@pytest.fixture(scope="module")
def vlm_base(tmp_path_factory):
    vlm = tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm-defaults"), text_mix="Q8_0", vision_ftype="F16")
    with user_server(vlm.text_path, "--ctx-size", "1024") as base:
        yield base


def test_vision_towers_default_dtype(vlm_base):
    native = bool(cpu_flags() & {"avx512_bf16", "amx_bf16"})
    said = re.search(r"mmproj file .*", OUTPUTS[vlm_base]())
    assert said, OUTPUTS[vlm_base]()
    assert ("multiplied in bfloat16" in said.group(0)) == native, said.group(0)
    client = openai.OpenAI(base_url=f"{vlm_base}/v1", api_key="x")
    model = client.models.list().data[0].id
    ask = dict(model=model, messages=[user(image(data_url(3)))], max_tokens=12, temperature=0)
    first = client.chat.completions.create(**ask)
    assert first.choices[0].finish_reason == "length" and first.usage.completion_tokens == 12
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**ask, stream=True)
                       if c.choices)
    again = client.chat.completions.create(**ask)
    assert streamed == first.choices[0].message.content == again.choices[0].message.content
