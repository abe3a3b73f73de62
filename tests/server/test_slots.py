"""llama-server's /slots on real servers with a tiny model: the list, a slot's state saved
to --slot-save-path, erased, restored into a slot and reused by the next prompt (the
same tokens as from the slot it was saved from), taken back by a server started later,
and the errors: bad file names, missing or foreign files, busy and unknown slots, a
server without --slot-save-path or with --no-slots."""

from __future__ import annotations

import httpx
import pytest

from server_harness import THINKING_TEMPLATE, no_end, server
from tiny_models import tiny_chat_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_chat_model(tmp_path_factory.mktemp("slots"), "tiny-slots.gguf", 21, THINKING_TEMPLATE)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    return tmp_path_factory.mktemp("saved")


def post(base, path, status=200, **body):
    r = httpx.post(f"{base}{path}", json=body, timeout=120)
    assert r.status_code == status, r.text
    return r.json()


def complete(base, bias, prompt, n=6):
    return post(base, "/completion", prompt=prompt, n_predict=n, temperature=0, logit_bias=bias, return_tokens=True)


def test_a_saved_slot_is_restored_into_another_and_by_a_restarted_server(tiny, saved):
    bias = no_end(tiny)
    prompt = "the quick brown fox jumps over the lazy dog " * 3
    with server(tiny, "--parallel", "2", "--slot-save-path", str(saved)) as base:
        first = complete(base, bias, prompt)
        slot = first["id_slot"]
        held = first["tokens_evaluated"] + first["tokens_predicted"] - 1  # the last token is not fed yet
        listed = httpx.get(f"{base}/slots").json()
        assert [r["id"] for r in listed] == [0, 1] and listed[slot]["n_prompt_tokens"] == held
        assert not listed[slot]["is_processing"] and listed[slot]["n_ctx"] > 0

        r = post(base, f"/slots/{slot}?action=save", filename="conv.bin")
        assert r["id_slot"] == slot and r["n_saved"] == held and r["filename"] == "conv.bin"
        assert r["n_written"] == (saved / "conv.bin").stat().st_size and r["timings"]["save_ms"] >= 0

        follow = [prompt, *first["tokens"], " and then"]  # the conversation's very tokens, then more
        expect = complete(base, bias, follow)
        assert expect["timings"]["cache_n"] == held  # reused from the slot kept
        for s in (0, 1):
            post(base, f"/slots/{s}?action=erase")
        assert all(r["n_prompt_tokens"] == 0 for r in httpx.get(f"{base}/slots").json())

        other = 1 - slot
        r = post(base, f"/slots/{other}?action=restore", filename="conv.bin")
        assert r["id_slot"] == other and r["n_restored"] == held and r["n_read"] > 0
        assert httpx.get(f"{base}/slots").json()[other]["n_prompt_tokens"] == held
        again = complete(base, bias, follow)
        assert again["timings"]["cache_n"] == held and again["content"] == expect["content"]
        assert again["id_slot"] == other

    with server(tiny, "--parallel", "2", "--slot-save-path", str(saved)) as base:  # a restart
        assert post(base, "/slots/0?action=restore", filename="conv.bin")["n_restored"] == held
        later = complete(base, bias, follow)
        assert later["timings"]["cache_n"] == held and later["content"] == expect["content"]

        # what is refused, with the server going on
        for name in ("../conv.bin", "a/b", "", ".", " x"):
            assert "filename" in post(base, "/slots/0?action=save", 400, filename=name)["error"]["message"]
        assert "no slot file" in post(base, "/slots/0?action=restore", 400, filename="none.bin")["error"]["message"]
        (saved / "junk.bin").write_bytes(b"\x00" * 64)
        assert "not a slot file" in post(base, "/slots/0?action=restore", 400,
                                         filename="junk.bin")["error"]["message"]
        assert "Invalid slot ID" in post(base, "/slots/7?action=erase", 400)["error"]["message"]
        assert "Invalid action" in post(base, "/slots/0?action=drop", 400)["error"]["message"]
        assert complete(base, bias, "still here", n=2)["tokens_predicted"] == 2


def test_a_file_saved_from_another_model_is_refused(tiny, saved, tmp_path):
    other = tiny_chat_model(tmp_path, "other.gguf", 5, THINKING_TEMPLATE, arch="llama")
    with server(tiny, "--slot-save-path", str(saved)) as base:
        complete(base, no_end(tiny), "one two three")
        post(base, "/slots/0?action=save", filename="mine.bin")
    with server(other, "--slot-save-path", str(saved)) as base:
        msg = post(base, "/slots/0?action=restore", 400, filename="mine.bin")["error"]["message"]
        assert "another model" in msg


def test_without_a_save_path_slot_actions_are_501_and_no_slots_hides_the_list(tiny):
    with server(tiny, "--no-slots") as base:
        r = httpx.post(f"{base}/slots/0?action=save", json={"filename": "x.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
        r = httpx.get(f"{base}/slots")
        assert r.status_code == 501 and "--slots" in r.json()["error"]["message"]
