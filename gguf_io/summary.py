"""What a user wants to know about a model file before serving it, as plain data."""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from .constants import FILE_TYPES, Keys
from .reader import GGUFReader


def _human(n: float, unit: str = "B") -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.0f} {prefix}{unit}" if prefix == "" else f"{n:.2f} {prefix}{unit}"
        n /= 1000
    return f"{n} {unit}"


def _quantization(ftype, mix_bytes: Counter) -> str | None:
    """The file's quantization as users name it (Q4_K_M, F16): its file type, else the
    tensor type holding most of its bytes."""
    if ftype is not None:
        return str(FILE_TYPES.get(ftype, ftype)).replace("MOSTLY_", "")
    return mix_bytes.most_common(1)[0][0] if mix_bytes else None


def describe(reader: GGUFReader) -> dict[str, Any]:
    """Architecture, size, quantization mix, context and tokenizer facts, tensor table."""
    arch = reader.architecture
    tensors = list(reader.tensors.values())
    n_params = sum(t.n_elements for t in tensors)
    tensor_bytes = sum(t.nbytes for t in tensors)
    mix_count: Counter[str] = Counter()
    mix_bytes: Counter[str] = Counter()
    for t in tensors:
        mix_count[t.ggml_type.name] += 1
        mix_bytes[t.ggml_type.name] += t.nbytes
    ftype = reader.get(Keys.FILE_TYPE)
    tokens = reader.get(Keys.TOKENIZER_TOKENS)
    template = reader.get(Keys.CHAT_TEMPLATE)
    return {
        "files": [f.path for f in reader.files],
        "file_size": sum(os.path.getsize(f.path) for f in reader.files),
        "gguf_version": reader.version,
        "architecture": arch,
        "name": reader.get(Keys.NAME),
        "size_label": reader.get(Keys.SIZE_LABEL),
        "parameters": n_params,
        "bits_per_weight": round(8 * tensor_bytes / n_params, 3) if n_params else None,
        "file_type": FILE_TYPES.get(ftype, ftype) if ftype is not None else None,
        "quantization": _quantization(ftype, mix_bytes),
        "quant_mix": {k: {"tensors": mix_count[k], "bytes": mix_bytes[k]} for k, _ in mix_bytes.most_common()},
        "context_length": reader.get(Keys.CONTEXT_LENGTH),
        "embedding_length": reader.get(Keys.EMBEDDING_LENGTH),
        "block_count": reader.get(Keys.BLOCK_COUNT),
        "head_count": reader.get(Keys.HEAD_COUNT),
        "head_count_kv": reader.get(Keys.HEAD_COUNT_KV),
        "expert_count": reader.get(Keys.EXPERT_COUNT),
        "tokenizer": reader.get(Keys.TOKENIZER_MODEL),
        "vocab_size": len(tokens) if isinstance(tokens, list) else None,
        "chat_template": bool(template),  # False: a base model (chat goes through a fallback)
        "pooling_type": reader.get(Keys.POOLING_TYPE),  # embedding (1-3) and reranking (4) files; None: generative
        "tensors": [
            {"name": t.name, "type": t.ggml_type.name, "shape": list(t.shape), "bytes": t.nbytes}
            for t in tensors
        ],
    }


def format_description(d: dict[str, Any], *, tensors: bool = True) -> str:
    """The text `gguf-serve inspect` prints."""
    lines = []
    files = d["files"]
    lines.append(f"file            {files[0]}" + (f"  (+{len(files) - 1} more shards)" if len(files) > 1 else ""))
    lines.append(f"size            {_human(d['file_size'])}  (GGUF v{d['gguf_version']})")
    lines.append(f"architecture    {d['architecture']}")
    if d["name"]:
        lines.append(f"name            {d['name']}" + (f"  [{d['size_label']}]" if d["size_label"] else ""))
    bpw = f", {d['bits_per_weight']} bits/weight" if d["bits_per_weight"] else ""
    lines.append(f"parameters      {_human(d['parameters'], '')}  ({d['parameters']:,}{bpw})")
    if d["file_type"] is not None:
        lines.append(f"file type       {d['file_type']}")
    mix = ", ".join(f"{k} ×{v['tensors']} ({_human(v['bytes'])})" for k, v in d["quant_mix"].items())
    lines.append(f"quant mix       {mix}")
    for label, key in [("context length", "context_length"), ("embedding", "embedding_length"),
                       ("layers", "block_count"), ("heads", "head_count"), ("kv heads", "head_count_kv"),
                       ("experts", "expert_count")]:
        if d[key] is not None:
            lines.append(f"{label:<16}{d[key]}")
    if d["tokenizer"]:
        lines.append(f"tokenizer       {d['tokenizer']}, {d['vocab_size']} tokens")
    lines.append(f"chat template   {'present' if d['chat_template'] else 'absent'}")
    if tensors:
        lines.append("")
        rows = d["tensors"]
        width = max((len(r["name"]) for r in rows), default=4)
        lines.append(f"{'tensor':<{width}}  {'type':<8} {'shape':<20} bytes")
        for r in rows:
            shape = "×".join(str(x) for x in r["shape"])
            lines.append(f"{r['name']:<{width}}  {r['type']:<8} {shape:<20} {r['bytes']}")
    return "\n".join(lines)
