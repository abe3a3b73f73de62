"""Ollama's API over the server's own paths: /api/chat and /api/generate become the chat
(or, `raw`, the completion) requests they mean and stream their pieces as Ollama's NDJSON
lines; /api/embed and /api/embeddings run through the embeddings path; the model list,
/api/show and /api/ps describe the catalog's models in Ollama's terms (details read from
the GGUF file, capabilities from its template and keys). Models are named as Ollama's
clients name them: a served id, with or without `:latest`, or `hf.co/<repo>:<quant>`."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import time
from datetime import datetime, timezone
from typing import AsyncIterator

from ...engine import FIM_NAMES, InfillError, encode, infill_ids
from ...gguf_io import GGUFReader, Keys
from ..chat.protocol import ChatCompletionRequest, CompletionRequest
from ..chat.serving import OverChat
from ..chat.wire import Tally
from ..core.errors import BadRequest, ModelNotFound, built
from ..embeddings.protocol import EmbeddingRequest
from .protocol import OllamaChatRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest, OllamaGenerateRequest

log = logging.getLogger("gguf_serve.server")

VERSION = "0.13.0"  # the Ollama version clients are told (VS Code's Copilot wants 0.6.4 or later)

# Ollama's options as the chat request's sampling fields
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed",
           "stop": "stop", "repeat_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "typical_p": "typical_p", "mirostat": "mirostat",
           "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta"}
IGNORED = ("num_ctx", "num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "use_mmap", "use_mlock",
           "numa", "low_vram", "f16_kv", "vocab_only", "repeat_last_n", "tfs_z", "penalize_newline")


def iso(t: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if t is None else t, timezone.utc).isoformat().replace("+00:00", "Z")


def sampling(options: dict | None) -> dict:
    """The chat request's sampling fields for Ollama's `options` (num_predict: max_tokens;
    -1 and -2, Ollama's unlimited and fill-the-context, leave the server's limit); the
    load-time options this server sets at startup are ignored."""
    out = {}
    for k, v in (options or {}).items():
        if k in OPTIONS and v is not None:
            out[OPTIONS[k]] = v
        elif k == "num_predict" and isinstance(v, int) and v > 0:
            out["max_tokens"] = v
        elif k not in IGNORED and k != "num_predict":
            log.info("ollama: option %r is not one this server takes; ignored", k)
    if out.get("seed") is not None and out["seed"] < 0:  # Ollama's -1: random
        out.pop("seed")
    return out


def response_format(fmt) -> dict | None:
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise BadRequest(f"format must be \"json\" or a JSON schema, not {fmt!r}", param="format")


def reasoning_effort(think) -> str | None:
    """Ollama's `think`: true / false, or gpt-oss's level ("low", "medium", "high")."""
    if think is None:
        return None
    if isinstance(think, bool):
        return "medium" if think else "none"
    return think


def image_parts(images: list[str] | None, where: str) -> list[dict]:
    """Ollama's base64 images as chat image parts (data URLs of the type the bytes are)."""
    parts = []
    for j, data in enumerate(images or []):
        try:
            head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4))
        except ValueError:
            raise BadRequest(f"{where}.{j}: an image is base64 data", param=f"{where}.{j}") from None
        kind = "png" if head.startswith(b"\x89PNG") else "gif" if head.startswith(b"GIF8") else \
            "webp" if head[8:12] == b"WEBP" else "jpeg"
        parts.append({"type": "image_url", "image_url": {"url": f"data:image/{kind};base64,{data}"}})
    return parts


def _content(text: str | None, images: list[str] | None, where: str):
    if not images:
        return text or ""
    return [{"type": "text", "text": text or ""}, *image_parts(images, where)]


