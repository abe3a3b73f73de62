"""Model IDs resolved like the ecosystem does, against a Hub-compatible test server
with the real huggingface_hub client."""

import os
import shutil
import subprocess

import httpx
import openai
import pytest

from gguf_serve.server.models import resolve
from gguf_serve.server.core.errors import BadRequest, ModelNotFound

from helpers import split_gguf
from hub_server import HubServer
from server_harness import free_port, serve_command, server


@pytest.mark.parametrize("spec,expected", [
    ("org/repo:Model-Q4_K_M.gguf", resolve.ModelRef("org/repo", None, "Model-Q4_K_M.gguf", None)),
    ("org/repo@dev:sub/Model.gguf", resolve.ModelRef("org/repo", "dev", "sub/Model.gguf", None)),
    ("org/repo:q8_0", resolve.ModelRef("org/repo", None, None, "q8_0")),
    ("org/repo", resolve.ModelRef("org/repo", None, None, None)),
    ("just-a-name", None),
])
def test_parse(spec, expected):
    assert resolve.parse(spec) == expected


FILES = ["M-Q4_K_M.gguf", "M-Q4_K_S.gguf", "M-Q8_0.gguf", "M-IQ4_XS.gguf", "big/M-F16-00001-of-00002.gguf"]


@pytest.mark.parametrize("ref,expected", [
    (resolve.ModelRef("o/r", None, None, "q8_0"), "M-Q8_0.gguf"),
    (resolve.ModelRef("o/r", None, None, "Q4_K"), "M-Q4_K_M.gguf"),  # no exact-end match: the first containing it
    (resolve.ModelRef("o/r", None, None, "iq4_xs"), "M-IQ4_XS.gguf"),
    (resolve.ModelRef("o/r", None, None, "F16"), "big/M-F16-00001-of-00002.gguf"),
    (resolve.ModelRef("o/r", None, None, None), "M-Q4_K_M.gguf"),  # bare repo: Q4_K_M
    (resolve.ModelRef("o/r", None, "M-Q8_0.gguf", None), "M-Q8_0.gguf"),
])
def test_choose_file(ref, expected):
    assert resolve.choose_file(ref, FILES) == expected


def test_choose_file_errors_list_the_choices():
    with pytest.raises(BadRequest, match="no Q2_K file; choices: M-Q8_0.gguf, M-F16.gguf"):
        resolve.choose_file(resolve.ModelRef("o/r", None, None, "Q2_K"), ["M-Q8_0.gguf", "M-F16.gguf"])
    with pytest.raises(BadRequest, match="has 2 GGUF files; name one"):
        resolve.choose_file(resolve.ModelRef("o/r", None, None, None), ["M-Q8_0.gguf", "M-F16.gguf"])
    assert resolve.choose_file(resolve.ModelRef("o/r", None, None, None), ["only.gguf"]) == "only.gguf"
    with pytest.raises(ModelNotFound):
        resolve.choose_file(resolve.ModelRef("o/r", None, "missing.gguf", None), ["only.gguf"])


