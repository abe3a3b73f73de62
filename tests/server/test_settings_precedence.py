"""Each setting is decided once, and the command line wins: with every GGUF_SERVE_*
variable set to a value other than its option's default and every flag given (with the
default's value where the command line can say it), the flags come out, in the server's
settings (cli.parse_settings, which starts no server) and in the EngineConfig the server
builds from them for a load, which the engine keeps as it is (EngineConfig.resolve reads
no environment for a configuration passed: once `GGUF_SERVE_SPEC=off` turned an explicit
`--spec auto` into off)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gguf_serve.engine.config import EngineConfig
from gguf_serve.engine.options import ENV
from gguf_serve.server import cli
from gguf_serve.server.settings import ServerSettings

MiB = 1024 * 1024

# option -> (the environment's value, the command line's arguments, what the option comes out as). An option
# whose default the command line can say is given with that value; one whose default is None (or an empty list)
# cannot be said there, so its flag gives another value than the environment's.
CASES = {
    "models": ('["env.gguf"]', ["cli.gguf"], ["cli.gguf"]),
    "alias": ('["env-alias"]', ["--alias", "cli-alias"], ["cli-alias"]),
    "host": ("0.0.0.0", ["--host", "127.0.0.1"], "127.0.0.1"),
    "port": ("9001", ["--port", "8000"], 8000),
    "reasoning": ("off", ["--reasoning", "auto"], "auto"),
    "reasoning_budget": ("100", ["--reasoning-budget", "7"], 7),
    "api_key": ("env-key", ["--api-key", "cli-key"], "cli-key"),
    "api_key_file": ("{tmp}/env-key-file", ["--api-key-file", "{tmp}/cli-key-file"], "{tmp}/cli-key-file"),
    "device": ("cpu", ["--device", "auto"], "auto"),
    "ctx_size": ("1000", ["--ctx-size", "64"], 64),
    "parallel": ("5", ["--parallel", "2"], 2),
    "max_tokens": ("10", ["--max-tokens", "4096"], 4096),
    "threads": ("3", ["--threads", "1"], 1),
    "kernels": ("reference", ["--kernels", "cpu"], "cpu"),
    "cpu_isa": ("scalar", ["--cpu-isa", "avx2"], "avx2"),
    "cpu_repack": ("0", ["--cpu-repack"], True),
    "cuda_graphs": ("0", ["--cuda-graphs"], True),
    "prefill_dtype": ("bfloat16", ["--prefill-dtype", "float32"], "float32"),
    "cache_ram": ("5", ["--cache-ram", "7"], 7),
    "cache_disk": ("{tmp}/env-disk", ["--cache-disk", "{tmp}/cli-disk"], "{tmp}/cli-disk"),
    "cache_disk_size": ("100", ["--cache-disk-size", "200"], 200),
    "cache_type_k": ("q8_0", ["--cache-type-k", "f32"], "f32"),
    "cache_type_v": ("q4_0", ["--cache-type-v", "f16"], "f16"),
    "spec": ("off", ["--spec", "auto"], "auto"),
    "draft_model": ("env-draft.gguf", ["--draft-model", "cli-draft.gguf"], "cli-draft.gguf"),
    "mmproj": ("env-mmproj.gguf", ["--mmproj", "cli-mmproj.gguf"], "cli-mmproj.gguf"),
    "vision_dtype": ("bfloat16", ["--vision-dtype", "float32"], "float32"),
    "lora": ('["env.gguf"]', ["--lora", "cli.gguf:0.5"], ["cli.gguf:0.5"]),
    "lora_scaled": ('["env.gguf:2"]', ["--lora-scaled", "cli.gguf:0.25"], ["cli.gguf:0.25"]),
    "lora_init_without_apply": ("true", ["--no-lora-init-without-apply"], False),
    "lora_runtime": ("true", ["--no-lora-runtime"], False),
    "cache": ("{tmp}/env-cache", ["--cache", "{tmp}/cli-cache"], "{tmp}/cli-cache"),
    "image_urls": ("true", ["--no-image-urls"], False),
    "image_url_timeout": ("3", ["--image-url-timeout", "10"], 10.0),
    "image_urls_allow_private": ("true", ["--no-image-urls-allow-private"], False),
    "image_urls_redirects": ("true", ["--no-image-urls-redirects"], False),
    "max_image_bytes": ("5", ["--max-image-bytes", str(20 * MiB)], 20 * MiB),
    "max_images": ("5", ["--max-images", "9"], 9),
    "max_audio_bytes": ("5", ["--max-audio-bytes", str(25 * MiB)], 25 * MiB),
    "max_audio_seconds": ("5", ["--max-audio-seconds", "600"], 600.0),
    "max_audio": ("5", ["--max-audio", "9"], 9),
    "offline": ("true", ["--no-offline"], False),
    "max_queue": ("3", ["--max-queue", "16"], 16),
    "max_loaded": ("5", ["--max-loaded", "2"], 2),
    "memory_budget": ("12GiB", ["--memory-budget", "1GiB"], 1 << 30),
    "load_wait": ("5", ["--load-wait", "120"], 120.0),
    "idle_unload": ("5", ["--idle-unload", "9"], 9.0),
    "template_timeout": ("3", ["--template-timeout", "10"], 10.0),
    "template_workers": ("5", ["--template-workers", "2"], 2),
    "max_connections": ("50", ["--max-connections", "70"], 70),
    "max_body_bytes": ("5", ["--max-body-bytes", str(16 * MiB)], 16 * MiB),
    "allowed_hosts": ('["env.example"]', ["--allowed-hosts", "cli.example"], ["cli.example"]),
    "cors_origins": ('["https://env.example"]', ["--cors-origins", "https://cli.example"], ["https://cli.example"]),
    "webui": ("false", ["--webui"], True),
    "metrics_public": ("true", ["--no-metrics-public"], False),
    "strict_model_names": ("true", ["--no-strict-model-names"], False),
    "temp": ("0.5", ["--temp", "0.7"], 0.7),
    "top_k": ("5", ["--top-k", "40"], 40),
    "top_p": ("0.5", ["--top-p", "0.9"], 0.9),
    "min_p": ("0.2", ["--min-p", "0.05"], 0.05),
    "repeat_penalty": ("1.5", ["--repeat-penalty", "1.1"], 1.1),
    "seed": ("5", ["--seed", "7"], 7),
    "chat_template": ("chatml", ["--chat-template", "llama3"], "llama3"),
    "chat_template_file": ("{tmp}/env-template", ["--chat-template-file", "{tmp}/cli-template"], "{tmp}/cli-template"),
    "pooling": ("mean", ["--pooling", "last"], "last"),
    "slots": ("false", ["--slots"], True),
    "slot_save_path": ("{tmp}/env-slots", ["--slot-save-path", "{tmp}/cli-slots"], "{tmp}/cli-slots"),
    "models_preset": ("{tmp}/env.ini", ["--models-preset", "{tmp}/cli.ini"], "{tmp}/cli.ini"),
    "access_log": ("true", ["--no-access-log"], False),
    "sse_ping_interval": ("2", ["--sse-ping-interval", "5.0"], 5.0),
    "ssl_keyfile": ("{tmp}/env.key", ["--ssl-keyfile", "{tmp}/cli.key"], "{tmp}/cli.key"),
    "ssl_certfile": ("{tmp}/env.crt", ["--ssl-cert-file", "{tmp}/cli.crt"], "{tmp}/cli.crt"),
}
# options whose default no flag can say: --no-mmproj is the switch's only flag (it says true)
UNSAYABLE = {"no_mmproj"}


def env_name(option: str) -> str:
    return f"GGUF_SERVE_{option.upper()}"


@pytest.fixture
def everything_set(monkeypatch, tmp_path):
    """Every option's variable set to its non-default value; the command line that says otherwise."""
    fill = lambda v: v.replace("{tmp}", str(tmp_path)) if isinstance(v, str) else v  # noqa: E731
    (tmp_path / "env-key-file").write_text("env-file-key")
    (tmp_path / "cli-key-file").write_text("cli-file-key")
    (tmp_path / "env.ini").write_text("[*]\ntemp = 0.1\n")
    (tmp_path / "cli.ini").write_text("[*]\ntemp = 0.2\n")
    argv = []
    for option, (env, flags, _) in CASES.items():
        monkeypatch.setenv(env_name(option), fill(env))
        argv += [fill(f) for f in flags]
    expected = {option: fill(value) for option, (_, _, value) in CASES.items()}
    return argv, expected