def chat_messages(req: OllamaChatRequest) -> list[dict]:
    """Ollama's messages as chat messages: images as parts, an assistant's tool calls given
    ids (Ollama's carry none) that the tool results after them answer, in order."""
    out, open_calls = [], []
    for i, m in enumerate(req.messages):
        msg = {"role": m.role, "content": _content(m.content, m.images, f"messages.{i}.images")}
        if m.role == "assistant":
            if m.thinking:
                msg["reasoning_content"] = m.thinking
            calls = []
            for j, c in enumerate(m.tool_calls or []):
                f = c.get("function") or {}
                args = f.get("arguments", {})
                call_id = c.get("id") or f"call_{i}_{j}"
                calls.append({"id": call_id, "type": "function", "function": {
                    "name": f.get("name", ""), "arguments": args if isinstance(args, str) else json.dumps(args)}})
                open_calls.append((call_id, f.get("name")))
            if calls:
                msg["tool_calls"] = calls
        elif m.role == "tool":
            match = next((c for c in open_calls if m.tool_name in (None, c[1])), None)
            if match is not None:
                open_calls.remove(match)
            msg["tool_call_id"] = match[0] if match else f"call_{i}"
        out.append(msg)
    return out


def to_chat(req: OllamaChatRequest) -> ChatCompletionRequest:
    fields = dict(model=req.model, messages=chat_messages(req), tools=req.tools or None, tool_choice=req.tool_choice,
                  logit_bias=req.logit_bias,
                  response_format=response_format(req.format), reasoning_effort=reasoning_effort(req.think),
                  keep_alive=req.keep_alive, logprobs=req.logprobs, top_logprobs=req.top_logprobs,
                  **sampling(req.options))
    return built(ChatCompletionRequest, **fields)


def generate_to_chat(req: OllamaGenerateRequest) -> ChatCompletionRequest:
    messages = [{"role": "system", "content": req.system}] if req.system else []
    messages.append({"role": "user", "content": _content(req.prompt, req.images, "images")})
    fields = dict(model=req.model, messages=messages, response_format=response_format(req.format),
                  reasoning_effort=reasoning_effort(req.think), keep_alive=req.keep_alive, **sampling(req.options))
    return built(ChatCompletionRequest, **fields)


def generate_to_completion(req: OllamaGenerateRequest, ids: list[int] | None = None) -> CompletionRequest:
    """A raw generate (or, `ids`, a fill-in-the-middle prompt's tokens) as a completion."""
    if req.format:
        raise BadRequest("format with raw or suffix is not supported here: use /api/chat", param="format")
    fields = dict(model=req.model, prompt=ids or req.prompt, keep_alive=req.keep_alive, **sampling(req.options))
    return built(CompletionRequest, **fields)