def test_quant_id_lists_every_file_and_shards_download_together(tiny_path, tmp_path):
    shards = split_gguf(tiny_path, str(tmp_path), "tiny-F16", 2)
    files = {"tiny-Q4_K_M.gguf": tiny_path, "tiny-Q8_0.gguf": tiny_path,
             "tiny-F16-00001-of-00002.gguf": shards[0], "tiny-F16-00002-of-00002.gguf": shards[1]}
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        h.add_repo("org/tiny-GGUF", files)
        with server("org/tiny-GGUF:q8_0", env={**env, "HF_ENDPOINT": h.url}) as base:
            ids = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
            assert ids == ["org/tiny-GGUF:tiny-F16-00001-of-00002.gguf", "org/tiny-GGUF:tiny-Q4_K_M.gguf",
                           "org/tiny-GGUF:tiny-Q8_0.gguf"]  # a split model once, by its first shard
            loaded = {m["id"]: m["loaded"] for m in httpx.get(f"{base}/v1/models").json()["data"]}
            assert loaded["org/tiny-GGUF:tiny-Q8_0.gguf"] is True and not loaded["org/tiny-GGUF:tiny-Q4_K_M.gguf"]
            c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
            r = c.chat.completions.create(model="org/tiny-GGUF:tiny-F16-00001-of-00002.gguf", max_tokens=1,
                                          messages=[{"role": "user", "content": "hi"}])
            assert r.choices
            assert any("tiny-F16-00002-of-00002.gguf" in q for q in h.requests)
            assert not any("tiny-Q4_K_M.gguf" in q and "resolve" in q for q in h.requests)  # fetched only on use
    # no model named, offline: the Hub cache's models are served
    with server(env={**env, "HF_HUB_OFFLINE": "1"}) as base:
        ids = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
        assert "org/tiny-GGUF:tiny-Q8_0.gguf" in ids and "org/tiny-GGUF:tiny-F16-00001-of-00002.gguf" in ids
        assert "embedded:gemma-3-270m-q4_k_m.gguf" in ids