def test_the_cases_cover_every_option_and_every_engine_variable():
    fields = ServerSettings.model_fields
    assert set(CASES) | UNSAYABLE == set(fields)
    for option, (_, _, value) in CASES.items():
        default = fields[option].get_default(call_default_factory=True)
        if default not in (None, []):  # said on the command line: the default's own value
            assert value == default, option
    assert set(ENV.values()) <= {env_name(o) for o in fields}  # the engine's variables are the server's options


def test_the_command_line_wins_over_every_variable(everything_set):
    argv, expected = everything_set
    settings = cli.parse_settings(argv)
    assert {option: getattr(settings, option) for option in CASES} == expected


def test_the_engine_config_is_the_command_lines_and_a_load_keeps_it(everything_set):
    argv, expected = everything_set
    settings = cli.parse_settings(argv)
    config = settings.engine_config(mmproj=settings.mmproj)
    assert config == EngineConfig(
        device="auto", n_ctx=64, n_seq=2, threads=1, kernels="cpu", cpu_isa="avx2", cpu_repack=True, cuda_graphs=True,
        prefill_dtype="float32", cache_ram=7, cache_disk=expected["cache_disk"], cache_disk_size=200,
        cache_type_k="f32", cache_type_v="f16", spec="auto",
        draft_model="cli-draft.gguf", mmproj="cli-mmproj.gguf", vision_dtype="float32", cache_dir=expected["cache"],
        chat_template="llama3", pooling="last")
    assert EngineConfig.resolve(config) == config  # what load_model does with it, every variable still set
    assert EngineConfig.resolve() != config  # while a library caller who passes nothing gets the environment


