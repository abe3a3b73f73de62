"""llama-server's own endpoints on a real server with a tiny random model that has
fill-in-the-middle tokens: /completion (its fields and reply: `content`, `tokens`,
`stop_type`, `timings`, `completion_probabilities`, a GBNF grammar, a JSON schema, token
ids as the prompt, a stream), /infill (its prompt as llama.cpp's own vocabulary builds
it), /apply-template and /props; and Ollama's `suffix` through the same prompt."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema
import ollama
import pytest

from gguf_serve.engine import infill_ids, load_model
from helpers import no_llama_cpp
from server_harness import THINKING_TEMPLATE, no_end, server
from tiny_models import tiny_chat_model

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
EXTRA = [{"filename": "util.py", "text": "def add(a, b):\n    return a + b\n"}]


@pytest.fixture(scope="module")
def fim_path(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("fim"), "tiny-coder.gguf", 13, THINKING_TEMPLATE, think=True,
                           extra_tokens=FIM)


@pytest.fixture(scope="module")
def base(fim_path):
    with server(fim_path, "--ctx-size", "4096") as b:  # room for the repository chunks (llama-server: n_ctx - 2048)
        yield b


def post(base, path, **body):
    r = httpx.post(f"{base}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_completion_reply_as_llama_server_gives_it(base, fim_path):
    bias = no_end(fim_path)
    r = post(base, "/completion", prompt="the cat", n_predict=4, logit_bias=bias, return_tokens=True, n_probs=2)
    assert r["stop"] is True and r["stop_type"] == "limit" and r["tokens_predicted"] == 4 and len(r["tokens"]) == 4
    assert r["tokens_evaluated"] > 0 and r["model"] == "tiny-coder.gguf" and isinstance(r["content"], str)
    assert set(r["timings"]) >= {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                                 "predicted_per_second", "cache_n"} and r["timings"]["predicted_n"] == 4
    probs = r["completion_probabilities"]
    assert [p["id"] for p in probs] == r["tokens"] and all(len(p["top_logprobs"]) <= 2 for p in probs)
    assert r["generation_settings"]["n_predict"] == 4
    ids = post(base, "/tokenize", content="the cat")["tokens"]
    by_ids = post(base, "/completion", prompt=ids, n_predict=1, logit_bias=bias)
    assert by_ids["tokens_evaluated"] == len(ids)
    stopped = post(base, "/completion", prompt="the cat", n_predict=30, stop=[r["content"][:1] or "x"], seed=1,
                   logit_bias=bias)
    assert stopped["stop_type"] in ("word", "limit")


def stream(base, **body):
    with httpx.stream("POST", f"{base}/completion", timeout=120, json={**body, "stream": True}) as r:
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_completion_stream(base, fim_path):
    chunks = stream(base, prompt="the cat", n_predict=5, logit_bias=no_end(fim_path))
    assert chunks[-1]["stop"] is True and not any(c["stop"] for c in chunks[:-1])
    assert chunks[-1]["tokens_predicted"] == 5 and chunks[-1]["timings"]["predicted_n"] == 5
    whole = post(base, "/completion", prompt="the cat", n_predict=5, logit_bias=no_end(fim_path), temperature=0)
    again = stream(base, prompt="the cat", n_predict=5, temperature=0, logit_bias=no_end(fim_path))
    assert "".join(c["content"] for c in again) == whole["content"]


def test_grammar_and_json_schema(base):
    r = post(base, "/completion", prompt="answer:", n_predict=10, grammar='root ::= "yes" | "no"')
    assert r["content"] in ("yes", "no") and r["stop_type"] == "eos"
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"]}
    r = post(base, "/completion", prompt="json:", n_predict=60, json_schema=schema)
    jsonschema.validate(json.loads(r["content"]), schema)
    bad = httpx.post(f"{base}/completion", json={"prompt": "x", "grammar": "root ::= ("}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar"


def test_apply_template_and_props(base):
    r = post(base, "/apply-template", messages=[{"role": "user", "content": "hello there"}])
    assert "hello there" in r["prompt"] and "<|im_start|>" in r["prompt"]
    props = httpx.get(f"{base}/props", timeout=30).json()
    assert props["default_generation_settings"]["n_ctx"] == 4096 and props["total_slots"] >= 1
    assert "<|im_start|>" in props["chat_template"] and props["modalities"] == {"vision": False, "audio": False}


def test_infill_and_ollamas_suffix(base, fim_path):
    r = post(base, "/infill", input_prefix="def f(x):\n    ", input_suffix="\n    return y\n", input_extra=EXTRA,
             n_predict=3, logit_bias=no_end(fim_path))
    assert r["tokens_predicted"] == 3
    for name in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|repo_name|>", "<|file_sep|>util.py"):
        assert name in r["prompt"]
    assert r["prompt"].index("<|fim_suffix|>") > r["prompt"].index("<|fim_prefix|>")
    c = ollama.Client(host=base)
    g = c.generate(model="tiny-coder.gguf", prompt="def f(x):\n    ", suffix="\n    return y\n",
                   options={"num_predict": 2})
    assert g.done and g.prompt_eval_count > 5
    assert "insert" in c.show("tiny-coder.gguf").capabilities


INFILL_ORACLE = """
import sys, json, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
v = llama_cpp.llama_model_get_vocab(m.model)
pre, suf, mid, rep, sep = (f(v) for f in (llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf,
                                           llama_cpp.llama_vocab_fim_mid, llama_cpp.llama_vocab_fim_rep,
                                           llama_cpp.llama_vocab_fim_sep))
