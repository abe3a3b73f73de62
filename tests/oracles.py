"""A prompt's logits from the engine and from llama.cpp itself (llama-cpp-python, in a
child process: a crash inside llama.cpp fails the calling test only)."""

import json
import subprocess
import sys

import torch

from gguf_serve.engine.batch import Batch

LLAMA_CPP_LOGITS = """
import sys, json, llama_cpp, numpy as np
m = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, logits_all=True, verbose=False)
ids = json.loads(sys.argv[2])
m.eval(ids)
print(json.dumps(np.asarray(m.scores[:len(ids)]).tolist()))
"""


def prompt_logits(lm, ids: list[int]) -> torch.Tensor:
    """Every position's logits for a prompt, through a fresh slot of the model's cache."""
    slot = lm.cache.allocate()
    try:
        return lm.forward(Batch.of([(slot, ids, 0)], want="all"))
    finally:
        lm.cache.free(slot)


def stepped_logits(lm, ids: list[int]) -> torch.Tensor:
    """Every position's logits with each token its own forward through one fresh slot (the
    cache, and a recurrent layer's state, carried from step to step)."""
    slot = lm.cache.allocate()
    try:
        return torch.cat([lm.forward(Batch.of([(slot, [t], i)], want="last")) for i, t in enumerate(ids)])
    finally:
        lm.cache.free(slot)


def dense_logits(model, ids: list[int]) -> torch.Tensor:
    """A transformers causal LM's logits for the prompt."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def llama_cpp_logits(path: str, ids: list[int]) -> torch.Tensor:
    """Every position's logits as llama.cpp computes them for the file (its float16 KV cache)."""
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_LOGITS, path, json.dumps(ids)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return torch.tensor(json.loads(p.stdout))


LLAMA_CPP_EMBEDDINGS = """
import sys, json, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], embedding=True, n_ctx=128, n_threads=1, verbose=False)
texts = json.loads(sys.argv[2])
print(json.dumps([[m.tokenize(t.encode()), m.embed(t, normalize=False)] for t in texts]))
"""


def llama_cpp_embeddings(path: str, texts: list[str]) -> list[tuple[list[int], torch.Tensor]]:
    """Each text's token ids and pooled embedding (not normalized) as llama.cpp gives them."""
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_EMBEDDINGS, path, json.dumps(texts)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return [(ids, torch.tensor(vec)) for ids, vec in json.loads(p.stdout)]


LLAMA_CPP_RANK = """
import sys, json, llama_cpp
m = llama_cpp.Llama(model_path=sys.argv[1], embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK, n_ctx=256,
                    n_batch=256, n_ubatch=256, n_threads=1, verbose=False)
scores = []
for ids in json.loads(sys.argv[2]):
    m._batch.reset()
    m._batch.add_sequence(ids, 0, True)
    m._ctx.kv_cache_clear()
    m._ctx.decode(m._batch)
    scores.append(llama_cpp.llama_get_embeddings_seq(m._ctx.ctx, 0)[0])
print(json.dumps({"scores": scores, "tokenize": [m.tokenize(t.encode()) for t in json.loads(sys.argv[3])]}))
"""


def llama_cpp_rank(path: str, inputs: list[list[int]], texts: list[str] = ()) -> tuple[list[float], list[list[int]]]:
    """A reranker's score (its classification head's first output, --pooling rank) for each
    input of token ids as llama.cpp computes it, and the token ids it gives each of `texts`."""
    p = subprocess.run([sys.executable, "-c", LLAMA_CPP_RANK, path, json.dumps(inputs), json.dumps(list(texts))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    return out["scores"], out["tokenize"]