def test_without_flags_every_option_is_the_environments(everything_set):
    """The other half: each variable does reach its option (none of them is the default)."""
    settings = cli.parse_settings([])
    fields = ServerSettings.model_fields
    for option in CASES:
        assert getattr(settings, option) != fields[option].get_default(call_default_factory=True), option
    assert (settings.spec, settings.cpu_repack, settings.device) == ("off", False, "cpu")
    assert EngineConfig.resolve(settings.engine_config()).spec == "off"


def test_help_and_option_errors_come_without_loading_torch():
    """`gguf-serve --help` and a bad option answer at once: the settings' choices come from
    the engine's torch-free modules (engine.options, engine.config), not the model code."""
    code = ("import sys\nfrom gguf_serve.server import cli\n"
            "try:\n    cli.parse_settings(['--ctx-size', 'many'])\nexcept SystemExit:\n    pass\n"
            "cli.serve_parser().format_help()\nprint(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "--ctx-size" in out.stderr, out.stderr
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_lora_options_read_as_llama_servers():
    """--lora FILE[:SCALE] and --lora-scaled FILE:SCALE, repeated or comma-separated, in order;
    --lora-init-without-apply loads them at scale 0."""
    settings = cli.parse_settings(["m.gguf", "--lora", "a.gguf,b.gguf:0.5", "--lora-scaled", "c:\\x.gguf:2"])
    assert settings.adapters() == [("a.gguf", 1.0), ("b.gguf", 0.5), ("c:\\x.gguf", 2.0)]
    settings = cli.parse_settings(["m.gguf", "--lora", "a.gguf", "--lora-init-without-apply"])
    assert settings.adapters() == [("a.gguf", 0.0)]
