"""`gguf-serve`: serve models over the OpenAI API, or `gguf-serve inspect FILE`.

Every serve option also comes from an environment variable GGUF_SERVE_<OPTION>
(for example GGUF_SERVE_PORT=9000, GGUF_SERVE_MODELS='["a.gguf"]'); the command
line wins."""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import socket
import sys
import typing

from ..gguf_io import GGUFError, GGUFReader, describe
from ..gguf_io.summary import format_description
from .core.connections import ACCEPT_BATCH, HEAD_TIMEOUT, default_max_connections, protocol, raise_open_files
from .core.hosts import listen_addresses
from .models.default_model import default_model_path

log = logging.getLogger("gguf_serve.server")
DRAIN_SECONDS = 10  # after SIGTERM or Ctrl-C, the longest the server waits for its connections to close


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


def _option(name: str, field) -> tuple[list[str], dict]:
    """argparse's flags and keywords for one ServerSettings field: its type, its choices,
    its help from the field's description and default, and the environment variable."""
    flag = "--" + name.replace("_", "-")
    flags = [flag, *((field.json_schema_extra or {}).get("flags", []))]  # other servers' names for it
    ann = field.annotation
    args = typing.get_args(ann)
    inner = next((a for a in args if a is not type(None)), ann) if typing.get_origin(ann) is typing.Union else ann
    default = None if field.default_factory is not None else field.default
    env = f"GGUF_SERVE_{name.upper()}"
    helps = field.description or ""
    if default not in (None, False, True):
        helps += f" (default {default})"
    helps += f"; env {env}"
    if inner is bool and name.startswith("no_"):  # a switch that is itself the negative (--no-mmproj)
        return flags, dict(action="store_const", const=True, default=None, help=helps)
    if inner is bool:
        return flags, dict(action=argparse.BooleanOptionalAction, default=None,
                            help=helps + (" (default on)" if default else ""))
    if typing.get_origin(inner) is list:
        return flags, dict(action="append", metavar=name.upper(), help=helps)
    kw: dict = dict(help=helps)
    if typing.get_origin(inner) is typing.Literal:
        kw["choices"] = list(typing.get_args(inner))
    elif inner in (int, float):
        kw["type"] = inner
    return flags, kw


def _settings_class():
    """server.settings.ServerSettings, imported when the serve command runs: it brings the
    engine and torch (seconds to import), which `gguf-serve inspect` does without."""
    from .settings import ServerSettings  # deferred: the engine and torch, not needed by inspect

    return ServerSettings


def serve_parser() -> argparse.ArgumentParser:
    """The serve command's options, one per ServerSettings field (the only place they
    are defined; `models` is positional)."""
    p = argparse.ArgumentParser(
        prog="gguf-serve",
        description="Serve GGUF models over the OpenAI API at http://HOST:PORT/v1. "
                    "`gguf-serve inspect FILE` shows what a file holds.",
        epilog="Every option can also be set as GGUF_SERVE_<OPTION> in the environment; the command line wins.")
    fields = _settings_class().model_fields
    p.add_argument("models", nargs="*", help=fields["models"].description)
    for name, field in fields.items():
        if name == "models":
            continue
        flags, kw = _option(name, field)
        p.add_argument(*flags, **kw)
    return p


def parse_settings(argv: list[str]):
    """The serve command's ServerSettings: the options given on the command line over the
    GGUF_SERVE_* environment over the defaults (the one place the settings are read)."""
    parser = serve_parser()
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if v not in (None, [])}
    try:
        return _settings_class()(**overrides)
    except ValueError as e:  # pydantic's ValidationError is one: an option's value, a file it names
        errors = getattr(e, "errors", None)
        parser.error("; ".join((f"--{x['loc'][0].replace('_', '-')}: " if x.get("loc") else "")
                               + str(x.get("msg")).removeprefix("Value error, ") for x in errors())
                     if errors else str(e))
    except OSError as e:  # a file an option names (--chat-template-file, --api-key-file)
        parser.error(str(e))


def _serve(argv: list[str]) -> int:
    settings = parse_settings(argv)
    sockets = listening_sockets(settings.host, settings.port)  # before anything loads: a busy port says so at once
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("huggingface_hub").propagate = False  # it prints its own warnings; not each twice
    if settings.offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    import uvicorn

    from .app import create_app  # deferred with the settings: the web stack and the engine, not needed by inspect

    app = create_app(settings)
    if settings.models:
        print(f"gguf-serve: loading {', '.join(settings.models)} (/health answers 503 until ready)", flush=True)
    else:
        print("gguf-serve: serving the embedded default model and the Hub cache's GGUF models, each loaded on "
              "its first request", flush=True)
    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:  # Ctrl-C / SIGTERM: running generations end at their next step,
            app.state.residency.cancel_all()
            app.state.templates.close()  # and renders at once (their workers are killed)
            super().handle_exit(sig, frame)

    open_files = raise_open_files()
    max_connections = settings.max_connections or default_max_connections(open_files)
    log.info("connections: at most %d at once (%s), request heads within %g s", max_connections,
             "--max-connections" if settings.max_connections else f"the open-file limit {open_files}", HEAD_TIMEOUT)
    # connections still open DRAIN_SECONDS after a stop signal are closed: the process ends whatever they wait on
    server = Server(uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning",
                                   timeout_graceful_shutdown=DRAIN_SECONDS, http=protocol(max_connections),
                                   backlog=ACCEPT_BATCH, ssl_keyfile=settings.ssl_keyfile,
                                   ssl_certfile=settings.ssl_certfile, access_log=settings.access_log))
    if settings.access_log:  # uvicorn's own level (warning) would hold its access lines back
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    app.state.shutdown = lambda: setattr(server, "should_exit", True)  # startup's way out when nothing loads
    try:
        server.run(sockets=sockets)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C once it has shut down cleanly
        pass
    print("gguf-serve: stopped", flush=True)
    return 1 if app.state.startup["fatal"] else 0


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """A bound socket for each address of --host (several, comma-separated, as
    llama-server takes them); an IPv6 one for IPv6 only, so that "::" and "0.0.0.0" can
    both be given."""
    sockets = []
    for address in listen_addresses(host):
        address = address.strip("[]")
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            sock.bind((address, port))
        except OSError as e:
            sock.close()
            for s in sockets:
                s.close()
            raise SystemExit(f"gguf-serve: cannot listen on {address} port {port}: {e.strerror}"
                             + (" (another server there? --port picks another)" if e.errno == errno.EADDRINUSE
                                else "")) from None
        sock.set_inheritable(True)
        sockets.append(sock)
    return sockets


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "inspect":
        try:
            code = _inspect(inspect_parser().parse_args(argv[1:]))
            sys.stdout.flush()
        except BrokenPipeError:  # `gguf-serve inspect --json | head`: the reader had enough
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
            code = 0
        return code
    return _serve(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
