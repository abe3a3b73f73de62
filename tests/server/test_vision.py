"""Images through the server with the real openai client: a tiny random Gemma 3
vision-language model (text file + mmproj file side by side in one folder, paired as a
directory or a file is served). Data URLs streamed and not, two images in one message,
image + tools, the prefix cache hit on a follow-up turn, the Responses API's
input_image, /v1/models' `vision`, and every bad input a 400 naming the content part
while the server keeps serving."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest

from hub_server import HubServer
from server_harness import server
from tiny_vision import data_url, image, tiny_gemma3_vlm, tiny_qwen35_vlm, user

MODEL = "tiny-gemma3-vl.gguf"
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["a", "b"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def vlm(tmp_path_factory):
    return tiny_gemma3_vlm(tmp_path_factory.mktemp("vlm"), text_mix="Q8_0", vision_ftype="F16")


@pytest.fixture(scope="module")
def base(vlm):
    with server(vlm.text_path, "--max-image-bytes", "200000", "--parallel", "3", "--ctx-size", "1024") as b:
        yield b


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=f"{base}/v1", api_key="x")


def test_models_say_vision(client, base, vlm):
    (m,) = httpx.get(f"{base}/v1/models").json()["data"]
    assert m["vision"] is True


def test_image_streamed_and_not(client, vlm):
    msgs = [user(image(data_url(1)))]
    r = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5
    text_only = client.chat.completions.create(model=MODEL, messages=[user()], max_tokens=1)
    # the image's tokens, its begin and end marks and the blank lines around them are counted
    assert r.usage.prompt_tokens - text_only.usage.prompt_tokens >= vlm.n_tokens + 2
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == r.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_two_images_in_one_message_and_the_order_matters(client):
    a, b = data_url(2), data_url(3, fmt="JPEG")
    one = client.chat.completions.create(model=MODEL, messages=[user(image(a), image(b))], max_tokens=4, temperature=0,
                                         logprobs=True, extra_body={"ignore_eos": True})
    two = client.chat.completions.create(model=MODEL, messages=[user(image(b), image(a))], max_tokens=4, temperature=0,
                                         logprobs=True, extra_body={"ignore_eos": True})
    single = client.chat.completions.create(model=MODEL, messages=[user(image(a))], max_tokens=1)
    assert one.usage.prompt_tokens == two.usage.prompt_tokens > single.usage.prompt_tokens
    lp = lambda r: [t.logprob for t in r.choices[0].logprobs.content]  # noqa: E731
    assert lp(one) != lp(two)


def test_image_with_tools(client):
    r = client.chat.completions.create(model=MODEL, messages=[user(image(data_url(4)))], tools=[ADD],
                                       tool_choice="required", max_tokens=100, temperature=0)
    (call,) = r.choices[0].message.tool_calls[:1]
    assert call.function.name == "add" and r.choices[0].finish_reason == "tool_calls"


def test_follow_up_turn_hits_the_prefix_cache(client, vlm):
    first = [user(image(data_url(5)))]
    r1 = client.chat.completions.create(model=MODEL, messages=first, max_tokens=3, temperature=0)
    follow = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                      {"role": "user", "content": "and what colour is it"}]
    r2 = client.chat.completions.create(model=MODEL, messages=follow, max_tokens=3, temperature=0)
    assert r2.usage.prompt_tokens_details.cached_tokens >= vlm.n_tokens + 5


def test_responses_input_image(client):
    r = client.responses.create(model=MODEL, max_output_tokens=4, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": data_url(6)}]}])
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"}, image(data_url(6))]}], max_tokens=1)
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, max_output_tokens=4, instructions="be brief", input=[
            {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}])
    assert e.value.body["param"] == "input.0.content.0"


def bad(client, messages, model: str = MODEL) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=messages, max_tokens=1)
    return e.value.body


def test_bad_images_name_the_part_and_the_server_keeps_serving(client):
    system = {"role": "system", "content": "be brief"}
    b = bad(client, [system, user(image("data:image/png;base64," + base64.b64encode(b"not a png").decode()))])
    assert b["param"] == "messages.1.content.1" and "does not decode" in b["message"]
    b = bad(client, [system, user(image(data_url(7, size=(400, 400))))])  # > --max-image-bytes
    assert b["param"] == "messages.1.content.1" and "limit is 200000 bytes" in b["message"]
    b = bad(client, [user(image("https://example.com/cat.png"))])
    assert b["param"] == "messages.0.content.1" and "--image-urls" in b["message"]
    b = bad(client, [user(image("data:image/png;base64,@@@"))])
    assert "base64" in b["message"]
    b = bad(client, [user(image(data_url(8), detail="ultra"))])
    assert "detail" in b["message"]
    b = bad(client, [user(), {"role": "assistant", "content": [image(data_url(8))]}])
    assert b["param"] == "messages.1.content.0" and "user messages" in b["message"]
    b = bad(client, [user({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})])
    assert b["param"] == "messages.0.content.1"
    ok = client.chat.completions.create(model=MODEL, messages=[user(image(data_url(9)))], max_tokens=2)
    assert ok.usage.completion_tokens >= 1


def test_model_without_vision_file_refuses_images(vlm, tmp_path):
    import shutil

    text_only = tmp_path / "text-only.gguf"
    shutil.copy(vlm.text_path, text_only)  # a folder without its mmproj
    with server(str(text_only)) as b:
        c = openai.OpenAI(base_url=f"{b}/v1", api_key="x")
        assert httpx.get(f"{b}/v1/models").json()["data"][0]["vision"] is False
        body = bad(c, [user(image(data_url(1)))], model="text-only.gguf")
        assert body["param"] == "messages.0.content.1" and "no vision file" in body["message"]
        assert c.chat.completions.create(model="text-only.gguf", messages=[user()], max_tokens=1).usage.completion_tokens == 1


def test_directory_pairs_and_no_mmproj_skips(vlm):
    import os

    folder = os.path.dirname(vlm.text_path)
    with server(folder) as b:
        (m,) = httpx.get(f"{b}/v1/models").json()["data"]  # the mmproj file is not listed as a model
        assert m["id"] == os.path.basename(vlm.text_path) and m["vision"] is True
        c = openai.OpenAI(base_url=f"{b}/v1", api_key="x")
        r = c.chat.completions.create(model=m["id"], messages=[user(image(data_url(2)))], max_tokens=2)
        assert r.usage.completion_tokens >= 1
    with server(vlm.text_path, "--no-mmproj") as b:
        assert httpx.get(f"{b}/v1/models").json()["data"][0]["vision"] is False


def test_hub_repo_fetches_its_vision_file(vlm, tmp_path):
    """A Hub repository's mmproj file is fetched with the model (llama-server's -hf): the one
    in the model's folder, nearest in quantization; others in the repo are not."""
    import shutil

    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "0"}
    with HubServer() as h:
        h.add_repo("org/tiny-vl-GGUF", {"tiny-vl-Q8_0.gguf": vlm.text_path, "mmproj-F16.gguf": vlm.vision_path,
                                        "other/mmproj-F32.gguf": vlm.text_path})
        with server("org/tiny-vl-GGUF:tiny-vl-Q8_0.gguf", env={**env, "HF_ENDPOINT": h.url}) as b:
            (m,) = [m for m in httpx.get(f"{b}/v1/models").json()["data"] if m["id"].startswith("org/")]
            assert m["vision"] is True and m["loaded"] is True
            c = openai.OpenAI(base_url=f"{b}/v1", api_key="x")
            r = c.chat.completions.create(model=m["id"], messages=[user(image(data_url(3)))], max_tokens=2)
            assert r.usage.completion_tokens >= 1
    cached = [p.name for p in (tmp_path / "hf").rglob("*.gguf")]
    assert "mmproj-F16.gguf" in cached and "mmproj-F32.gguf" not in cached
    shutil.rmtree(tmp_path / "hf")


