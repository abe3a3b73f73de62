"""A chat-template worker process, run as a script (`python template_worker.py MEMORY`):
it reads one JSON request a line on stdin, renders it with transformers' own chat-template
renderer (sandboxed Jinja, exactly what `apply_chat_template` renders), and writes one
JSON line back: `{"text": ...}` or `{"error": ..., "kind": "template" | "memory" | "size"}`.

It imports nothing of gguf-serve (a fresh interpreter starts it in well under a second)
and limits its own address space to what it holds at start plus MEMORY bytes, so that a
template that builds a huge string fails with a MemoryError here instead of taking the
server's memory. A render that runs too long is the parent's to end: it kills this
process (engine.templates.TemplateWorkers)."""

import json
import resource
import sys

from transformers.utils.chat_template_utils import render_jinja_template


def _address_space() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def render(req: dict) -> dict:
    messages = [{k: v for k, v in m.items() if v is not None} for m in req["messages"]]
    try:
        texts, _ = render_jinja_template(conversations=[messages], tools=req.get("tools"),
                                         documents=req.get("documents"), chat_template=req["template"],
                                         add_generation_prompt=req["add_generation_prompt"],
                                         continue_final_message=req["continue_final_message"], **req["kwargs"])
    except MemoryError:
        return {"error": f"rendering took more than the {req['memory_mib']} MiB a template may use", "kind": "memory"}
    except RecursionError:
        return {"error": "the template recursed too deeply", "kind": "template"}
    except Exception as e:  # the template's own failure (raise_exception, a bad filter, role order): its words
        return {"error": f"{type(e).__name__}: {e}"[:2000], "kind": "template"}
    text = texts[0]
    if len(text) > req["max_chars"]:
        return {"error": f"the rendered prompt is {len(text)} characters, more than the context can take (at most "
                         f"{req['max_chars']} are tokenized)", "kind": "size"}
    return {"text": text}


def main() -> None:
    memory = int(sys.argv[1])
    try:
        limit = _address_space() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (OSError, ValueError):  # no /proc, or a lower hard limit already: render unlimited
        pass
    out = sys.stdout.buffer
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:
            reply = render(json.loads(line))
        except MemoryError:
            reply = {"error": "the request was too large to read", "kind": "memory"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


if __name__ == "__main__":
    main()
