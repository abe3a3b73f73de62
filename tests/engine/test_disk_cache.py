"""The prompt cache's disk tier on tiny models of the three cache kinds (full attention, a
sliding ring the conversation outgrows, recurrent states): a conversation's slot written
when its scheduler closes (a model unloaded, a server stopped) and read back by a new
scheduler, whose next turn reuses it and gives the tokens of a cold start; a slot evicted
for another written too; a damaged or truncated file dropped, never served; a changed
model file, other adapters, and the folder's byte budget."""

import os
import shutil

import pytest

from gguf_serve.engine import kernels, load_model
from gguf_serve.engine.scheduler import CHECKPOINT_BEFORE_END, Request, Scheduler
from gguf_serve.engine.scheduler.disk import SUFFIX, DiskCache, read_header

from sequences import alone, greedy, prompts
from tiny_models import random_model, spec, write_gguf


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    os.environ[kernels.ENV_OVERRIDE] = "reference"  # float32 all through: reused and cold tokens equal
    out = {}
    try:
        for arch in ("qwen3", "gemma3", "qwen35"):
            s = spec(arch)
            path = tmp_path_factory.mktemp(arch) / f"{arch}.gguf"
            write_gguf(s, random_model(s, seed=3), path, "Q8_0")
            out[arch] = load_model(str(path), device="cpu", n_seq=2, max_batch=16 if arch == "gemma3" else None)
        yield out
    finally:
        del os.environ[kernels.ENV_OVERRIDE]


def disk_of(lm, folder, **kw) -> DiskCache:
    d = DiskCache.for_model(lm, str(folder), **kw)
    d.min_tokens = 16  # the tiny conversations here are shorter than a real one worth keeping
    return d


def ask(sched, prompt, n=8):
    """One request run to its end: the prompt tokens reused, and the tokens generated."""
    before = sched.prefix_hit_tokens
    out = []
    sched.add(Request(prompt, [greedy(n)], out.append))
    while sched.busy:
        sched.step()
    assert out[-1] is None, out[-1]
    return sched.prefix_hit_tokens - before, [s.token_id for s in out[:-1] if s.token_id is not None]


def files(folder):
    return sorted(p for p in folder.rglob(f"*{SUFFIX}"))


@pytest.mark.parametrize("arch", ["qwen3", "gemma3", "qwen35"])
def test_a_conversation_goes_on_from_disk_after_its_scheduler_closed(models, arch, tmp_path):
    """The next turn of a thinking chat leaves the last prompt inside its assistant header:
    full attention goes on from there; the ring (outgrown by a 30-token reply) and the
    recurrent states from the checkpoint CHECKPOINT_BEFORE_END tokens before the end."""
    lm = models[arch]
    system, turn1, header, answer1, turn2 = prompts(60, 10, 3, 6, 9, seed=6)
    first = system + turn1 + header
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path))
    assert ask(sched, first, 30)[0] == 0
    sched.close()  # the model unloads: its kept slot is written
    (path,) = files(tmp_path)
    header_read = read_header(str(path))
    assert len(header_read["tokens"]) == len(first) + 29
    assert header_read["points"] == ([] if arch == "qwen3" else [len(first) - CHECKPOINT_BEFORE_END, len(first) + 29])

    second = system + turn1 + answer1 + turn2 + header
    again = Scheduler(lm, disk=disk_of(lm, tmp_path))  # a later load: reads the folder
    n, got = ask(again, second, 30)
    expect = len(system + turn1) if arch == "qwen3" else len(first) - CHECKPOINT_BEFORE_END
    assert n == expect and again.prefix.disk.stats.hits == 1
    assert got == alone(lm, second, greedy(30))
    again.close()


def test_a_slot_evicted_for_another_is_written_and_read_back(models, tmp_path):
    lm = models["qwen3"]  # two slots
    a, b, c = prompts(40, 41, 42, seed=8)
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path))
    for p in (a, b):
        ask(sched, p)
    assert files(tmp_path) == []  # both kept in RAM
    ask(sched, c)  # evicts a's slot: written
    sched.prefix.disk.flush()
    assert len(files(tmp_path)) == 1
    follow = a + prompts(5, seed=9)[0]
    n, got = ask(sched, follow)
    sched.close()  # (its two slots held: generate() needs one)
    assert n == len(a) and got == alone(lm, follow, greedy(8))  # a new question after the same prompt


@pytest.mark.parametrize("damage", ["flip", "truncate", "header"])
def test_a_damaged_file_is_dropped_and_never_served(models, tmp_path, damage):
    lm = models["qwen35"]
    conv = prompts(50, seed=10)[0]
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path))
    _, reply = ask(sched, conv)
    sched.close()
    (path,) = files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0x40  # in the last tensor: the recurrent state at the end
    elif damage == "truncate":
        del data[-1000:]
    else:
        data[40] ^= 0x01  # inside the header's JSON
    path.write_bytes(bytes(data))

    follow = conv + reply + prompts(6, seed=11)[0]
    again = Scheduler(lm, disk=disk_of(lm, tmp_path))
    n, got = ask(again, follow)
    assert n == 0 and got == alone(lm, follow, greedy(8))
    assert again.prefix.disk.stats.dropped == 1 and not path.exists()
    again.close()


def test_a_changed_model_file_or_other_adapters_find_nothing(models, tmp_path):
    src = models["qwen3"].gguf.path
    path = tmp_path / "copy.gguf"
    shutil.copy(src, path)
    lm = load_model(str(path), device="cpu", n_seq=2)
    conv = prompts(40, seed=12)[0]
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path / "cache"))
    _, reply = ask(sched, conv)
    sched.close()
    follow = conv + reply + [5, 6, 7]
    d = disk_of(lm, tmp_path / "cache")
    assert d.find(follow, d.adapters(()))[1] == len(conv) + 7
    assert d.find(follow, "another adapter*1.0") == (None, 0)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file rewritten (a new download)
    later = load_model(str(path), device="cpu", n_seq=2)
    d2 = disk_of(later, tmp_path / "cache")
    assert d2.folder != d.folder and d2.find(follow, d2.adapters(())) == (None, 0)


def test_the_folder_stays_within_its_budget(models, tmp_path):
    lm = models["qwen3"]
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path))
    convs = prompts(40, 44, 48, seed=13)
    ask(sched, convs[0])
    sched.close()
    (one,) = files(tmp_path)
    size = one.stat().st_size
    budget = int(size * 2.5)  # room for two
    sched = Scheduler(lm, disk=disk_of(lm, tmp_path, budget=budget))
    for c in convs[1:]:
        ask(sched, c)
    sched.close()
    kept = files(tmp_path)
    assert len(kept) == 2 and sum(p.stat().st_size for p in kept) <= budget
    assert one not in kept  # the least recently used went
