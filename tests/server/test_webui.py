"""The chat page at `/`, in a real browser: Debian's chromium driven by Playwright's Python
API (the system browser: nothing is downloaded), against real servers on 127.0.0.1 with
the Gemma file and tiny thinking, tool-calling and vision models. Each test opens a fresh
browser context (its own localStorage). What the page shows is checked against what the
API answers for the same request. Screenshots of the main states go to
build/screenshots/ (or $GGUF_SERVE_SCREENSHOTS); they are not committed."""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from server_harness import TOOL_TEMPLATE, WEATHER, scrape, server, value
from tiny_models import tiny_chat_model
from tiny_vision import tiny_gemma3_vlm

GEMMA = "gemma-3-270m-q4_k_m.gguf"
THINKING = "tiny-qwen3.gguf"
TOOLS = "tiny-tools.gguf"
VISION = "tiny-gemma3-vl.gguf"
KEY = "page-test-key"
CTX = 1024
SHOTS = Path(os.environ.get("GGUF_SERVE_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "build" / "screenshots")
# as the machine's notes say: without the background-networking switches chromium keeps
# trying to reach Google's hosts, which this closed network refuses
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update"]
RESOURCE_ERROR = "Failed to load resource: the server responded with a status of"


def chromium() -> str:
    """The system's chromium; where it is missing, skip on a developer's machine and fail in
    CI (`.ci/run` installs Debian's package), as the llama.cpp cross-checks do."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed, and CI runs the browser tests (.ci/run installs it)")
    pytest.skip("chromium is not installed (apt-get install chromium; .ci/run does): browser tests skipped here")


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def models(gemma_path, tiny_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("webui")
    tools = tiny_chat_model(folder, TOOLS, 7, TOOL_TEMPLATE)
    vlm = tiny_gemma3_vlm(tmp_path_factory.mktemp("webui-vlm"), text_mix="Q8_0", vision_ftype="F16")
    return [gemma_path, tiny_path, tools, vlm.text_path]


@pytest.fixture(scope="module")
def base(models):
    # the thinking model's random weights would rarely leave its think block: the budget closes it
    with server(*models, "--ctx-size", str(CTX), "--reasoning-budget", "8", "--models-max", "4") as b:
        yield b


@pytest.fixture(scope="module")
def keyed(tiny_path):
    with server(tiny_path, "--api-key", KEY) as b:
        yield b


class Tab:
    """One page in a fresh browser context, with the console's errors collected."""

    def __init__(self, browser, base: str, width: int = 1100, height: int = 760):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        self.page.set_default_timeout(60_000)
        self.base = base
        self.open()

    def open(self) -> None:
        self.page.goto(self.base + "/")
        self.page.wait_for_selector("body[data-ready=true]")

    def reload(self) -> None:
        self.page.reload()
        self.page.wait_for_selector("body[data-ready=true]")

    def close(self) -> None:
        self.context.close()

    def shot(self, name: str) -> None:
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"), animations="disabled")

    def settings(self, model: str | None = None, temperature: float | None = None, max_tokens: int | None = None,
                 reasoning: str | None = None, tools: list | None = None, tool_choice: str | None = None) -> None:
        p = self.page
        if model is not None:
            p.select_option("#model", model)
        if p.is_hidden("#settings"):
            p.click("#toggle-settings")
        if temperature is not None:
            p.fill("#temperature", str(temperature))
        if max_tokens is not None:
            p.fill("#max-tokens", str(max_tokens))
        if reasoning is not None:
            p.select_option("#reasoning", reasoning)
        if tools is not None:
            p.fill("#tools", json.dumps(tools))
        if tool_choice is not None:
            p.select_option("#tool-choice", tool_choice)
        p.click("#toggle-settings")

    def send(self, text: str, wait: bool = True) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")
        if wait:
            self.idle()

    def start_long_answer(self) -> None:
        """Send Gemma a count that runs to its 900-token limit (~5 s here) and return once the
        answer is streaming."""
        self.settings(model=GEMMA, temperature=0, max_tokens=900)
        self.send("Count from 1 to 1000: 1, 2, 3,", wait=False)
        self.page.wait_for_function("() => { const c = document.querySelector('#messages article.assistant .content');"
                                    " return c && c.textContent.length > 20; }")

    def idle(self) -> None:
        """Until no answer is being generated (the Send button is back)."""
        self.page.wait_for_selector("#send:not([hidden])")
        self.page.wait_for_selector("#stop", state="hidden")

    def stored(self) -> dict:
        """The current conversation as the page keeps it in localStorage."""
        return self.page.evaluate("""() => {
            const id = JSON.parse(localStorage.getItem('gguf-serve.current'));
            return JSON.parse(localStorage.getItem('gguf-serve.conversation.' + id));
        }""")

    def articles(self, kind: str = "") -> list:
        return self.page.query_selector_all(f"#messages article{'.' + kind if kind else ''}")

    def unexpected_errors(self) -> list[str]:
        """Console errors other than the browser's note of a refused request."""
        return [e for e in self.errors if not e.startswith(RESOURCE_ERROR)]


@pytest.fixture
def tab(browser, base):
    t = Tab(browser, base)
    yield t
    t.close()


def api_chat(base: str, model: str, messages: list, **params) -> dict:
    r = httpx.post(f"{base}/v1/chat/completions", json={"model": model, "messages": messages, **params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def png(seed: int, size=(60, 40)) -> bytes:
    a = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


# ---------------------------------------------------------------------------- serving


def test_the_page_is_public_and_its_api_keeps_the_key(keyed, tiny_path):
    head = httpx.head(f"{keyed}/")  # what Claude Code sends to see that a server is there
    assert head.status_code == 200 and head.headers["content-type"].startswith("text/html")
    page = httpx.get(f"{keyed}/")
    assert page.status_code == 200 and '<script type="module" src="/webui/app.js">' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, kind in (("app.js", "javascript"), ("markdown.js", "javascript"), ("style.css", "text/css")):
        r = httpx.get(f"{keyed}/webui/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"], name
    assert httpx.get(f"{keyed}/webui/missing.js").status_code == 404
    assert httpx.get(f"{keyed}/v1/models").status_code == 401
    assert httpx.get(f"{keyed}/metrics").status_code == 401
    counted = scrape(keyed, headers={"Authorization": f"Bearer {KEY}"})  # the page's files under their own route
    assert value(counted, "gguf_serve_requests_total", endpoint="/webui/{file}", status="200") == 3
    assert value(counted, "gguf_serve_requests_total", endpoint="unmatched", status="200") == 0
    with server(tiny_path, "--no-webui") as b:
        assert httpx.head(f"{b}/").status_code == 404
        r = httpx.get(f"{b}/")
        assert r.status_code == 404 and "does not serve that path" in r.json()["error"]["message"]
        assert httpx.get(f"{b}/webui/app.js").status_code == 404


# ---------------------------------------------------------------------------- the page


def test_the_page_loads_with_no_console_errors_and_lists_the_models(tab, base):
    p = tab.page
    assert p.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == [GEMMA, THINKING, TOOLS, VISION]
    assert p.evaluate("document.activeElement.id") == "input"  # ready to type at once
    assert p.is_visible("#empty") and p.is_hidden("#key-dialog")
    tab.shot("empty")
    p.select_option("#model", GEMMA)  # a base model (no chat template): the page says what to expect
    assert p.is_visible("#base-model") and "no chat template" in p.inner_text("#base-model")
    p.select_option("#model", THINKING)
    assert p.is_hidden("#base-model")
    # the first request to a model not loaded says that it waits for the load, until the answer comes
    assert httpx.post(f"{base}/models/unload", json={"model": THINKING}).status_code == 200
    tab.reload()
    p.select_option("#model", THINKING)
    p.evaluate("""() => { window.notices = []; new MutationObserver(() => {
        const n = document.getElementById('notice'); if (n && n.textContent) window.notices.push(n.textContent);
    }).observe(document.body, {childList: true, subtree: true, characterData: true}); }""")
    tab.settings(max_tokens=4)
    tab.send("hi")
    assert any(n.startswith(f"Loading {THINKING}") for n in p.evaluate("window.notices"))
    assert p.is_hidden("#notice")
    assert tab.errors == []


def test_an_answer_streams_in_as_markdown_and_matches_the_api(tab, base):
    prompt = [{"role": "user", "content": "Write a long story about a dragon."}]
    api_chat(base, GEMMA, prompt, temperature=0, max_tokens=48)  # the prompt into the prefix cache, as later
    tab.settings(model=GEMMA, temperature=0, max_tokens=48)
    tab.page.evaluate("""() => {
        window.lengths = [];
        new MutationObserver(() => {
            const all = document.querySelectorAll('#messages article.assistant .content');
            if (all.length) window.lengths.push(all[all.length - 1].textContent.length);
        }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});
    }""")
    tab.send(prompt[0]["content"])
    lengths = tab.page.evaluate("window.lengths")
    final = lengths[-1]
    partial = sorted({n for n in lengths if 0 < n < final})
    assert final > 0 and len(partial) >= 2, lengths  # it came in pieces, as they were generated
    stored = tab.stored()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    answer = api_chat(base, GEMMA, prompt, temperature=0, max_tokens=48)
    assert stored[1]["content"] == answer["content"]  # the streamed pieces add up to the API's answer
    shown = tab.articles("assistant")[0]
    assert "48 tokens" in shown.inner_text() and "Reached the max tokens" in shown.inner_text()
    assert shown.query_selector(".content p") is not None
    tab.shot("answer")
    tab.page.click("#toggle-settings")
    tab.page.wait_for_selector("#settings", state="visible")
    tab.shot("answer-and-settings")
    assert tab.errors == []


def test_reasoning_is_shown_apart_folded_and_switched_off(tab, base):
    prompt = [{"role": "user", "content": "Think it over: why is the sky blue?"}]
    api_chat(base, THINKING, prompt, temperature=0, max_tokens=40)
    tab.settings(model=THINKING, temperature=0, max_tokens=40, reasoning="on")
    tab.send(prompt[0]["content"])
    answer = api_chat(base, THINKING, prompt, temperature=0, max_tokens=40,
                      chat_template_kwargs={"enable_thinking": True})
    assert answer["reasoning_content"]
    stored = tab.stored()["messages"][1]
    assert (stored["reasoning"], stored["content"]) == (answer["reasoning_content"], answer["content"])
    article = tab.articles("assistant")[0]
    details = article.query_selector("details.reasoning")
    assert details is not None and details.get_attribute("open") is None  # apart, and folded
    assert details.query_selector("summary").inner_text().startswith("Reasoning")
    assert article.query_selector(".content details, .content .reasoning-text") is None
    details.query_selector("summary").focus()
    tab.page.keyboard.press("Enter")  # unfolded from the keyboard
    assert details.get_attribute("open") is not None
    assert details.query_selector(".reasoning-text").text_content() == answer["reasoning_content"]
    tab.shot("reasoning")

    tab.settings(reasoning="off")
    tab.send("And now without thinking?")
    last = tab.stored()["messages"][-1]
    assert last["role"] == "assistant" and not last.get("reasoning")
    assert tab.articles("assistant")[-1].query_selector("details.reasoning") is None
    assert tab.errors == []


def test_stop_ends_the_generation_on_the_server(tab, base):
    tab.start_long_answer()
    p = tab.page
    assert p.is_visible("#stop") and p.is_hidden("#send")
    p.keyboard.press("Escape")  # the keyboard's stop; the button does the same
    tab.idle()
    article = tab.articles("assistant")[0]
    assert "Stopped" in article.query_selector(".meta").inner_text()
    deadline = time.time() + 10
    while value(scrape(base), "gguf_serve_requests_running", model=GEMMA) and time.time() < deadline:
        time.sleep(0.1)
    assert value(scrape(base), "gguf_serve_requests_running", model=GEMMA) == 0
    generated = value(scrape(base), "gguf_serve_generated_tokens_total", model=GEMMA)
    text = tab.stored()["messages"][1]["content"]
    time.sleep(0.5)
    assert value(scrape(base), "gguf_serve_generated_tokens_total", model=GEMMA) == generated
    assert 0 < len(text) and tab.stored()["messages"][1]["content"] == text
    assert tab.stored()["messages"][1].get("stopped") is True
    tab.shot("stopped")
    tab.settings(max_tokens=8)
    tab.send("Hello")  # and the page goes on
    assert [m["role"] for m in tab.stored()["messages"]] == ["user", "assistant", "user", "assistant"]
    assert tab.stored()["messages"][3]["content"]
    assert tab.errors == []


def test_a_conversation_deleted_while_it_streams_stays_deleted(tab):
    tab.start_long_answer()
    p = tab.page
    p.click("#conversations li:nth-child(1) [data-delete]")  # its answer is stopped, and not saved back
    tab.idle()
    assert p.query_selector_all("#conversations li") == [] and p.is_visible("#empty")
    kept = p.evaluate("Object.keys(localStorage).filter(k => k.startsWith('gguf-serve.conversation.'))")
    assert kept == [] and p.evaluate("JSON.parse(localStorage.getItem('gguf-serve.conversations'))") == []
    tab.reload()
    assert p.query_selector_all("#conversations li") == [] and p.is_visible("#empty")
    assert tab.errors == []


def test_a_reload_keeps_the_conversations(tab):
    tab.settings(model=THINKING, temperature=0, max_tokens=8, reasoning="off")
    tab.send("first conversation")
    first = tab.stored()
    tab.page.click("#new-chat")
    tab.send("second conversation")
    second = tab.stored()
    tab.reload()
    assert tab.stored()["id"] == second["id"]
    assert [a.inner_text() for a in tab.page.query_selector_all("#conversations .open")] == \
        ["second conversation", "first conversation"]
    assert tab.articles("user")[0].query_selector(".text").inner_text() == "second conversation"
    assert tab.page.input_value("#max-tokens") == "8" and tab.page.input_value("#reasoning") == "off"
    tab.page.click("#conversations li:nth-child(2) .open")
    assert tab.articles("user")[0].query_selector(".text").inner_text() == "first conversation"
    assert len(tab.articles("assistant")) == 1 and tab.stored()["messages"] == first["messages"]
    tab.page.click("#conversations li:nth-child(1) [data-delete]")  # the second one, still listed first
    assert [a.inner_text() for a in tab.page.query_selector_all("#conversations .open")] == ["first conversation"]
    assert tab.errors == []


def test_the_keyboard_alone_sends_edits_and_resends(tab):
    tab.settings(model=THINKING, temperature=0, max_tokens=6, reasoning="off")
    p = tab.page
    p.focus("#input")
    p.keyboard.type("a first try")
    p.keyboard.press("Enter")
    tab.idle()
    assert p.evaluate("document.activeElement.id") == "input"
    for _ in range(40):  # Tab round the page until the message's Edit button holds the focus
        p.keyboard.press("Tab")
        if p.evaluate("document.activeElement.dataset.action") == "edit":
            break
    else:
        pytest.fail("Tab never reached the Edit button")
    p.keyboard.press("Enter")
    assert p.evaluate("document.activeElement.getAttribute('aria-label')") == "Edit the message"
    p.keyboard.press("Control+A")
    p.keyboard.type("the second try")
    p.keyboard.press("Enter")
    tab.idle()
    stored = tab.stored()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"] and stored[0]["content"] == "the second try"
    assert tab.articles("user")[0].query_selector(".text").inner_text() == "the second try"
    assert tab.errors == []


def test_a_context_overflow_shows_the_error_and_the_next_message_works(tab):
    tab.settings(model=GEMMA, temperature=0, max_tokens=8)
    tab.send("word " * 1500)
    error = tab.articles("error")
    assert len(error) == 1
    text = error[0].inner_text()
    assert "too long for the model's context" in text and f"maximum context length is {CTX} tokens" in text
    assert "failed" in tab.articles("user")[0].get_attribute("class")
    tab.shot("overflow")
    tab.send("Hello")
    stored = tab.stored()["messages"]
    assert [m["role"] for m in stored] == ["user", "error", "user", "assistant"]
    assert stored[0]["failed"] is True and stored[3]["content"]
    assert len(tab.articles("error")) == 1
    assert tab.unexpected_errors() == [] and len(tab.errors) == 1  # the browser's note of the 400


def test_a_full_queue_shows_the_refusal_and_retry_goes_on(browser, gemma_path):
    with server(gemma_path, "--parallel", "1", "--max-queue", "1", "--ctx-size", str(CTX)) as b:
        release = threading.Event()

        def hold():  # a long generation, read until released; then the connection closes (cancelled)
            body = {"model": GEMMA, "messages": [{"role": "user", "content": "Count to 1000"}], "stream": True,
                    "max_tokens": 1000, "ignore_eos": True}
            with httpx.stream("POST", f"{b}/v1/chat/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    if release.is_set():
                        return

        holders = [threading.Thread(target=hold) for _ in range(2)]
        tab = Tab(browser, b)
        try:
            holders[0].start()
            deadline = time.time() + 30
            while value(scrape(b), "gguf_serve_requests_running", model=GEMMA) < 1 and time.time() < deadline:
                time.sleep(0.05)
            holders[1].start()  # the one slot taken, the one place in the queue too
            while value(scrape(b), "gguf_serve_queue_depth", model=GEMMA) < 1 and time.time() < deadline:
                time.sleep(0.05)
            tab.settings(temperature=0, max_tokens=8)
            tab.send("Hello")
            error = tab.articles("error")
            assert len(error) == 1 and "The server is busy." in error[0].inner_text()
            assert "request queue is full" in error[0].inner_text()
            tab.shot("queue-full")
            release.set()
            for h in holders:
                h.join(60)
            tab.page.click("#messages article.error button[data-action=retry]")
            tab.idle()
            stored = tab.stored()["messages"]
            assert [m["role"] for m in stored] == ["user", "assistant"] and stored[1]["content"]
            assert not tab.articles("error") and tab.unexpected_errors() == []
        finally:
            release.set()
            tab.close()


def test_tool_calls_are_shown_as_calls_and_their_results_go_back(tab, base):
    tab.settings(model=TOOLS, temperature=0, max_tokens=200, tools=[WEATHER], tool_choice="required")
    tab.send("What is the weather in Paris?")
    stored = tab.stored()["messages"]
    calls = stored[1]["tool_calls"]
    assert len(calls) >= 1 and calls[0]["function"]["name"] == "get_weather"
    args = json.loads(calls[0]["function"]["arguments"])
    assert set(args) == {"city", "unit"}
    card = tab.articles("assistant")[0].query_selector(".tool-call")
    assert card.query_selector(".tool-head code").inner_text() == "get_weather"
    assert json.loads(card.query_selector(".tool-args").inner_text()) == args
    tab.shot("tool-call")
    for i, call in enumerate(calls):  # each call answered from its card
        form = tab.page.query_selector_all("form.tool-reply")[0]
        form.query_selector("textarea").fill(f"sunny, {20 + i} degrees")
        form.query_selector("button[type=submit]").click()
    tab.idle()
    stored = tab.stored()["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", *["tool"] * len(calls), "assistant"]
    assert stored[2]["tool_call_id"] == calls[0]["id"] and stored[2]["content"] == "sunny, 20 degrees"
    assert "Result of get_weather" in tab.articles("tool")[0].inner_text()
    assert tab.errors == []


def test_an_image_is_attached_and_sent(tab, tmp_path):
    tab.settings(model=VISION, temperature=0, max_tokens=6)
    p = tab.page
    assert p.is_visible("#attach")
    image = tmp_path / "picture.png"
    image.write_bytes(png(3))
    p.set_input_files("#file", str(image))
    p.wait_for_selector("#attachments img")
    tab.send("What is in this picture?")
    stored = tab.stored()["messages"]
    assert stored[0]["images"] == ["data:image/png;base64," + base64.b64encode(png(3)).decode()]
    assert stored[1]["role"] == "assistant" and stored[1].get("usage", {}).get("prompt_tokens", 0) > 16
    assert tab.articles("user")[0].query_selector("img") is not None
    assert p.is_hidden("#attachments")
    p.select_option("#model", GEMMA)  # a model without a vision file takes no images
    assert p.is_hidden("#attach")
    assert tab.errors == []


def test_code_blocks_get_copy_buttons_and_nothing_a_model_writes_becomes_markup(tab):
    p = tab.page
    html = p.evaluate("""async () => {
        const md = await import('/webui/markdown.js');
        return md.renderMarkdown([
            '# Title', '', 'Some **bold**, *italic* and `code <b>`.', '',
            '- one', '- two', '  - nested', '', '1. first', '2. second', '',
            '| a | b |', '|---|--:|', '| 1 | 2 |', '',
            '```python', 'print("<script>alert(1)</script>")', '```', '',
            '<img src=x onerror=alert(1)> [bad](javascript:alert(1)) [good](https://example.com/a?b=1&c=2)',
        ].join('\\n'));
    }""")
    assert "<h1>Title</h1>" in html and "<strong>bold</strong>" in html and "<em>italic</em>" in html
    assert "<code>code &lt;b&gt;</code>" in html
    assert "<ul><li>one</li><li>two<ul><li>nested</li></ul></li></ul>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
    assert '<td class="align-right">2</td>' in html
    assert '<code class="language-python">print(&quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;)</code>' in html
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'href="javascript' not in html and "[bad](javascript:alert(1))" in html
    assert '<a href="https://example.com/a?b=1&amp;c=2"' in html
    # a block on the page: its Copy button puts the code, as written, on the clipboard
    p.evaluate("""async () => {
        const md = await import('/webui/markdown.js');
        const box = document.createElement('div');
        box.innerHTML = md.renderMarkdown('```sh\\necho "a < b"\\n```');
        document.getElementById('messages').append(box);
    }""")
    p.click("[data-copy]")
    p.wait_for_selector("[data-copy]:text('Copied')")
    assert p.evaluate("navigator.clipboard.readText()") == 'echo "a < b"'
    assert tab.errors == []


def test_a_phone_sized_window(browser, base):
    tab = Tab(browser, base, width=390, height=844)
    try:
        p = tab.page
        assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        assert p.is_hidden("#sidebar") and p.is_visible("#open-sidebar")
        assert p.is_visible("#input") and p.is_visible("#send")
        tab.settings(model=THINKING, temperature=0, max_tokens=30, reasoning="on")
        tab.send("A question from a phone " + "with many words " * 8)
        assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
        tab.shot("phone")
        p.focus("#open-sidebar")
        p.keyboard.press("Enter")  # the drawer, from the keyboard
        p.wait_for_selector("#sidebar", state="visible")
        assert p.evaluate("document.activeElement.id") == "new-chat"
        assert p.query_selector_all("#conversations .open")[0].inner_text().startswith("A question from a phone")
        tab.shot("phone-conversations")
        p.keyboard.press("Escape")
        p.wait_for_selector("#sidebar", state="hidden")
        assert tab.errors == []
    finally:
        tab.close()


def test_an_invalid_key_shows_the_error_and_the_right_one_is_kept(browser, keyed):
    tab = Tab(browser, keyed)
    try:
        p = tab.page
        p.wait_for_selector("#key-dialog[open]")  # the models could not be listed without it
        p.fill("#key-input", "not-the-key")
        p.press("#key-input", "Enter")
        p.wait_for_selector("#key-error:not([hidden])")
        assert "Incorrect or missing API key" in p.inner_text("#key-error")
        tab.shot("key-refused")
        p.fill("#key-input", KEY)
        p.press("#key-input", "Enter")
        p.wait_for_selector("#key-dialog", state="hidden")
        assert p.eval_on_selector_all("#model option", "os => os.map(o => o.value)") == [THINKING]
        tab.settings(temperature=0, max_tokens=6, reasoning="off")
        tab.send("hello with a key")
        assert tab.stored()["messages"][1]["role"] == "assistant"
        tab.reload()  # the key is kept in the browser
        assert p.is_hidden("#key-dialog") and p.input_value("#model") == THINKING
        # a wrong key set later: the dialog says so, and a message sent with it shows the refusal
        p.click("#set-key")
        p.fill("#key-input", "revoked")
        p.press("#key-input", "Enter")
        p.wait_for_selector("#key-error:not([hidden])")
        p.click("#key-cancel")
        tab.send("and without it?")
        error = tab.articles("error")
        assert len(error) == 1 and "refused the API key" in error[0].inner_text()
        assert "Incorrect or missing API key" in error[0].inner_text()
        assert tab.unexpected_errors() == []
    finally:
        tab.close()


def test_the_settings_selects_show_their_whole_choice(browser, base):
    """At a laptop's 1280 px and narrower, each settings select is wide enough for its chosen
    option's text and its arrow (the reasoning one was clipped at 1280 px)."""
    for width in (1280, 1100, 390):
        tab = Tab(browser, base, width=width)
        try:
            tab.page.click("#toggle-settings")
            for select in ("#reasoning", "#tool-choice"):
                shown, needed = tab.page.evaluate("""(id) => {
                    const s = document.querySelector(id), c = document.createElement('canvas').getContext('2d');
                    c.font = getComputedStyle(s).font;
                    return [s.getBoundingClientRect().width, c.measureText(s.options[s.selectedIndex].text).width];
                }""", select)
                assert shown >= needed + 32, (width, select, shown, needed)  # the arrow and the padding
        finally:
            tab.close()
