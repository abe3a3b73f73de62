"""`gguf-serve`: serve models over the OpenAI API, or `gguf-serve inspect FILE`.

Every serve option also comes from an environment variable GGUF_SERVE_<OPTION>
(for example GGUF_SERVE_PORT=9000, GGUF_SERVE_MODELS='["a.gguf"]'); the command
line wins."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ..gguf_io import GGUFError, GGUFReader, describe
from ..gguf_io.summary import format_description
from .default_model import default_model_path


def _inspect(args: argparse.Namespace) -> int:
    path = args.file or default_model_path()
    try:
        reader = GGUFReader(path)
    except (GGUFError, OSError) as e:
        print(f"gguf-serve inspect: {e}", file=sys.stderr)
        return 1
    d = describe(reader)
    if args.json:
        if args.no_tensors:
            d.pop("tensors")
        json.dump(d, sys.stdout, indent=2)
        print()
    else:
        print(format_description(d, tensors=not args.no_tensors))
    return 0


def inspect_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve inspect", description="Show what a GGUF file holds.")
    p.add_argument("file", nargs="?", help="a .gguf file (the first shard of a split model); default: the embedded Gemma 3 270M")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.add_argument("--no-tensors", action="store_true", help="leave out the tensor table")
    return p


def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gguf-serve",
        description="Serve GGUF models over the OpenAI API at http://HOST:PORT/v1. "
                    "`gguf-serve inspect FILE` shows what a file holds.",
        epilog="Every option can also be set as GGUF_SERVE_<OPTION> in the environment.")
    p.add_argument("models", nargs="*", help="local .gguf paths or Hub IDs (<repo>:<file>.gguf, <repo>@<rev>:<file>.gguf, "
                                             "<repo>:<QUANT>, <repo>); none: the Hub cache's models and the "
                                             "embedded Gemma 3 270M, loaded on first request")
    p.add_argument("--alias", action="append", help="the id a named model is listed as (repeat for each model, in "
                                                    "order); default: a local file's name, a Hub file's <repo>:<file>")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--reasoning", choices=["on", "off", "auto"],
                   help="thinking for models whose template has the switch: on, off, or the template's default (auto)")
    p.add_argument("--reasoning-budget", type=int, help="thinking tokens a reply may spend before the server closes "
                                                       "its reasoning block (default: no limit; a request's "
                                                       "thinking_budget_tokens overrides it)")
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1/*")
    p.add_argument("--api-key-file", help="read the API key from this file (e.g. a mounted secret)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda", "mps"], help="where to run (default auto)")
    p.add_argument("--ctx-size", type=int, help="tokens per sequence, prompt + completion (default: the trained "
                                                "context, as far as a quarter of the memory available holds it)")
    p.add_argument("--parallel", type=int, help="sequences decoded together in one batch, each with its KV cache slot "
                                                "(default: 8, fewer if the memory would give each < 8192 tokens)")
    p.add_argument("--max-tokens", type=int, help="completion tokens for a chat request that sets no max_tokens "
                                                  "(default 4096; /v1/completions keeps OpenAI's 16)")
    p.add_argument("--threads", type=int, help="CPU threads for torch and the kernels (default: torch's)")
    p.add_argument("--offline", action="store_true", default=None, help="never touch the network (HF_HUB_OFFLINE)")
    p.add_argument("--max-queue", type=int, help="requests that may wait per model before 429 (default 16)")
    p.add_argument("--max-loaded", type=int, help="models kept loaded at once; the least recently used goes (default 2)")
    return p


def _serve(argv: list[str]) -> int:
    args = serve_parser().parse_args(argv)
    from .settings import ServerSettings

    overrides = {k: v for k, v in vars(args).items() if v not in (None, [])}
    settings = ServerSettings(**overrides)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("huggingface_hub").propagate = False  # it prints its own warnings; not each twice
    if settings.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    if settings.threads:
        import torch

        from ..engine.kernels import cpu

        torch.set_num_threads(settings.threads)
        cpu.set_threads(settings.threads)
    import uvicorn

    from .app import create_app

    app = create_app(settings)
    if settings.models:
        print(f"gguf-serve: loading {', '.join(settings.models)} (/health answers 503 until ready)", flush=True)
    else:
        print("gguf-serve: serving the embedded default model and the Hub cache's GGUF models, each loaded on "
              "its first request", flush=True)
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # Ctrl-C / SIGTERM: running generations end at their next step
            for entry in app.state.registry.entries.values():
                if entry.worker is not None:
                    entry.worker.cancel_all()
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning"))
    app.state.shutdown = lambda: setattr(server, "should_exit", True)  # startup's way out when nothing loads
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
    return 1 if app.state.startup["fatal"] else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "inspect":
        return _inspect(inspect_parser().parse_args(argv[1:]))
    return _serve(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
