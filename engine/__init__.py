"""gguf_serve.engine: GGUF → torch model with packed layers, kernels per device,
tokenizer and chat template, generation. Built on gguf_io; knows nothing of HTTP.

This module is the engine's public face: the server (and any library caller) imports
these names from `gguf_serve.engine`, never from its submodules, so the engine's
insides can move without the server changing.

Each name is imported from its submodule when first asked for (PEP 562's module
`__getattr__`): the command line's `--help` and option checks read the settings' choices
(engine.options, engine.config, torch-free) without loading torch and the model code, which
the first use of any other name brings."""

from __future__ import annotations

from importlib import import_module

_PUBLIC = (  # (the submodule that defines them, the public names)
    # loading a model and the memory it takes
    ("loader", "LOAD_STAGES LoadedModel available_memory load_model trim_heap"),
    ("config", "EngineConfig"),
    # the engine's option choices, as types
    ("options", "CacheType DeviceChoice KernelChoice PoolingChoice PrefillDtype SpecChoice VisionDtype"),
    # model files: Hub IDs, files and the vision files that go with them
    ("fetch", "ModelRef best_companion cached_gguf_models companion_kind download is_model_file model_id parse"),
    ("vision", "goes_with"),
    # prompts: tokenizing, the chat template, images and audio
    ("errors", "AudioError ImageError MediaError"),
    ("sound", "MAX_AUDIO_BYTES MAX_AUDIO_SECONDS audio_header"),
    ("errors", "TemplateError"),
    ("templates", "TemplateWorkers"),
    ("tokenizer", "encode token_bytes"),
    ("chat", "prompt_ids render"),
    # fill-in-the-middle prompts (llama-server's /infill)
    ("infill", "FIM_NAMES InfillError can_infill infill_ids"),
    # a model's chat format (LoadedModel.chat_format): reasoning markers, tool-call families, harmony
    ("chat_format", "BRACKET_THINK CHANNEL_THOUGHT CallFormat ChatFormat Family GEMMA4 HERMES LFM2 LLAMA3 MISTRAL "
                    "THINK_CLOSE THINK_OPEN TOOL_CLOSE TOOL_OPEN call_format family_of reasoning_markers "
                    "template_has_switch template_renders_tools template_writes_xml writes_harmony"),
    # generation: sampling, constraints, the scheduler, speculation, streamed text
    ("grammar", "GrammarError GrammarMask ThinkingBudget closed_objects json_grammar schema_of"),
    ("scheduler", "Request Scheduler check_speculative"),
    ("options", "SAMPLER_CHAIN sampler_names"),
    ("sampling", "SamplingParams"),
    ("speculative", "SpeculationError"),
    ("text", "END_OF_GENERATION_TEXTS held_back"),
    # LoRA adapters (LoadedModel.load_adapter)
    ("lora", "AdapterError"),
    # sequence slots: what they hold, saved to a file and taken back (llama-server's /slots)
    ("scheduler", "slots"),
    # embedding and reranking files
    ("embed", "EmbeddingError embed embed_tokens rank"),
    # errors (engine.errors): the file's own fault, or one that may pass
    ("errors", "CacheError DraftMismatch FileError KernelError MissingMetadata TokenizerError "
               "UnsupportedArchitecture VisionFileError WeightError is_file_error is_transient"),
)
_SOURCE = {name: module for module, names in _PUBLIC for name in names.split()}
__all__ = list(_SOURCE)


def __getattr__(name: str):
    module = _SOURCE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
