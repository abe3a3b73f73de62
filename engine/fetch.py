"""Hub model IDs (`<repo>:<file>.gguf`, `<repo>@<revision>:<file>.gguf`, and the
`<repo>:<QUANT>` / bare `<repo>` forms that the server resolves against a repo's
files), and fetching a file, with every shard of a split model, into the standard
Hugging Face cache through huggingface_hub."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from ..gguf_io.reader import SHARD_PATTERN

log = logging.getLogger("gguf_serve.engine")

_REPO = r"[A-Za-z0-9][\w.\-]*/[\w.\-]+"
_ID = re.compile(rf"^(?P<repo>{_REPO})(?:@(?P<rev>[\w.\-/]+?))?(?::(?P<tail>[^:]+))?$")


@dataclass(frozen=True)
class ModelRef:
    repo: str
    revision: str | None
    filename: str | None  # a .gguf file name in the repo
    quant: str | None  # a quant name to match against the files


def parse(spec: str) -> ModelRef | None:
    """A Hub reference, or None if `spec` does not look like one."""
    m = _ID.match(spec)
    if m is None:
        return None
    tail = m["tail"]
    if tail is None:
        return ModelRef(m["repo"], m["rev"], None, None)
    if tail.lower().endswith(".gguf"):
        return ModelRef(m["repo"], m["rev"], tail, None)
    return ModelRef(m["repo"], m["rev"], None, tail)


def model_id(repo: str, filename: str, revision: str | None = None) -> str:
    return f"{repo}@{revision}:{filename}" if revision else f"{repo}:{filename}"


def is_follow_on_shard(filename: str) -> bool:
    m = SHARD_PATTERN.match(os.path.basename(filename))
    return m is not None and int(m["no"]) != 1


# files that sit beside a model in GGUF repositories and are not models, by a marker in
# their names (those llama.cpp's downloader leaves out when it looks for a model)
COMPANIONS = {"mmproj": "vision projector (mmproj)", "imatrix": "importance matrix", "mtp-": "MTP draft head",
              "eagle3-": "EAGLE-3 draft head", "dflash-": "DFlash draft head", "dspark-": "DSpark draft head"}


def companion_kind(filename: str) -> str | None:
    """What a .gguf file beside a model is (a COMPANIONS description), or None for a model."""
    name = os.path.basename(filename).lower()
    return next((what for marker, what in COMPANIONS.items() if marker in name), None)


def is_model_file(filename: str) -> bool:
    """A .gguf file that is a model to list: not a follow-on shard, not a companion file."""
    return (filename.lower().endswith(".gguf") and not is_follow_on_shard(filename)
            and companion_kind(filename) is None)


def _quant_bits(filename: str) -> int:
    """The bits of a file's quantization tag, as llama.cpp's downloader reads them: the first
    number in the last '-' part of its name (Q4_K_M: 4, F16: 16), 0 without one."""
    tag = os.path.basename(filename)[:-len(".gguf")].rsplit("-", 1)[-1]
    m = re.search(r"\d+", tag)
    return int(m.group()) if m else 0


def best_companion(files: list[str], model: str, marker: str = "mmproj") -> str | None:
    """The companion file (`marker` in its name: mmproj) that goes with `model` among a
    repository's or directory's files, chosen as llama.cpp's downloader does
    (find_best_sibling): in the model's folder or one above it, the deepest; then the
    quantization closest to the model's (an F16 vision file for a Q4_K_M model: 16 vs 4,
    but the only one)."""
    model_dir = os.path.dirname(model).split("/") if os.path.dirname(model) else []
    bits = _quant_bits(model)
    best, best_key = None, None
    for f in files:
        if not f.lower().endswith(".gguf") or marker not in os.path.basename(f).lower() or is_follow_on_shard(f):
            continue
        d = os.path.dirname(f).split("/") if os.path.dirname(f) else []
        if model_dir[:len(d)] != d:
            continue
        key = (-len(d), abs(_quant_bits(f) - bits), f)
        if best_key is None or key < best_key:
            best, best_key = f, key
    return best


def download(repo: str, filename: str, revision: str | None = None, cached_only: bool = False) -> str:
    """Local path of the file (all shards fetched for a split model); `cached_only`: from
    the cache or not at all."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, filename, revision=revision, local_files_only=cached_only)
    m = SHARD_PATTERN.match(os.path.basename(filename))
    if m is not None:
        folder = os.path.dirname(filename)
        for i in range(2, int(m["count"]) + 1):
            shard = f"{m['prefix']}-{i:05d}-of-{m['count']}.gguf"
            hf_hub_download(repo, f"{folder}/{shard}" if folder else shard, revision=revision,
                            local_files_only=cached_only)
    return path


def cached_gguf_models() -> list[tuple[str, str]]:
    """(model id, local path) of every .gguf file in the Hub cache (first shards only)."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    try:
        info = scan_cache_dir()
    except CacheNotFound:  # no cache yet: nothing cached
        return []
    except CorruptedCacheException as e:  # said, and served without the cache's models
        log.warning("the Hugging Face cache cannot be read, so its models are not listed: %s", e)
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            for f in rev.files:
                name = f.file_name
                rel = str(f.file_path).split(f"/snapshots/{rev.commit_hash}/", 1)[-1]
                if is_model_file(name):
                    out.append((model_id(repo.repo_id, rel), str(f.file_path)))
    return sorted(set(out))
