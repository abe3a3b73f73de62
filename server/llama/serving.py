"""llama-server's own endpoints over the completion path: /completion (its fields and
reply: `content`, `tokens`, `stop_type`, `timings`, `completion_probabilities` with
`n_probs`, a GBNF `grammar` or a `json_schema` through llguidance), /infill (the
fill-in-the-middle prompt of engine.infill), /apply-template (the chat prompt a request
renders to), /props (the defaults, the template, the modalities) and /slots (what each
sequence slot holds; a slot's state saved to --slot-save-path and taken back)."""

from __future__ import annotations

import json
import logging
import os
import time
import unicodedata
from typing import AsyncIterator

from ...engine import SAMPLER_CHAIN, InfillError, encode, infill_ids, json_grammar, slots, token_bytes
from ..chat.prepare import LLAMA_SAMPLERS
from ..chat.protocol import ChatCompletionRequest, CompletionRequest
from ..chat.wire import Tally
from ..core.errors import BadRequest, HTTPStatus, built, not_supported
from ..models.catalog import adapter_ids, refuse_unknown_adapters
from .protocol import LlamaCompletionRequest, LlamaInfillRequest

log = logging.getLogger("gguf_serve.server")


def gbnf_grammar(gbnf: str) -> str:
    """A GBNF grammar (llama.cpp's) as the llguidance grammar the mask takes."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return LLMatcher.grammar_from_lark(gbnf_to_lark(gbnf))
    except Exception as e:  # llguidance's own errors name the rule at fault
        raise BadRequest(f"grammar: {e}", param="grammar") from None


def logit_bias(value) -> dict | None:
    """llama-server's logit_bias: {"id": bias} or [[id, bias], ...]; a bias of false bans."""
    if value is None:
        return None
    out = {}
    try:
        for token, bias in (value.items() if isinstance(value, dict) else value):
            out[str(int(token))] = -100.0 if bias is False else max(-100.0, min(100.0, float(bias)))
    except (TypeError, ValueError, OverflowError):
        raise BadRequest("logit_bias: {\"token id\": bias} or [[token id, bias], ...]", param="logit_bias") from None
    return out


def completion_request(req: LlamaCompletionRequest, prompt) -> CompletionRequest:
    """The completion request a llama-server request means (`prompt`: text or token ids)."""
    fields = dict(model=req.model, prompt=prompt, max_tokens=req.n_predict if req.n_predict > 0 else None,
                  temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                  seed=req.seed if req.seed is not None and req.seed >= 0 else None, stop=req.stop or None,
                  repetition_penalty=req.repeat_penalty, presence_penalty=req.presence_penalty,
                  frequency_penalty=req.frequency_penalty, logit_bias=logit_bias(req.logit_bias),
                  ignore_eos=req.ignore_eos, keep_alive=req.keep_alive,
                  logprobs=req.n_probs or None, lora=req.lora,
                  **{k: getattr(req, k) for k in LLAMA_SAMPLERS})
    out = built(CompletionRequest, **fields)
    out._progress = bool(req.stream and req.return_progress)
    if req.grammar:
        out._grammar = gbnf_grammar(req.grammar)
    elif req.json_schema is not None:
        out._grammar = json_grammar(req.json_schema)
    return out


