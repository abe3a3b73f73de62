"""Errors of the format layer. Each names the file and the record at fault."""

from __future__ import annotations


class GGUFError(ValueError):
    """A GGUF file is malformed, truncated, or uses something this reader refuses."""

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None):
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"byte {offset}")
        self.path = path
        self.offset = offset
        self.detail = message
        super().__init__(f"{': '.join(where)}: {message}" if where else message)