tok = lambda s: m.tokenize(s.encode(), add_bos=False, special=False)
prefix, suffix, extra = json.loads(sys.argv[2])
out = [rep] + tok("myproject\\n")
for c in extra:
    out += [sep] + tok(c["filename"] + "\\n") + tok(c["text"])
out += [sep] + tok("filename\\n")
head = [pre] + tok(prefix)
if llama_cpp.llama_vocab_get_add_bos(v):
    head = [llama_cpp.llama_vocab_bos(v)] + head
print(json.dumps(out + head + [suf] + tok(suffix) + [mid]))
"""


def test_the_infill_prompt_is_llama_cpps(fim_path):
    """The FIM tokens found by their names and the texts tokenized as llama.cpp's own
    vocabulary does (llama-cpp-python), in llama-server's layout: the same ids."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        no_llama_cpp()
    prefix, suffix = "def f(x):\n    ", "\n    return y\n"
    p = subprocess.run([sys.executable, "-c", INFILL_ORACLE, fim_path, json.dumps([prefix, suffix, EXTRA])],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lm = load_model(fim_path, device="cpu", n_ctx=4096, n_seq=1)
    assert infill_ids(lm, prefix, suffix, EXTRA) == json.loads(p.stdout)


def test_llama_cpps_samplers_reach_the_engine(base, fim_path):
    """top_n_sigma 0 keeps only the best token: any temperature and seed give greedy's text,
    on /completion and on chat completions; XTC with threshold 0 keeps only the least likely."""
    bias = no_end(fim_path)
    greedy = post(base, "/completion", prompt="the cat", n_predict=6, temperature=0, logit_bias=bias)["content"]
    for seed in (1, 2):
        assert post(base, "/completion", prompt="the cat", n_predict=6, temperature=1.5, seed=seed, top_n_sigma=0,
                    logit_bias=bias)["content"] == greedy
    msgs = [{"role": "user", "content": "hi"}]
    chat = [post(base, "/v1/chat/completions", messages=msgs, max_tokens=6, logit_bias=bias, **kw)["choices"][0]
            ["message"]["content"] for kw in ({"temperature": 0}, {"temperature": 1.5, "seed": 4, "top_n_sigma": 0})]
    assert chat[0] == chat[1]
    r = post(base, "/completion", prompt="the cat", n_predict=4, logit_bias=bias, xtc_probability=1.0,
             xtc_threshold=0.0, n_probs=3, seed=1)
    for p in r["completion_probabilities"]:  # the drawn token is never among the three most likely
        assert p["id"] not in [t["id"] for t in p["top_logprobs"]]


def test_chat_completions_carry_timings(base, fim_path):
    r = post(base, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
             logit_bias=no_end(fim_path), chat_template_kwargs={"enable_thinking": False})
    t = r["timings"]
    assert t["predicted_n"] == r["usage"]["completion_tokens"] == 3 and t["predicted_ms"] > 0
    assert t["prompt_n"] + t["cache_n"] == r["usage"]["prompt_tokens"]
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True,
            "logit_bias": no_end(fim_path)}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" and chunks[-1]["timings"]["predicted_n"] == 3


