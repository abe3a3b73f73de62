"""Structured outputs and logprobs through the real openai client, on the tiny random
thinking model: only the grammar mask can make its replies valid JSON, so every reply
that validates is the mask's doing."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from server_harness import ids, no_end, server

NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "kind": {"enum": ["cat", "dog", "fish"]},
                                      "scores": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
     "required": ["ok", "kind", "scores"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"], "additionalProperties": False},
        "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 6}]}},
     "required": ["point", "label"], "additionalProperties": False},
]


class Pet(BaseModel):
    name: str = Field(max_length=8)
    legs: int = Field(ge=0, le=8)
    kind: Literal["cat", "dog"]


@pytest.fixture(scope="module")
def srv(tiny_path):
    with server(tiny_path, "--prefill-dtype", "float32") as base:  # the same bits from the prefix cache
        yield base


@pytest.fixture
def client(srv):
    return openai.OpenAI(base_url=f"{srv}/v1", api_key="x", max_retries=0)


def closing(tiny_path) -> dict:
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tiny_path))
    return {str(tok.convert_tokens_to_ids(t)): 6 for t in ('"', "}")}


def schema_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("stream", [False, True])
def test_json_schema_replies_validate(client, tiny_path, schema, stream):
    for seed in range(3):
        kw = dict(model=tiny_path, messages=[{"role": "user", "content": "describe"}], max_tokens=200,
                  temperature=1.0, seed=seed, response_format=schema_format(schema), extra_body=NO_THINK)
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kw, stream=True)
                           if c.choices)
        else:
            r = client.chat.completions.create(**kw)
            assert r.choices[0].finish_reason == "stop"
            text = r.choices[0].message.content
        jsonschema.validate(json.loads(text), schema)


def test_unconstrained_replies_are_not_json(client, tiny_path):
    """The same requests without the mask: the random model writes no JSON at all."""
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "describe"}],
                                       max_tokens=40, temperature=1.0, seed=0, extra_body=NO_THINK)
    with pytest.raises(json.JSONDecodeError):
        json.loads(r.choices[0].message.content)


def test_parse_with_a_pydantic_model_and_json_object(client, tiny_path):
    for seed in range(3):
        r = client.chat.completions.parse(model=tiny_path, messages=[{"role": "user", "content": "a pet"}],
                                          response_format=Pet, max_tokens=200, seed=seed, extra_body=NO_THINK)
        pet = r.choices[0].message.parsed
        assert isinstance(pet, Pet) and 0 <= pet.legs <= 8
        # any object: unbounded, so the random model is nudged to close its strings and objects soon
        r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "json"}],
                                           response_format={"type": "json_object"}, max_tokens=200, seed=seed,
                                           logit_bias=closing(tiny_path), extra_body=NO_THINK)
        assert r.choices[0].finish_reason == "stop"
        assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_a_thinking_model_reasons_first_then_answers_in_the_schema(client, tiny_path):
    """Thinking on: the template opens <think>; the mask starts once </think> is out (nudged by a bias here,
    so that the random model closes it soon)."""
    close = ids(tiny_path)["</think>"]
    schema = SCHEMAS[0]
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "think"}],
                                       max_tokens=220, seed=1, response_format=schema_format(schema),
                                       logit_bias=no_end(tiny_path, **{str(close): 4}),
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    m = r.choices[0].message
    assert m.reasoning_content is not None and "</think>" not in (m.content or "")
    jsonschema.validate(json.loads(m.content), schema)


def test_logprobs_on_chat_and_completions(client, tiny_path):
    kw = dict(model=tiny_path, messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0,
              logit_bias=no_end(tiny_path), logprobs=True, top_logprobs=3, extra_body=NO_THINK)
    r = client.chat.completions.create(**kw)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 8
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
        assert t.token == t.top_logprobs[0].token and t.logprob == pytest.approx(t.top_logprobs[0].logprob)
        assert bytes(t.bytes).decode(errors="replace") == t.token
    streamed = [lp for c in client.chat.completions.create(**kw, stream=True)
                if c.choices and c.choices[0].logprobs for lp in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]
    no = client.chat.completions.create(**{**kw, "logprobs": False})
    assert no.choices[0].logprobs is None

    c = client.completions.create(model=tiny_path, prompt="the", max_tokens=6, temperature=0,
                                  logit_bias=no_end(tiny_path), logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    assert all(len(d) <= 2 and max(d.values()) == pytest.approx(v) for d, v in zip(lp.top_logprobs, lp.token_logprobs))


def test_a_token_that_is_part_of_a_character_reports_its_own_byte(client, tiny_path):
    """A byte-level vocabulary's lone byte 0xC3 (the first byte of "é"): its text alone is the
    replacement character, its `bytes` the byte itself (a client joining the tokens' bytes
    rebuilds the text), not the replacement character's three."""
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tiny_path))
    c3 = tok.convert_tokens_to_ids("Ã")  # GPT-2's character for the byte 0xC3
    bias = no_end(tiny_path)
    r = client.chat.completions.create(model=tiny_path, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2, extra_body=NO_THINK,
                                       logit_bias={**bias, str(c3): 100})
    for t in r.choices[0].logprobs.content:
        assert t.bytes == [0xC3] and t.token == "\ufffd"


def test_bad_schemas_are_400(srv, tiny_path):
    for fmt in ({"type": "json_schema"}, {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}):
        r = httpx.post(f"{srv}/v1/chat/completions", timeout=30, json={
            "model": tiny_path, "messages": [{"role": "user", "content": "x"}], "response_format": fmt})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert httpx.get(f"{srv}/health").status_code == 200
