"""Model IDs as the ecosystem writes them, resolved through huggingface_hub:

- `<repo>:<file>.gguf` (a model card's form) and `<repo>@<revision>:<file>.gguf`
- `<repo>:<QUANT>` (e.g. `:Q4_K_M`, case-insensitive, matched against file names, as
  llama.cpp's `-hf` and Ollama's `hf.co/` do)
- a bare `<repo>`: its Q4_K_M file if present, else its only file, else an error
  listing the choices
- a local path to a .gguf file

Split models are one model named by their first shard; fetching it fetches every shard.
Downloads land in the standard Hub cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE honoured).
Parsing IDs and fetching files live in engine.fetch (load_model takes the same IDs);
this module adds what needs the repo's file list: quant and bare-repo choices."""

from __future__ import annotations

import os
import re

# re-exported: the server reaches every Hub helper through this module
from ...engine import (ModelRef, best_companion, cached_gguf_models, companion_kind, download, is_model_file,  # noqa: F401
                            model_id, parse)
from ..core.errors import APIError, BadRequest, Forbidden, ModelNotFound, Unavailable

DEFAULT_QUANT = "Q4_K_M"
REACH_TIMEOUT = 3.0  # seconds for the one quick probe of the endpoint


def endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline() -> bool:
    """HF_HUB_OFFLINE (or --offline) is set."""
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def reachable() -> bool:
    """Whether the Hub endpoint answers at all: one quick probe, no retries (huggingface_hub
    retries a dead endpoint for ~25 s per call). Offline mode: never."""
    import httpx

    if offline():
        return False
    try:
        httpx.head(endpoint(), timeout=REACH_TIMEOUT)
        return True
    except httpx.HTTPError:
        return False


def gguf_files(repo: str, revision: str | None = None, models_only: bool = True) -> list[str]:
    """The repo's .gguf models (split models by their first shard only; vision projectors,
    importance matrices and separate draft heads left out; all its .gguf files with
    `models_only` False); a failure is the API error it means (hub_error)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().list_repo_files(repo, revision=revision)
    except Exception as e:  # every Hub failure, mapped to what it means
        raise hub_error(e, model_id(repo, "", revision).rstrip(":")) from e
    return sorted(f for f in files if is_model_file(f) or (not models_only and f.lower().endswith(".gguf")))


TOKEN_HINT = "set HF_TOKEN (or run `hf auth login`) with a token that has access"


def hub_error(e: Exception, what: str) -> APIError:
    """A huggingface_hub failure as the API error it means, naming `what` was asked for:
    a gated or forbidden repository 403 (naming the token setting), a missing repository,
    revision or file 404, a Hub that does not answer 503 (naming --offline), and with
    --offline a file not in the cache 404 (saying that --offline keeps it from being
    fetched). Anything else is re-raised as it is."""
    import httpx
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled,
                                        RemoteEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError)

    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, GatedRepoError):
        return Forbidden(f"{what} is a gated repository on {endpoint()}: accept its conditions on the Hub and "
                         f"{TOKEN_HINT}", param="model", code="model_access_denied")
    if isinstance(e, RepositoryNotFoundError):
        return ModelNotFound(what, f"no such repository on {endpoint()} (if it is private, {TOKEN_HINT})")
    if isinstance(e, RevisionNotFoundError):
        return ModelNotFound(what, f"no such revision on {endpoint()}")
    if isinstance(e, RemoteEntryNotFoundError):
        return ModelNotFound(what, f"no such file in the repository on {endpoint()}")
    if isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        if offline():
            return ModelNotFound(what, "not in the Hub cache, and --offline (HF_HUB_OFFLINE) keeps it from being "
                                       "downloaded")
        return Unavailable(f"cannot fetch {what}: the Hub at {endpoint()} does not answer and it is not in the "
                           f"cache (--offline serves the files already cached)", code="hub_unreachable")
    if isinstance(e, HfHubHTTPError) and status in (401, 403):
        return Forbidden(f"{endpoint()} refused access to {what} ({status}): {TOKEN_HINT}", param="model",
                         code="model_access_denied")
    if isinstance(e, (HfHubHTTPError, httpx.HTTPError, ConnectionError, TimeoutError)):
        return Unavailable(f"cannot fetch {what} from {endpoint()}: {e} (--offline serves the files already cached)",
                           code="hub_unreachable")
    raise e


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
    if ref.filename and companion_kind(ref.filename):
        raise BadRequest(f"{ref.filename} is a {companion_kind(ref.filename)} that goes with a model, not a model; "
                         f"name one of {ref.repo}'s models: {', '.join(files) or 'none'}", param="model")
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
