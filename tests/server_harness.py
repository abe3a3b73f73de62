"""Starting a real `gguf-serve` process for tests, and the tiny thinking model they serve."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

OUTPUTS: dict[str, object] = {}  # base URL -> function returning the server's output so far
PIDS: dict[str, int] = {}  # base URL -> the server's process id

THINKING_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.reasoning_content %}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)


# Hermes / Qwen3: the tools as JSON lines in the system turn, calls as JSON in <tool_call>
TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>\\n' }}"
    "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '</tools>\\nCall one as <tool_call>\\n{\"name\": ..., \"arguments\": ...}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' }}"
    "{{ c.function.arguments | tojson }}{{ '}\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen3.5 / Qwen3-Coder: calls as <function=NAME><parameter=P>value</parameter>, thinking open
XML_TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>\\n' }}"
    "{%- for t in tools %}{{ t | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '</tools>\\nCall one as <tool_call>\\n<function=NAME>\\n<parameter=P>\\nvalue\\n</parameter>\\n"
    "</function>\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' and m.tool_calls %}{{ '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in m.tool_calls %}{{ '<tool_call>\\n<function=' + c.function.name + '>\\n' }}"
    "{%- for k, v in c.function.arguments.items() %}{{ '<parameter=' + k + '>\\n' }}"
    "{{ v if v is string else v | tojson }}{{ '\\n</parameter>\\n' }}{%- endfor %}"
    "{{ '</function>\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{ '<think>\\n' }}{%- endif %}{%- endif %}"
)

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(*args: str) -> list[str]:
    """The `gguf-serve` command line with these arguments (the installed script, else the module)."""
    exe = shutil.which("gguf-serve")
    return [exe, *args] if exe else [sys.executable, "-m", "gguf_serve.server.cli", *args]


def spawn(*args: str) -> tuple[subprocess.Popen, str]:
    """A `gguf-serve` process of the test's own (to signal, or to watch exit), once healthy:
    (process, base URL). Its output is piped; the caller ends it."""
    port = free_port()
    cmd = serve_command(*args, "--port", str(port))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return proc, base


@contextlib.contextmanager
def server(*args: str, env: dict | None = None):
    port = free_port()
    cmd = serve_command(*args, "--port", str(port))
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    base = f"http://127.0.0.1:{port}"

    def output() -> str:
        log.seek(0)
        return log.read()[-4000:]

    try:
        deadline = time.time() + 120
        while True:
            try:
                r = httpx.get(f"{base}/health", timeout=2)
                if r.status_code == 200:
                    break
                if r.json().get("status") == "error":
                    raise RuntimeError(f"server failed to start: {r.json()['error']}\n{output()}")
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"server did not start:\n{output()}")
            time.sleep(0.2)
        OUTPUTS[base] = output
        PIDS[base] = proc.pid
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def until(predicate, seconds: float = 15.0) -> bool:
    """Whether `predicate()` holds within `seconds` (asked every 0.1 s): for waiting on a server's state,
    not on its clock."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def rss_mib(base: str) -> float:
    """The resident memory of the server at `base` (started by `server`), in MiB."""
    with open(f"/proc/{PIDS[base]}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def ids(tiny_path):
    from gguf_serve.engine.tokenizer import load_tokenizer
    from gguf_serve.gguf_io import GGUFReader

    tok = load_tokenizer(GGUFReader(tiny_path))
    return {t: tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>", "<|im_start|>", "</think>", "<think>", "Ġthe")}


def no_end(tiny_path, **extra):
    """logit_bias that keeps the random model from ending, so lengths are exact."""
    t = ids(tiny_path)
    bias = {str(t["<|im_end|>"]): -100, str(t["<|endoftext|>"]): -100}
    bias.update({str(k): v for k, v in extra.items()})
    return bias


def scrape(base, headers: dict | None = None) -> dict:
    r = httpx.get(f"{base}/metrics", headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# two tools with strict schemas, as the tool tests use them
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10},
                                     "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                     "b": {"type": "integer", "minimum": 0, "maximum": 999}},
    "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]


def accepts(grammar: str, text: str, tok) -> bool:
    from llguidance import LLMatcher, LLTokenizer

    m = LLMatcher(LLTokenizer(tok.backend_tokenizer.to_str()), grammar, log_level=0)
    ids = tok.backend_tokenizer.encode(text, add_special_tokens=False).ids
    return all(m.consume_token(t) for t in ids) and m.is_accepting()