class LlamaServing:
    """/completion, /infill, /apply-template and /props over the chat serving's paths."""

    def __init__(self, chat, catalog, residency):
        self.chat, self.catalog, self.residency = chat, catalog, residency
        self.slots = SlotActions(chat, catalog, residency)

    def adapters(self, model: str | None) -> list[dict]:
        entry = self.catalog.named(model)
        return [{"id": i, "path": entry.adapters[i], "scale": entry.lora_scales.get(i, 0.0)} for i in adapter_ids(entry)]

    def set_adapters(self, choices: list, model: str | None) -> list[dict]:
        entry = self.catalog.named(model)
        refuse_unknown_adapters(entry, [c.id for c in choices], "id")
        entry.lora_scales = {i: 0.0 for i in adapter_ids(entry)} | {c.id: c.scale for c in choices}
        return self.adapters(model)

    async def _ids(self, req: LlamaCompletionRequest, entry) -> list[int] | str:
        """A mixed prompt (strings and token ids) as ids; a string as it is."""
        if isinstance(req.prompt, str):
            return req.prompt
        tok, ids = entry.lm.tokenizer, []
        for j, part in enumerate(req.prompt):
            ids += encode(tok, part, add_special=j == 0) if isinstance(part, str) else [part]
        return ids

    async def completion(self, req: LlamaCompletionRequest, infill: bool = False):
        """The job's prep and its chunks (llama-server's partial and final objects)."""
        self.catalog.answering(req)
        async with self.residency.holding(req.model, req.keep_alive) as entry:
            if infill:
                assert isinstance(req, LlamaInfillRequest)
                prompt = [] if not req.prompt else await self._ids(req, entry)
                if isinstance(prompt, str):
                    prompt = encode(entry.lm.tokenizer, prompt, add_special=False)
                try:
                    prompt = infill_ids(entry.lm, req.input_prefix, req.input_suffix, req.input_extra, prompt,
                                        n_predict=req.n_predict)
                except InfillError as e:
                    raise BadRequest(str(e), param="input_prefix", code="not_supported") from None
            else:
                prompt = await self._ids(req, entry)
            if prompt in ("", []):
                raise BadRequest("the prompt is empty", param="prompt")
        prep = await self.chat.prepare_completion(completion_request(req, prompt))
        return prep, self._chunks(req, prep)

    async def _chunks(self, req: LlamaCompletionRequest, prep) -> AsyncIterator[dict]:
        tally = Tally()
        text, tokens, probs, finish, word = [], [], [], None, None
        tok = prep.tokenizer
        async for p in self.chat.pieces(prep, tally):
            if p.progress is not None:  # return_progress: how far the prompt's processing is
                yield {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": tally.slot,
                       "tokens_predicted": 0, "tokens_evaluated": p.progress["total"], "prompt_progress": p.progress}
                continue
            finish, word = p.finish_reason or finish, p.stop_sequence or word
            ids = p.tokens
            tokens += ids
            new = [_prob(tok, t, lp, tops) for t, lp, tops in p.logprobs] if req.n_probs else []
            probs += new
            text.append(p.content)
            if req.stream and (p.content or ids):
                chunk = {"index": 0, "content": p.content, "tokens": ids if req.return_tokens else [], "stop": False,
                         "id_slot": tally.slot, "tokens_predicted": tally.completion_tokens,
                         "tokens_evaluated": tally.prompt_tokens}
                if req.n_probs:
                    chunk["completion_probabilities"] = new
                yield chunk
        content = "" if req.stream else "".join(text)
        n_prompt, n_gen = tally.prompt_tokens, tally.completion_tokens
        final = {"index": 0, "content": content, "tokens": [] if req.stream or not req.return_tokens else tokens,
                 "id_slot": tally.slot, "stop": True, "model": req.model, "tokens_predicted": n_gen,
                 "tokens_evaluated": n_prompt, "generation_settings": _settings(prep),
                 "prompt": tok.decode(prep.prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                 "has_new_line": "\n" in "".join(text), "truncated": False,
                 "stop_type": "limit" if finish == "length" else "word" if word else "eos",
                 "stopping_word": word or "", "tokens_cached": tally.cached_tokens,
                 "timings": tally.timings()}
        if req.n_probs and not req.stream:
            final["completion_probabilities"] = probs
        yield final

    async def apply_template(self, req: ChatCompletionRequest) -> dict:
        """The chat prompt a request renders to (its template, tools and switches applied)."""
        req.model = self.catalog.named(req.model).id
        return {"prompt": await self.chat.render_prompt(req)}

    def props(self, model: str | None) -> dict:
        entry = self.catalog.named(model)
        lm = entry.lm
        s, d = self.chat.settings, self.chat.sampling_defaults(entry)
        params = {"n_predict": s.max_tokens, "temperature": d.get("temperature", 1.0), "top_k": d.get("top_k", 0),
                  "top_p": d.get("top_p", 1.0), "min_p": d.get("min_p", 0.0),
                  "repeat_penalty": d.get("repetition_penalty", 1.0),
                  "seed": d["seed"] if d.get("seed") is not None else -1,
                  "samplers": d.get("samplers") or list(SAMPLER_CHAIN)}
        out = {"default_generation_settings": {"n_ctx": lm.n_ctx if lm else (entry.info or {}).get("context_length"),
                                               "params": params},
               "total_slots": lm.cache.n_seq if lm else s.parallel, "model_path": entry.path, "model_alias": entry.id,
               "chat_template": lm.chat_template if lm else None, "modalities": {"vision": entry.vision,
                                                                                 "audio": _hears(lm)},
               "is_sleeping": lm is None, "build_info": "gguf-serve"}
        if lm is not None:
            tok = lm.tokenizer
            out.update(bos_token=tok.bos_token or "", eos_token=tok.eos_token or "")
        return out


class SlotActions:
    """GET /slots and POST /slots/ID?action=save|restore|erase, on the model's worker
    between its steps (engine.slots); the files are read and written off it."""

    def __init__(self, chat, catalog, residency):
        self.chat, self.catalog, self.residency = chat, catalog, residency

    async def table(self, model: str | None, fail_on_no_slot: bool) -> list[dict]:
        if not self.chat.settings.slots:
            raise not_supported("This server does not support slots endpoint. Start it with `--slots`")
        entry = self.catalog.named(model)
        worker = entry.worker
        if worker is None or worker.scheduler is None:  # not loaded (or an embedding model): nothing held
            rows = []
        else:
            rows = await worker.between_steps(slots.table)
        if fail_on_no_slot and not any(not r["is_processing"] for r in rows):
            raise HTTPStatus(503, "no slot available", code="unavailable")
        return rows

    async def act(self, slot: int, action: str, body: dict, model: str | None) -> dict:
        folder = self.chat.settings.slot_save_path
        if not folder:
            raise not_supported("This server does not support slots action. Start it with `--slot-save-path`")
        if action not in ("save", "restore", "erase"):
            raise BadRequest("Invalid action: save, restore or erase", param="action")
        path = slot_file(folder, body.get("filename")) if action != "erase" else None
        async with self.residency.holding(model or body.get("model")) as entry:
            worker = entry.worker
            if worker.scheduler is None:
                raise BadRequest(f"{entry.id} is an embedding model: it keeps no sequence slots", param="model")
            ident = slots.identity(entry.lm)
            run = self.chat.pools.prompts.run
            start = time.perf_counter()
            try:
                if action == "erase":
                    return {"id_slot": slot, "n_erased": await worker.between_steps(lambda s: slots.erase(s, slot))}
                if action == "save":
                    state = await worker.between_steps(lambda s: slots.export(s, slot))
                    os.makedirs(folder, exist_ok=True)
                    n_bytes = await run(slots.write_state, path, state, ident)
                    return {"id_slot": slot, "filename": body["filename"], "n_saved": len(state.tokens),
                            "n_written": n_bytes, "timings": {"save_ms": (time.perf_counter() - start) * 1e3}}
                state, n_bytes = await run(slots.read_state, path, ident)
                await worker.between_steps(lambda s: slots.restore(s, slot, state))
                return {"id_slot": slot, "filename": body["filename"], "n_restored": len(state.tokens),
                        "n_read": n_bytes, "timings": {"restore_ms": (time.perf_counter() - start) * 1e3}}
            except slots.SlotError as e:
                raise BadRequest(str(e), param="id_slot") from None


def _hears(lm) -> bool:
    """Whether a loaded model takes audio (its mmproj file has an audio encoder); unloaded: not known, no."""
    return lm is not None and lm.vision is not None and lm.vision.audio_tower is not None


def _settings(prep) -> dict:
    p = prep.params[0]
    return {"n_predict": p.max_tokens, "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p,
            "min_p": p.min_p, "repeat_penalty": p.repetition_penalty, "presence_penalty": p.presence_penalty,
            "frequency_penalty": p.frequency_penalty, "seed": p.seed if p.seed is not None else -1,
            "stop": p.stop, "ignore_eos": p.ignore_eos}


def slot_file(folder: str, filename) -> str:
    """The path a slot action's `filename` names in --slot-save-path: a plain file name."""
    ok = (isinstance(filename, str) and 0 < len(filename.encode()) <= 255 and filename not in (".", "..")
          and not any(c in filename for c in "/\\") and filename.strip() == filename
          and not any(unicodedata.category(c).startswith("C") for c in filename))
    if not ok:
        raise BadRequest("Invalid filename: a plain file name is needed (no folders, no control characters)",
                         param="filename")
    return os.path.join(folder, filename)


def _prob(tok, token: int, logprob: float, tops) -> dict:
    def one(t, lp):
        text = tok.decode([t], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        return {"id": t, "token": text, "bytes": list(token_bytes(tok, t)), "logprob": lp}
    return {**one(token, logprob), "top_logprobs": [one(t, lp) for t, lp in tops]}


def sse(chunk: dict) -> str:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
