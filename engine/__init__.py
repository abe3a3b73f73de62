"""gguf_serve.engine: GGUF → torch model with packed layers, kernels per device,
tokenizer and chat template, generation. Built on gguf_io; knows nothing of HTTP.

This module is the engine's public face: the server (and any library caller) imports
these names from `gguf_serve.engine`, never from its submodules, so the engine's
insides can move without the server changing."""

from .loader import LOAD_STAGES, LoadedModel, available_memory, load_model, trim_heap
from .chat import prompt_ids, render
from .chat_format import (BRACKET_THINK, CHANNEL_THOUGHT, GEMMA4, HERMES, LFM2, LLAMA3, MISTRAL, THINK_CLOSE, THINK_OPEN,
                          TOOL_CLOSE, TOOL_OPEN, CallFormat, ChatFormat, Family, call_format, family_of,
                          reasoning_markers, template_has_switch, template_renders_tools, template_writes_xml,
                          writes_harmony)
from .config import EngineConfig
from .options import CacheType, DeviceChoice, KernelChoice, PoolingChoice, PrefillDtype, SpecChoice, VisionDtype
from .embed import EmbeddingError, embed, embed_tokens, rank
from .errors import (CacheError, DraftMismatch, FileError, KernelError, MissingMetadata, TemplateError,
                     TokenizerError, UnsupportedArchitecture, VisionFileError, WeightError, is_file_error, is_transient)
from .fetch import (ModelRef, best_companion, cached_gguf_models, companion_kind, download, is_model_file, model_id,
                    parse)
from .grammar import GrammarError, GrammarMask, ThinkingBudget, closed_objects, json_grammar, schema_of
from .infill import FIM_NAMES, InfillError, can_infill, infill_ids
from .sampling import SAMPLER_CHAIN, SamplingParams, sampler_names
from .templates import TemplateWorkers
from .scheduler import Request, Scheduler, check_speculative, slots
from .speculative import SpeculationError
from .text import END_OF_GENERATION_TEXTS, held_back
from .tokenizer import encode, token_bytes
from .vision import ImageError, goes_with

__all__ = [
    # loading a model and the memory it takes
    "LOAD_STAGES", "LoadedModel", "EngineConfig", "available_memory", "load_model", "trim_heap",
    # the engine's option choices, as types
    "CacheType", "DeviceChoice", "KernelChoice", "PoolingChoice", "PrefillDtype", "SpecChoice", "VisionDtype",
    # model files: Hub IDs, files and the vision files that go with them
    "ModelRef", "best_companion", "cached_gguf_models", "companion_kind", "download", "goes_with", "is_model_file",
    "model_id", "parse",
    # prompts: tokenizing, the chat template, images
    "ImageError", "TemplateError", "TemplateWorkers", "encode", "prompt_ids", "render", "token_bytes",
    # fill-in-the-middle prompts (llama-server's /infill)
    "FIM_NAMES", "InfillError", "can_infill", "infill_ids",
    # a model's chat format (LoadedModel.chat_format): reasoning markers, tool-call families, harmony
    "BRACKET_THINK", "CHANNEL_THOUGHT", "CallFormat", "ChatFormat", "Family", "GEMMA4", "HERMES", "LFM2", "LLAMA3",
    "MISTRAL", "THINK_CLOSE", "THINK_OPEN", "TOOL_CLOSE", "TOOL_OPEN", "call_format", "family_of", "reasoning_markers",
    "template_has_switch", "template_renders_tools", "template_writes_xml", "writes_harmony",
    # generation: sampling, constraints, the scheduler, speculation, streamed text
    "GrammarError", "GrammarMask", "Request", "SAMPLER_CHAIN", "SamplingParams", "sampler_names", "Scheduler", "SpeculationError", "ThinkingBudget",
    "END_OF_GENERATION_TEXTS", "check_speculative", "closed_objects", "held_back", "json_grammar", "schema_of",
    # sequence slots: what they hold, saved to a file and taken back (llama-server's /slots)
    "slots",
    # embedding and reranking files
    "EmbeddingError", "embed", "embed_tokens", "rank",
    # errors (engine.errors): the file's own fault, or one that may pass
    "CacheError", "DraftMismatch", "FileError", "KernelError", "MissingMetadata", "TokenizerError",
    "UnsupportedArchitecture", "VisionFileError", "WeightError", "is_file_error", "is_transient",
]
