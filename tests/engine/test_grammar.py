"""Constrained decoding: the token mask (native = torch), and GrammarMask driving the
real engine on a tiny random model to schema-valid JSON, waiting for a reasoning block."""

import json

import jsonschema
import pytest
import torch

from gguf_serve.engine import load_model
from gguf_serve.engine.grammar import GrammarError, GrammarMask, json_grammar, schema_of
from gguf_serve.engine.kernels.cpu_ops import cpu_ops
from gguf_serve.engine.kernels.ops import TorchOps
from gguf_serve.engine.sampling import SamplingParams

from tiny_models import random_model, spec, write_gguf

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tag": {"enum": ["x", "yy"]}},
          "required": ["n", "tag"], "additionalProperties": False}


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    s = spec("qwen3")
    path = tmp_path_factory.mktemp("grammar") / "tiny.gguf"
    write_gguf(s, random_model(s, seed=3), path, "Q8_0")
    return load_model(str(path), device="cpu", n_seq=2)


@pytest.mark.parametrize("n,n_allowed", [(320, 320), (300, 320), (333, 320), (64, 64)])
def test_native_mask_equals_torch(n, n_allowed):
    g = torch.Generator().manual_seed(n)
    logits = torch.randn(n, generator=g)
    words = (n_allowed + 31) // 32
    allowed = torch.randint(0, 256, (words * 4,), dtype=torch.uint8, generator=g)
    allowed[:4] = 255  # a full word (the fast path) and a partial one
    raw = bytes(allowed.tolist())
    a, b = cpu_ops().mask_logits(logits, raw, n_allowed), TorchOps().mask_logits(logits, raw, n_allowed)
    assert torch.equal(a, b) and not torch.equal(a, logits)
    bit = lambda i: i < n_allowed and (raw[i // 8] >> (i % 8)) & 1  # noqa: E731
    assert all((a[i] == logits[i]) if bit(i) else a[i] == float("-inf") for i in range(n))


def test_the_mask_makes_a_random_model_write_valid_json(lm):
    grammar = json_grammar(SCHEMA)
    for seed in range(4):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=200, logits_processor=GrammarMask(lm, grammar))
        steps = list(lm.generate([5, 6, 7], params))
        assert steps[-1].finish_reason == "stop"  # at an end-of-generation token, once the object closed
        jsonschema.validate(json.loads("".join(s.text for s in steps)), SCHEMA)


def test_the_mask_waits_for_the_reasoning_block(lm):
    grammar = json_grammar(SCHEMA)
    open_, close = 11, 12  # stand-ins for <think> / </think>
    bias = {close: 3.0}
    # opened in the prompt: anything goes until `close`, then the schema
    mask = GrammarMask(lm, grammar, after=close, optional=open_, waiting=True)
    steps = list(lm.generate([5, 6], SamplingParams(temperature=1.0, seed=2, max_tokens=200, logit_bias=bias,
                                                    logits_processor=mask)))
    toks = [s.token_id for s in steps]
    cut = toks.index(close)
    text = lm.tokenizer.decode(toks[cut + 1:-1])
    jsonschema.validate(json.loads(text), SCHEMA)
    # not opened: the first token may open it (forced here by a bias), else the schema starts at once
    mask = GrammarMask(lm, grammar, after=close, optional=open_)
    first = next(iter(lm.generate([5, 6], SamplingParams(temperature=0, max_tokens=1, logit_bias={open_: 50.0},
                                                         logits_processor=mask))))
    assert first.token_id == open_
    mask = GrammarMask(lm, grammar, after=close, optional=open_)
    first = next(iter(lm.generate([5, 6], SamplingParams(temperature=0, max_tokens=1, logit_bias={close: 50.0},
                                                         logits_processor=mask))))
    assert lm.tokenizer.decode([first.token_id]).startswith("{")  # </think> is not allowed before any thinking


def test_bad_schemas_are_grammar_errors(lm):
    with pytest.raises(GrammarError):
        GrammarMask(lm, json_grammar({"type": "wat"}))
    with pytest.raises(GrammarError):
        schema_of({"type": "json_schema", "json_schema": {"name": "x"}})
    assert schema_of({"type": "json_object"}) is None


def test_objects_that_list_their_properties_get_no_others(lm):
    """A schema that leaves additionalProperties unsaid (instructor's, LangChain's tools):
    the random model would pad the object with keys of its own; closed, it cannot."""
    from gguf_serve.engine.grammar import closed_objects

    open_schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9},
                                                    "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}},
                                                              "required": ["ok"]}},
                   "required": ["n", "inner"]}
    closed = closed_objects(open_schema)
    assert closed["additionalProperties"] is False and closed["properties"]["inner"]["additionalProperties"] is False
    assert "additionalProperties" not in open_schema  # the caller's schema is left as it was
    kept = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    assert closed_objects(kept) == kept and closed_objects({"enum": [{"properties": 1}]}) == {"enum": [{"properties": 1}]}
    # property names are names, not keywords: one called "properties" or "enum" is a schema like any other
    named = closed_objects({"type": "object", "properties": {
        "properties": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "enum": {"type": "object", "properties": {"y": {"type": "integer"}}}}})
    assert set(named["properties"]) == {"properties", "enum"}
    assert named["properties"]["properties"]["additionalProperties"] is False
    assert named["properties"]["enum"]["additionalProperties"] is False
    grammar = json_grammar(open_schema)
    for seed in range(6):
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=200, logits_processor=GrammarMask(lm, grammar))
        reply = json.loads("".join(s.text for s in lm.generate([5, 6, 7], params)))
        assert set(reply) == {"n", "inner"} and set(reply["inner"]) == {"ok"}
