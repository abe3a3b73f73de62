"""gguf_serve.gguf_io: the GGUF file format, torch-free (stdlib + numpy).

Owns: the table of ggml types (`GGMLType`), reading (`GGUFReader`, zero-copy,
shards as one model), writing (`GGUFWriter`, streaming and atomic), block
(de)quantization (`dequantize`, `quantize`) and `describe`, a summary of a model
file. Knows nothing of torch, models or serving.
"""

from .constants import FILE_TYPES, GGML_MAX_DIMS, QK_K, TYPE_INFO, GGMLType, GGUFValueType, Keys
from .errors import GGUFError
from .quants import dequantize, quantize
from .reader import GGUFReader, TensorInfo, shard_paths
from .summary import describe
from .writer import GGUFWriter

__all__ = [
    "FILE_TYPES", "GGML_MAX_DIMS", "QK_K", "TYPE_INFO", "GGMLType", "GGUFValueType", "Keys",
    "GGUFError", "dequantize", "quantize", "GGUFReader", "TensorInfo", "shard_paths",
    "describe", "GGUFWriter",
]