def test_qwen35_images_and_the_follow_up_turn(tmp_path):
    q = tiny_qwen35_vlm(tmp_path, text_mix="Q8_0", vision_ftype="F16")
    with server(q.text_path, "--mmproj", q.vision_path, "--ctx-size", "2048", "--parallel", "2") as b:
        c = openai.OpenAI(base_url=f"{b}/v1", api_key="x")
        model = "tiny-qwen35-vl.gguf"
        assert httpx.get(f"{b}/v1/models").json()["data"][0]["vision"] is True
        first = [user(image(data_url(1, size=(160, 120))))]
        r1 = c.chat.completions.create(model=model, messages=first, max_tokens=3, temperature=0,
                                       extra_body={"ignore_eos": True})
        follow = first + [{"role": "assistant", "content": r1.choices[0].message.content},
                          {"role": "user", "content": "and what colour is it"}]
        r2 = c.chat.completions.create(model=model, messages=follow, max_tokens=3, temperature=0)
        assert r2.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens - 8
        low = c.chat.completions.create(model=model, max_tokens=1, messages=[
            user(image(data_url(1, size=(1600, 1200)), detail="low"))])
        high = c.chat.completions.create(model=model, max_tokens=1, messages=[
            user(image(data_url(1, size=(1600, 1200)), detail="high"))])
        assert low.usage.prompt_tokens < high.usage.prompt_tokens