def test_samplers_choose_the_chain_and_t_max_predict_ms_ends_at_a_newline(base, fim_path):
    bias = no_end(fim_path)
    ask = dict(prompt="the cat", n_predict=12, logit_bias=bias, return_tokens=True)
    greedy = post(base, "/completion", temperature=0, **ask)["tokens"]
    # top_k 1 in the chain is greedy; left out of it (letters: temperature only), the draw is free
    assert post(base, "/completion", temperature=1.0, top_k=1, seed=3, samplers=["top_k", "temperature"],
                **ask)["tokens"] == greedy
    assert post(base, "/completion", temperature=1.0, top_k=1, seed=3, samplers="t", **ask)["tokens"] != greedy
    r = httpx.post(f"{base}/completion", json={"prompt": "x", "samplers": ["top_k", "nope"]})
    assert r.status_code == 400 and "unknown sampler 'nope'" in r.text
    (nl,) = post(base, "/tokenize", content="\n")["tokens"]
    lines = {**bias, str(nl): 100}  # every token a newline
    timed = post(base, "/completion", prompt="the cat", n_predict=200, logit_bias=lines, t_max_predict_ms=1)
    assert timed["stop_type"] == "limit" and 1 < timed["tokens_predicted"] < 200
    chat = post(base, "/v1/chat/completions", messages=[{"role": "user", "content": "hi"}], max_tokens=200,
                logit_bias=lines, t_max_predict_ms=1)
    assert chat["choices"][0]["finish_reason"] == "length" and chat["usage"]["completion_tokens"] < 200


def test_return_progress_streams_the_prompts_processing(base, fim_path):
    """llama-server's `return_progress`: a stream's first chunks say how far the prompt's
    processing is (total, cache, processed, time_ms), processed rising to the total before
    the first token; on /completion and on the OpenAI chat stream alike; a second identical
    request reports the cached part."""
    bias = no_end(fim_path)
    prompt = "zebras graze at noon " * 120  # longer than a step's batch: processed in several chunks

    def progress(path, body):
        with httpx.stream("POST", f"{base}{path}", json=body, timeout=120) as r:
            chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        shown = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
        kinds = "".join("p" if "prompt_progress" in c else "a" for c in chunks[1 if "chat" in path else 0:])
        assert kinds.startswith("p") and "p" not in kinds.lstrip("p"), kinds  # all of it before the answer
        return shown

    shown = progress("/completion", {"prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True,
                                     "logit_bias": bias})
    processed = [p["processed"] for p in shown]
    assert len(shown) >= 3 and processed == sorted(processed) and processed[-1] == shown[0]["total"] > 512
    assert shown[0]["processed"] == shown[0]["cache"] < 8 and all(p["time_ms"] >= 0 for p in shown)  # a fresh prompt
    again = progress("/completion", {"prompt": prompt, "n_predict": 2, "stream": True, "return_progress": True,
                                     "logit_bias": bias})
    assert again[0]["cache"] >= again[0]["total"] - 2  # all but the last token from the prefix cache
    chat = progress("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
                                             "stream": True, "return_progress": True, "logit_bias": bias})
    assert chat and chat[-1]["processed"] == chat[-1]["total"]
    plain = httpx.post(f"{base}/completion", json={"prompt": prompt, "n_predict": 2, "logit_bias": bias}).json()
    assert "prompt_progress" not in plain  # not streamed: no progress