def test_bare_repo_and_revision_forms(tiny_path, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        h.add_repo("org/one-file", {"model-Q6_K.gguf": tiny_path})
        with server("org/one-file", env={**env, "HF_ENDPOINT": h.url}) as base:  # bare repo, one file
            ids = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
            assert "org/one-file:model-Q6_K.gguf" in ids
            c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
            assert c.chat.completions.create(model="org/one-file", max_tokens=1,  # the name given works too
                                             messages=[{"role": "user", "content": "x"}]).choices
        with server("org/one-file@v1.0:model-Q6_K.gguf", env={**env, "HF_ENDPOINT": h.url}) as base:
            ids = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
            assert "org/one-file@v1.0:model-Q6_K.gguf" in ids
        assert any("/resolve/v1.0/model-Q6_K.gguf" in q for q in h.requests)  # the revision reached the Hub


def test_unknown_repo_is_a_clear_startup_error(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        with pytest.raises(RuntimeError, match="does not exist"):
            with server("org/missing:Q4_K_M", env={**env, "HF_ENDPOINT": h.url}):
                pass


def test_an_unreachable_hub_fails_in_seconds_and_cached_files_still_serve(tiny_path, tmp_path):
    """huggingface_hub retries a dead endpoint for ~25 s a call (52 s to fail before): one
    quick probe decides, and then only the cache is used."""
    import os
    import subprocess
    import time

    from server_harness import free_port, serve_command

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t = time.perf_counter()
    r = subprocess.run(serve_command("org/gone:model-Q4_K_M.gguf", "--port", str(free_port())), capture_output=True,
                       text=True, timeout=120, env={**env, "HF_ENDPOINT": dead})
    out = r.stdout + r.stderr
    assert r.returncode == 1 and time.perf_counter() - t < 30, out
    assert "org/gone:model-Q4_K_M.gguf" in out and dead in out and "does not answer" in out and "--offline" in out
    with HubServer() as h:  # fetched once while the Hub answers
        h.add_repo("org/kept-GGUF", {"kept-Q8_0.gguf": tiny_path})
        with server("org/kept-GGUF:kept-Q8_0.gguf", env={**env, "HF_ENDPOINT": h.url}):
            pass
    t = time.perf_counter()
    with server("org/kept-GGUF:kept-Q8_0.gguf", env={**env, "HF_ENDPOINT": dead}) as base:  # then it is gone
        assert time.perf_counter() - t < 30
        c = openai.OpenAI(base_url=f"{base}/v1", api_key="x")
        assert c.completions.create(model="org/kept-GGUF:kept-Q8_0.gguf", prompt="hi", max_tokens=2).choices


def test_hub_failures_keep_their_meaning(tiny_path, tmp_path):
    """A model the Hub refuses (gated) is a 403 naming the token setting, one it does not
    have a 404, a file that cannot be fetched while the Hub is gone a 503 naming
    --offline; the other models serve on (a local file beside them)."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        h.add_repo("org/locked-GGUF", {"locked-Q8_0.gguf": tiny_path})
        h.gated.add("org/locked-GGUF")
        with server(tiny_path, "org/locked-GGUF:locked-Q8_0.gguf", "org/missing-GGUF:m-Q8_0.gguf",
                    env={**env, "HF_ENDPOINT": h.url}) as base:
            health = httpx.get(f"{base}/health").json()
            assert set(health["failed"]) == {"org/locked-GGUF:locked-Q8_0.gguf", "org/missing-GGUF:m-Q8_0.gguf"}
            body = {"prompt": "hi", "max_tokens": 1}
            r = httpx.post(f"{base}/v1/completions", json={**body, "model": "org/locked-GGUF:locked-Q8_0.gguf"})
            err = r.json()["error"]
            assert r.status_code == 403 and "gated" in err["message"] and "HF_TOKEN" in err["message"], r.text
            assert err["type"] == "permission_error" and err["param"] == "model"
            import anthropic  # the Messages API says it in Anthropic's envelope, for its SDK's class

            with pytest.raises(anthropic.PermissionDeniedError) as denied:
                anthropic.Anthropic(base_url=base, api_key="x", max_retries=0).messages.create(
                    model="org/locked-GGUF:locked-Q8_0.gguf", max_tokens=1, messages=[{"role": "user", "content": "x"}])
            assert denied.value.body["error"]["type"] == "permission_error" and "HF_TOKEN" in denied.value.message
            r = httpx.post(f"{base}/v1/completions", json={**body, "model": "org/missing-GGUF:m-Q8_0.gguf"})
            assert r.status_code == 404 and "no such repository" in r.json()["error"]["message"], r.text
            r = httpx.post(f"{base}/v1/completions", json={**body, "model": "tiny-qwen3.gguf"})
            assert r.status_code == 200, r.text


def test_offline_says_offline(tmp_path):
    """With --offline nothing says the Hub does not answer: a model not in the cache fails
    naming --offline as the reason."""
    import os
    import subprocess

    from server_harness import free_port, serve_command

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1"}
    r = subprocess.run(serve_command("org/gone:model-Q4_K_M.gguf", "--offline", "--port", str(free_port())),
                       capture_output=True, text=True, timeout=120, env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "--offline" in out and "does not answer" not in out and "local_files_only" not in out, out



def test_files_that_go_with_a_model_are_not_listed_as_models(tiny_path, tmp_path):
    """A Qwen3.5 or Gemma 3 repository ships its vision projector (mmproj-*.gguf) beside the
    model, some an importance matrix or a separate MTP head: they are not models. The bare
    repo resolves to its one model, /v1/models lists the models only, naming a companion
    file says what it is; a local directory leaves them out too."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        h.add_repo("org/vl-GGUF", {"vl-Q4_K_M.gguf": tiny_path, "mmproj-F16.gguf": tiny_path,
                                   "vl.imatrix.gguf": tiny_path, "mtp-vl-Q8_0.gguf": tiny_path})
        # (these companions are text files standing in: --no-mmproj, so the "vision file" is not loaded;
        # tests/server/test_vision.py pairs a real one)
        with server("org/vl-GGUF", "--no-mmproj", env={**env, "HF_ENDPOINT": h.url}) as base:
            ids = [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]]
            assert [i for i in ids if i.startswith("org/")] == ["org/vl-GGUF:vl-Q4_K_M.gguf"]
        cmd = serve_command("org/vl-GGUF:mmproj-F16.gguf", "--port", str(free_port()))
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, **env,
                                                                                  "HF_ENDPOINT": h.url})
        assert p.returncode == 1 and "mmproj-F16.gguf is a vision projector (mmproj) that goes with a model" in p.stderr
        assert "vl-Q4_K_M.gguf" in p.stderr
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("a-Q8_0.gguf", "mmproj-a-F16.gguf"):
        shutil.copy(tiny_path, folder / name)
    with server(str(folder)) as base:
        assert [m["id"] for m in httpx.get(f"{base}/v1/models").json()["data"]] == ["a-Q8_0.gguf"]
