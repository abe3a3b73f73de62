"""The sampling a request falls back on, per model: its own fields first, then the
command line's (--temp, --top-k, --top-p, --min-p, --repeat-penalty, --seed), then the
model's section of a models preset file (--models-preset: llama-server's INI, a section
per model id and `[*]` for every model, its keys the options' names), then `[*]`, then
what the file itself recommends (its general.sampling.* keys), then the neutral values."""

from __future__ import annotations

import configparser
import os

from ...engine import sampler_names

# a preset's keys (llama-server's option names, without the dashes) → (SamplingParams field, type)
PRESET_KEYS = {
    "temp": ("temperature", float), "temperature": ("temperature", float), "top-k": ("top_k", int),
    "top-p": ("top_p", float), "min-p": ("min_p", float), "repeat-penalty": ("repetition_penalty", float),
    "presence-penalty": ("presence_penalty", float), "frequency-penalty": ("frequency_penalty", float),
    "seed": ("seed", int), "samplers": ("samplers", str), "sampling-seq": ("samplers", str),
    "sampler-seq": ("samplers", str), "typical": ("typical_p", float), "top-nsigma": ("top_n_sigma", float),
    "xtc-probability": ("xtc_probability", float), "xtc-threshold": ("xtc_threshold", float),
    "dynatemp-range": ("dynatemp_range", float), "dynatemp-exp": ("dynatemp_exponent", float),
    "mirostat": ("mirostat", int), "mirostat-lr": ("mirostat_eta", float), "mirostat-ent": ("mirostat_tau", float),
    "dry-multiplier": ("dry_multiplier", float), "dry-base": ("dry_base", float),
    "dry-allowed-length": ("dry_allowed_length", int), "dry-penalty-last-n": ("dry_penalty_last_n", int),
}
# the command line's server-wide sampling options → SamplingParams fields
COMMAND_LINE = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                "repeat_penalty": "repetition_penalty", "seed": "seed"}


def read_presets(path: str) -> dict[str, dict]:
    """A preset file's sections (model id or `*`) as SamplingParams fields; ValueError
    naming the line's key where one is not a sampling option or does not read."""
    parser = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), interpolation=None)
    parser.optionxform = str  # keys as written
    try:
        with open(path) as f:
            parser.read_string("[__top__]\n" + f.read(), source=path)  # llama-server allows `version = 1` on top
    except (OSError, configparser.Error) as e:
        raise ValueError(f"--models-preset {path}: {e}") from None
    out: dict[str, dict] = {}
    for section in parser.sections():
        if section == "__top__":
            unknown = set(parser[section]) - {"version"}
            if unknown:
                raise ValueError(f"--models-preset {path}: {sorted(unknown)} before the first [section]")
            continue
        fields = out.setdefault(section, {})
        for key, raw in parser[section].items():
            name = key.lstrip("-").replace("_", "-").lower()
            if name not in PRESET_KEYS:
                raise ValueError(f"--models-preset {path}: [{section}] {key}: only sampling options are per model "
                                 f"here ({', '.join(sorted(PRESET_KEYS))})")
            field, kind = PRESET_KEYS[name]
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"--models-preset {path}: [{section}] {key} = {raw!r} is not a {kind.__name__}") \
                    from None
            if field == "samplers":
                try:
                    value = sampler_names(value)
                except ValueError as e:
                    raise ValueError(f"--models-preset {path}: [{section}] {key}: {e}") from None
            fields[field] = None if field == "seed" and value < 0 else value
    return out


def sampling_defaults(settings, presets: dict[str, dict], entry) -> dict:
    """The sampling fields a request to `entry` falls back on, in the order above."""
    out = dict(entry.lm.sampling) if entry.lm is not None else {}
    out.update(presets.get("*", {}))
    names = (entry.id, os.path.basename(entry.path or ""))
    for section, fields in presets.items():
        if section in names:
            out.update(fields)
    for option, field in COMMAND_LINE.items():
        if (value := getattr(settings, option)) is not None:
            out[field] = value
    return out
