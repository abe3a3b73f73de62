"""Model IDs as the ecosystem writes them, resolved through huggingface_hub:

- `<repo>:<file>.gguf` (a model card's form) and `<repo>@<revision>:<file>.gguf`
- `<repo>:<QUANT>` (e.g. `:Q4_K_M`, case-insensitive, matched against file names, as
  llama.cpp's `-hf` and Ollama's `hf.co/` do)
- a bare `<repo>`: its Q4_K_M file if present, else its only file, else an error
  listing the choices
- a local path to a .gguf file

Split models are one model named by their first shard; fetching it fetches every shard.
Downloads land in the standard Hub cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE honoured)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..gguf_io.reader import SHARD_PATTERN
from .errors import BadRequest, ModelNotFound

DEFAULT_QUANT = "Q4_K_M"
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


def gguf_files(repo: str, revision: str | None = None) -> list[str]:
    """The repo's .gguf files (split models by their first shard only)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    try:
        files = HfApi().list_repo_files(repo, revision=revision)
    except RepositoryNotFoundError:
        raise ModelNotFound(repo) from None
    except (HfHubHTTPError, OSError, ValueError, TypeError, KeyError) as e:  # offline, unreachable or garbled
        raise ModelNotFound(f"{repo} (the Hub could not be listed: {e})") from None
    return sorted(f for f in files if f.lower().endswith(".gguf") and not is_follow_on_shard(f))


_SHARD_SUFFIX = re.compile(r"-\d{5}-of-\d{5}$")


def _stem(filename: str) -> str:
    return _SHARD_SUFFIX.sub("", os.path.basename(filename)[: -len(".gguf")])


def _quant_matches(filename: str, quant: str, *, at_end: bool) -> bool:
    tail = "$" if at_end else "(?:$|[-_.])"
    return re.search(rf"(?:^|[-_.]){re.escape(quant)}{tail}", _stem(filename), re.IGNORECASE) is not None


def _by_quant(files: list[str], quant: str) -> list[str]:
    exact = [f for f in files if _quant_matches(f, quant, at_end=True)]
    return exact or [f for f in files if _quant_matches(f, quant, at_end=False)]


def choose_file(ref: ModelRef, files: list[str]) -> str:
    if ref.filename:
        if ref.filename not in files:
            raise ModelNotFound(model_id(ref.repo, ref.filename, ref.revision))
        return ref.filename
    if ref.quant:
        hits = _by_quant(files, ref.quant)
        if not hits:
            raise BadRequest(f"{ref.repo} has no {ref.quant} file; choices: {', '.join(files) or 'none'}", param="model")
        return hits[0]
    hits = _by_quant(files, DEFAULT_QUANT)
    if hits:
        return hits[0]
    if len(files) == 1:
        return files[0]
    raise BadRequest(f"{ref.repo} has {len(files)} GGUF files; name one: {', '.join(files) or 'none'}", param="model")


def download(repo: str, filename: str, revision: str | None = None) -> str:
    """Local path of the file (all shards fetched for a split model)."""
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo, filename, revision=revision)
    m = SHARD_PATTERN.match(os.path.basename(filename))
    if m is not None:
        folder = os.path.dirname(filename)
        for i in range(2, int(m["count"]) + 1):
            shard = f"{m['prefix']}-{i:05d}-of-{m['count']}.gguf"
            hf_hub_download(repo, f"{folder}/{shard}" if folder else shard, revision=revision)
    return path


def cached_gguf_models() -> list[tuple[str, str]]:
    """(model id, local path) of every .gguf file in the Hub cache (first shards only)."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir()
    except Exception:
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for rev in repo.revisions:
            for f in rev.files:
                name = f.file_name
                rel = str(f.file_path).split(f"/snapshots/{rev.commit_hash}/", 1)[-1]
                if name.lower().endswith(".gguf") and not is_follow_on_shard(name):
                    out.append((model_id(repo.repo_id, rel), str(f.file_path)))
    return sorted(set(out))
