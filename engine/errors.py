"""The engine's errors, in one place. Each subclasses the stdlib type a caller would
catch without knowing the engine (ValueError, KeyError, RuntimeError) as it did
where it was defined before (those modules still export it).

Two kinds matter to a caller that loads models: a `FileError` is the file's own fault
(its tensors, metadata, tokenizer, architecture or vision file): loading it again fails
the same way. Anything in `TRANSIENT` (memory, the file system, a timeout) may pass:
loading again later may succeed. The format layer's own `GGUFError` (gguf_io.errors)
is the file's fault too; `is_file_error` counts it."""

from __future__ import annotations

from ..gguf_io import GGUFError

# failures of a load that may pass: memory short for now, a file being replaced, a disk or network hiccup
TRANSIENT: tuple[type[BaseException], ...] = (MemoryError, OSError, TimeoutError)


class FileError(Exception):
    """A model file (or its vision or draft file) is at fault: loading it again fails the same way."""


class WeightError(FileError, ValueError):
    """The file's tensors do not fit the model its metadata describes."""


class MissingMetadata(FileError, KeyError):
    """A key the architecture needs is absent from the file."""

    def __str__(self) -> str:  # KeyError's str() would quote the message
        return str(self.args[0])


class UnsupportedArchitecture(FileError, ValueError):
    """The file's architecture has no file here."""


class TokenizerError(FileError, ValueError):
    """The file's tokenizer keys are missing or of a kind not supported."""


class VisionFileError(FileError, ValueError):
    """A vision file that does not fit (not a clip file, an unknown tower, another text model's)."""


class DraftMismatch(FileError, ValueError):
    """A draft model whose vocabulary is not its target's."""


class SpeculationError(ValueError):
    """A speculative decoding setting this model cannot honour."""


class KernelError(RuntimeError):
    """A native kernel call failed; the message names the call, its status and its operands."""


class CacheError(ValueError):
    """A batch does not fit what the cache holds (slot, position, size)."""


class GrammarError(ValueError):
    """A grammar or schema the engine cannot compile."""


class MediaError(ValueError):
    """Media (an image or an audio clip) this model cannot take, or a prompt whose media marks do not fit it."""


class ImageError(MediaError):
    """An image this model cannot take: it does not decode, is over a limit, or the model has no vision file."""


class AudioError(MediaError):
    """Audio this model cannot take: it does not decode, is empty, is over a limit, or is not the format named."""


class TemplateError(ValueError):
    """A chat template failed on these messages: its own error (`kind` "template"), more
    memory than a render may take ("memory"), a prompt longer than the context can take
    ("size"), or past its time limit ("timeout"); or no worker was free in time ("busy")."""

    def __init__(self, message: str, kind: str = "template"):
        super().__init__(message)
        self.kind = kind


class EmbeddingError(ValueError):
    """An input the model cannot embed (too long for one forward or for the context)."""

    def __init__(self, message: str, index: int):
        super().__init__(message)
        self.index = index


def is_file_error(e: BaseException) -> bool:
    """Whether `e` is the file's own fault (the engine's FileError or the format layer's GGUFError)."""
    return isinstance(e, (FileError, GGUFError))


def is_transient(e: BaseException) -> bool:
    """Whether a load that failed with `e` may succeed later (memory, the file system, a timeout)."""
    return isinstance(e, TRANSIENT) and not is_file_error(e)