class OllamaServing(OverChat):
    """/api/... over the chat, completion and embeddings paths and the catalog."""

    translate, renamed = staticmethod(to_chat), {}

    def __init__(self, chat, embeddings, catalog, residency):
        super().__init__(chat)
        self.embeddings, self.catalog, self.residency = embeddings, catalog, residency

    # ------------------------------------------------------------- names

    def resolve(self, name: str | None) -> str:
        """The served id a model name means (catalog.named: Ollama's forms too; with one
        model served, any name)."""
        return self.catalog.named(name).id

    # ------------------------------------------------------------- generating

    async def chat(self, req: OllamaChatRequest):
        req.model = self.resolve(req.model)
        if not req.messages:  # Ollama's way to load a model
            await self._load(req.model, req.keep_alive)
            return None, _done({"model": req.model, "message": {"role": "assistant", "content": ""}}, "load")
        prep = await self._prepare(req)
        return prep, self._lines(prep, req.model, "chat")

    async def generate(self, req: OllamaGenerateRequest):
        req.model = self.resolve(req.model)
        if not req.prompt and not req.images:
            await self._load(req.model, req.keep_alive)
            return None, _done({"model": req.model, "response": ""}, "load")
        if req.suffix:  # fill in the middle: the prompt llama-server's /infill builds
            async with self.residency.holding(req.model, req.keep_alive) as entry:
                try:
                    ids = infill_ids(entry.lm, req.prompt or "", req.suffix)
                except InfillError as e:
                    raise BadRequest(str(e), param="suffix", code="not_supported") from None
            prep = await self.service.through_chat(lambda r: generate_to_completion(r, ids), req, {},
                                                   use=self.service.prepare_completion)
        elif req.context:  # a previous reply's tokens (its `context`), then this turn's
            text = req.prompt if req.raw else await self.service.render_prompt(generate_to_chat(req))
            async with self.residency.holding(req.model, req.keep_alive) as entry:
                turn = encode(entry.lm.tokenizer, text, add_special=False)
            ids = [*req.context, *turn]
            prep = await self.service.through_chat(lambda r: generate_to_completion(r, ids), req, {},
                                                   use=self.service.prepare_completion)
        elif req.raw:
            prep = await self.service.through_chat(generate_to_completion, req, {}, use=self.service.prepare_completion)
        else:
            prep = await self.service.through_chat(generate_to_chat, req, {})
        return prep, self._lines(prep, req.model, "generate")

    async def _load(self, model: str, keep_alive) -> None:
        async with self.residency.holding(model, keep_alive):
            pass

    async def _lines(self, prep, model: str, kind: str) -> AsyncIterator[dict]:
        """Ollama's chunks, then the last one with `done` and the timings (nanoseconds)."""
        tally, start, first = Tally(), time.perf_counter(), None
        finish, generated = None, []
        async for p in self.service.pieces(prep, tally):
            first = first or time.perf_counter()
            finish = p.finish_reason or finish
            generated += p.tokens
            if not (p.content or p.reasoning or p.tool_calls):
                continue
            chunk: dict = {"model": model, "created_at": iso()}
            if kind == "chat":
                message = {"role": "assistant", "content": p.content}
                if p.reasoning:
                    message["thinking"] = p.reasoning
                if p.tool_calls:
                    message["tool_calls"] = [{"id": c.id, "function": {"index": j, "name": c.name,
                                                                       "arguments": _arguments(c.arguments)}}
                                             for j, c in enumerate(p.tool_calls)]
                chunk["message"] = message
            else:
                chunk["response"] = p.content
                if p.reasoning:
                    chunk["thinking"] = p.reasoning
            yield {**chunk, "done": False}
        end = time.perf_counter()
        first = first or end
        last = {"model": model}
        if kind == "chat":
            last["message"] = {"role": "assistant", "content": ""}
        else:  # the conversation's tokens so far, for the next request's `context`
            last.update(response="", context=[*prep.prompt_ids, *generated])
        yield _done(last, "length" if finish == "length" else "stop", total=end - start, prompt=first - start,
                    evals=end - first, n_prompt=tally.prompt_tokens, n_eval=tally.completion_tokens)

    # ------------------------------------------------------------- embeddings

    async def embed(self, req: OllamaEmbedRequest) -> dict:
        model = self.resolve(req.model)
        start = time.perf_counter()
        out = await self.embeddings.embeddings(EmbeddingRequest(model=model, input=req.input,
                                                                dimensions=req.dimensions, keep_alive=req.keep_alive))
        return {"model": model, "embeddings": [d["embedding"] for d in out["data"]],
                "total_duration": _ns(time.perf_counter() - start), "load_duration": 0,
                "prompt_eval_count": out["usage"]["prompt_tokens"]}

    async def embeddings_one(self, req: OllamaEmbeddingsRequest) -> dict:
        model = self.resolve(req.model)
        out = await self.embeddings.embeddings(EmbeddingRequest(model=model, input=req.prompt or " ",
                                                                keep_alive=req.keep_alive))
        return {"embedding": out["data"][0]["embedding"]}

    # ------------------------------------------------------------- the models

    def tags(self) -> dict:
        """Every model that can be served, each LoRA adapter after its model (`<model>+<adapter>`)."""
        out = []
        for e in self.catalog.entries.values():
            if e.error is None:
                out.append(self._listed(e))
                out += [self._listed(e, name) for name in self.catalog.adapter_names_of(e.id)]
        return {"models": out}

    def ps(self) -> dict:
        out = []
        for e in self.catalog.entries.values():
            if e.lm is None:
                continue
            idle = e.keep_alive if e.keep_alive is not None else self.residency.settings.idle_unload
            until = time.time() + (idle if idle is not None and idle >= 0 else 10 * 365 * 86400)
            out.append({**self._listed(e), "size": e.memory, "size_vram": 0, "expires_at": iso(until),
                        "context_length": e.lm.n_ctx})
        return {"models": out}

    def show(self, name: str | None) -> dict:
        """The model's details, its GGUF keys as `model_info` (the vocabulary left out) and
        its capabilities (off the event loop: it reads the file, and fetches a Hub file not
        fetched yet)."""
        entry = self.catalog.get(self.resolve(name))
        self.catalog.fetch(entry)
        m = GGUFReader(entry.path).metadata
        arch = m.get(Keys.ARCHITECTURE, "")
        template = m.get(Keys.CHAT_TEMPLATE) or ""
        info = {k: v for k, v in m.items() if isinstance(v, (int, float, str, bool)) and not k.startswith("tokenizer.")}
        info["general.parameter_count"] = entry.info.get("parameters", 0)
        return {"modelfile": f"# served by gguf-serve\nFROM {entry.id}\n", "parameters": "", "template": template,
                "details": self._details(entry), "model_info": info,
                "capabilities": _capabilities(m, arch, template, entry.vision), "modified_at": iso(_mtime(entry))}

    async def pull(self, name: str | None) -> dict:
        """A served model "pulls" at once; another is the error Ollama gives for it."""
        try:
            self.resolve(name)
        except ModelNotFound:
            raise ModelNotFound(name or "", "this server pulls nothing: it serves the models it was started with")
        return {"status": "success"}

    def delete(self, name: str | None) -> None:
        """A served model is unloaded (its file stays: this server deletes nothing)."""
        self.residency.unload(self.catalog.get(self.resolve(name)))

    def _listed(self, e, served: str | None = None) -> dict:
        served = served or e.id
        name = served if ":" in served else f"{served}:latest"
        return {"name": name, "model": name, "modified_at": iso(_mtime(e)), "size": (e.info or {}).get("size_bytes", 0),
                "digest": hashlib.sha256(served.encode()).hexdigest(), "details": self._details(e)}

    @staticmethod
    def _details(e) -> dict:
        info = e.info or {}
        arch, parameters = info.get("architecture", ""), info.get("parameters") or 0
        return {"parent_model": "", "format": "gguf", "family": arch, "families": [arch] if arch else None,
                "parameter_size": _size_label(parameters) if parameters else "",
                "quantization_level": info.get("quantization", "")}


