"""Sampling defaults per model, on a real server with two tiny models: a file's own
recommended sampling (general.sampling.* keys), a models preset's sections (llama-server's
INI: [model id] over [*]) over it, the command line over both and the request over all;
a preset with a key that is not a sampling option stops the start with a line naming it."""

from __future__ import annotations

import subprocess

import httpx

from helpers import copy_gguf
from server_harness import THINKING_TEMPLATE, free_port, no_end, serve_command, server
from tiny_models import tiny_chat_model


def tokens(base, model, bias, **kw):
    r = httpx.post(f"{base}/completion", json={"model": model, "prompt": "the cat sat", "n_predict": 10,
                                                "logit_bias": bias, "return_tokens": True, **kw}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def props(base, model):
    return httpx.get(f"{base}/props", params={"model": model}).json()["default_generation_settings"]["params"]


def test_defaults_come_from_the_request_the_command_line_the_preset_and_the_file(tmp_path):
    plain = tiny_chat_model(tmp_path, "plain.gguf", 17, THINKING_TEMPLATE)
    # the same weights, recommending greedy-like top-k 1 and a temperature in the file
    keyed = copy_gguf(plain, tmp_path / "keyed.gguf", metadata={"general.sampling.top_k": 1,
                                                                  "general.sampling.temp": 0.8,
                                                                  "general.sampling.sequence": "top_k;temperature"})
    preset = tmp_path / "models.ini"
    preset.write_text("version = 1\n[*]\nmin-p = 0.05 ; every model\n[plain.gguf]\ntop-k = 1\n"
                      "[keyed.gguf]\ntemp = 0.9\n")
    bias = no_end(plain)
    with server(plain, keyed, "--models-preset", str(preset), "--top-p", "0.95") as base:
        greedy = tokens(base, "plain.gguf", bias, temperature=0)
        # plain: top-k 1 from its preset section; keyed: top-k 1 from its file; both greedy when seeded
        assert tokens(base, "plain.gguf", bias, seed=5) == greedy
        assert tokens(base, "keyed.gguf", bias, seed=5) == greedy
        # the request over them all
        assert tokens(base, "plain.gguf", bias, seed=5, top_k=0, temperature=1.5) != greedy
        p, k = props(base, "plain.gguf"), props(base, "keyed.gguf")
        assert (p["top_k"], p["min_p"], p["top_p"], p["temperature"]) == (1, 0.05, 0.95, 1.0)
        assert (k["top_k"], k["min_p"], k["top_p"], k["temperature"]) == (1, 0.05, 0.95, 0.9)  # preset over file
        assert k["samplers"] == ["top_k", "temperature"]
    with server(keyed, "--models-preset", str(preset), "--top-k", "0", "--temp", "0.7") as base:
        assert props(base, "keyed.gguf")["top_k"] == 0 and props(base, "keyed.gguf")["temperature"] == 0.7
        assert tokens(base, "keyed.gguf", bias, seed=5) != greedy  # the command line's top-k 0 wins


def test_a_preset_key_that_is_not_a_sampling_option_stops_the_start(tmp_path):
    bad = tmp_path / "bad.ini"
    bad.write_text("[*]\nctx-size = 8192\n")
    p = subprocess.run(serve_command("--models-preset", str(bad), "--port", str(free_port())), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "[*] ctx-size: only sampling options are per model" in p.stderr
    bad.write_text("[*]\nsamplers = top_k;nope\n")
    p = subprocess.run(serve_command("--models-preset", str(bad), "--port", str(free_port())), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and "unknown sampler 'nope'" in p.stderr
