"""gguf-serve replicas as a Ray Serve application, on one machine or a Ray cluster.

Each replica is a whole gguf-serve server (its own process on a port of its node, the
model loaded once, its prefix cache and continuous batching as ever); Ray Serve's
PrefixCacheAffinityRouter picks the replica for each request: the one whose past
prompts share the longest prefix with it while the replicas' queues are level, else
the less loaded (Ray's power of two), so a conversation's turns land where their
prefix is cached. Replicas scale between `min_replicas` and `max_replicas` on
their ongoing requests. The ingress serves the OpenAI routes (`/v1/chat/completions`,
`/v1/completions`, streamed or not, `/v1/models`) and says in a header which replica
answered (`x-gguf-serve-replica`); a replica that dies under a request answers 503 with
Retry-After (the client's retry goes to another), not a 500.

    serve run deploy.ray.gguf_serve_ray:build_app model=unsloth/Qwen3-4B-GGUF:Q4_K_M replicas=2

Arguments (`key=value`): `model` (what `gguf-serve` takes), `replicas` (fixed) or
`min_replicas` / `max_replicas` (autoscaled), `args` (more gguf-serve options, one
string), `cpus` (per replica, default 1)."""

import asyncio
import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError
from ray.serve.config import RequestRouterConfig

try:
    from ray.serve.llm.request_router import PrefixCacheAffinityRouter
except ImportError:  # ray.serve.llm's package wants ray[llm]'s dependencies (pyarrow, ...); its router does not
    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter

GONE = (RayActorError, ActorDiedError, ActorUnavailableError)  # the replica died under the request
START_SECONDS = 600  # a first start may download the model


class Call:
    """One request as the router sees it: its `messages` (chat) or else its `prompt` (the
    router matches prefixes on the first of the two a call has, so a call has only the one
    it matches on), the route and the body to forward."""

    def __init__(self, path: str, body: dict):
        self.path, self.body = path, body
        if body.get("messages") is not None:
            self.messages = body["messages"]
        else:
            self.prompt = body.get("prompt") or " "  # the router finds nothing to match in "" and waits


def _die_with_parent() -> None:
    """In the server's process before it runs: a SIGTERM when the replica's process ends,
    however it ends (a replica killed does not leave its server behind; Linux)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(model: str, args: str, port: int) -> list[str]:
    exe = shutil.which("gguf-serve")
    base = [exe] if exe else [sys.executable, "-m", "gguf_serve.server.cli"]
    return [*base, model, *shlex.split(args), "--host", "127.0.0.1", "--port", str(port)]


class Replica:
    """A gguf-serve server on this node, and the calls forwarded to it."""

    def __init__(self, model: str, args: str = ""):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.name = serve.get_replica_context().replica_id.unique_id
        self.proc = subprocess.Popen(_command(model, args, self.port), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env={**os.environ}, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_SECONDS
        while True:
            try:
                if httpx.get(f"{self.base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gguf-serve did not start for {model!r} (exit {self.proc.poll()})")
            time.sleep(0.2)
        self.client = httpx.AsyncClient(base_url=self.base, timeout=None)

    async def __call__(self, call: Call) -> tuple[int, dict | str, str]:
        r = await self.client.post(call.path, json=call.body)
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
        return r.status_code, body, self.name

    async def stream(self, call: Call):
        """The response's server-sent lines, the first one the replica's name."""
        yield self.name
        async with self.client.stream("POST", call.path, json=call.body) as r:
            async for line in r.aiter_lines():
                yield line + "\n"

    async def get(self, call: Call) -> str:
        return (await self.client.get(call.path)).text

    def __del__(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.terminate()


def replica_deployment(min_replicas: int, max_replicas: int, cpus: float):
    """Replica as a deployment: Ray's prefix-cache-affinity router, fixed or autoscaled."""
    scaling = ({"num_replicas": min_replicas} if min_replicas == max_replicas else
               {"autoscaling_config": {"min_replicas": min_replicas, "max_replicas": max_replicas,
                                       "target_ongoing_requests": 4}})
    return serve.deployment(Replica, name="gguf-serve", ray_actor_options={"num_cpus": cpus},
                            max_ongoing_requests=64, health_check_period_s=5,
                            request_router_config=RequestRouterConfig(request_router_class=PrefixCacheAffinityRouter),
                            **scaling)


ROUTES = ("/v1/chat/completions", "/v1/completions")  # forwarded to a replica the router picks


def _retry(name: str) -> JSONResponse:
    return JSONResponse({"error": {"message": f"replica {name} went away; retry", "type": "overloaded_error"}},
                        status_code=503, headers={"Retry-After": "1"})


@serve.deployment(name="ingress", num_replicas=1, ray_actor_options={"num_cpus": 0})
class Ingress:
    """The HTTP side: the OpenAI routes, each request handed to the replicas' router (a
    plain Starlette handler: Ray pickles deployments, and a FastAPI app does not pickle)."""

    def __init__(self, replicas):
        self.replicas = replicas

    async def __call__(self, request: Request):
        path = request.url.path
        if request.method == "POST" and path in ROUTES:
            return await self._forward(path, request)
        if request.method == "GET" and path == "/v1/models":
            return JSONResponse(json.loads(await self.replicas.get.remote(Call("/v1/models", {"prompt": "/v1/models"}))))
        return JSONResponse({"error": {"message": f"{request.method} {path} is not served here; "
                                                  f"POST {' or '.join(ROUTES)}, GET /v1/models",
                                       "type": "not_found_error"}}, status_code=404)

    async def _forward(self, path: str, request: Request):
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": {"message": "the body is not JSON", "type": "invalid_request_error"}},
                                status_code=400)
        call = Call(path, body)
        try:
            if body.get("stream"):
                lines = self.replicas.options(stream=True).stream.remote(call)
                name = await lines.__anext__()
                return StreamingResponse(_rest(lines), media_type="text/event-stream",
                                         headers={"x-gguf-serve-replica": name})
            status, answer, name = await self.replicas.remote(call)
        except GONE:
            return _retry("(unknown)")
        if isinstance(answer, str):
            return Response(answer, status_code=status, headers={"x-gguf-serve-replica": name})
        return JSONResponse(answer, status_code=status, headers={"x-gguf-serve-replica": name})


async def _rest(lines):
    try:
        async for line in lines:
            yield line
    except GONE:
        await asyncio.sleep(0)  # the stream ends where the replica died; the client retries


def build_app(args: dict) -> serve.Application:
    """`serve run deploy.ray.gguf_serve_ray:build_app model=... replicas=2` (see the module's text)."""
    model = args["model"]
    fixed = args.get("replicas")
    low = int(fixed or args.get("min_replicas", 1))
    high = int(fixed or args.get("max_replicas", low))
    replicas = replica_deployment(low, high, float(args.get("cpus", 1))).bind(model, args.get("args", ""))
    return Ingress.bind(replicas)