def _arguments(text: str) -> dict:
    """A call's arguments as Ollama's clients type them: an object (a call cut short by the
    token limit, whose arguments do not read, gives an empty one)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def empty_chunk(model: str, kind: str) -> dict:
    """A chunk that adds nothing (a silent stream's keep-alive): no content, not done."""
    part = {"message": {"role": "assistant", "content": ""}} if kind == "chat" else {"response": ""}
    return {"model": model, "created_at": iso(), **part, "done": False}


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _done(chunk: dict, reason: str, total: float = 0.0, prompt: float = 0.0, evals: float = 0.0, n_prompt: int = 0,
          n_eval: int = 0) -> dict:
    return {**chunk, "created_at": iso(), "done": True, "done_reason": reason, "total_duration": _ns(total),
            "load_duration": 0, "prompt_eval_count": n_prompt, "prompt_eval_duration": _ns(prompt),
            "eval_count": n_eval, "eval_duration": _ns(evals)}


def _mtime(e) -> float:
    return (e.info or {}).get("created") or time.time()


def _size_label(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _capabilities(m: dict, arch: str, template: str, vision: bool) -> list[str]:
    """Ollama's capabilities of a file: what its keys and chat template show."""
    if m.get(f"{arch}.pooling_type") is not None:
        return ["embedding"]
    caps = ["completion"]
    if "tools" in template:
        caps.append("tools")
    tokens = set(m.get(Keys.TOKENIZER_TOKENS) or ())
    if all(m.get(f"tokenizer.ggml.fim_{k}_token_id") is not None or any(n in tokens for n in FIM_NAMES[k])
           for k in ("pre", "suf", "mid")):  # fill in the middle (engine.infill finds the tokens so)
        caps.append("insert")
    if vision:
        caps.append("vision")
    if "enable_thinking" in template or "<think>" in template or "reasoning_effort" in template:
        caps.append("thinking")
    return caps
