"""deploy/: the commands deploy/README.md lists under Checks, run as written, plus what
the rendered manifests must contain."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "deploy" / "README.md"


def readme_checks() -> list[str]:
    text = README.read_text()
    block = text.split("<!-- checks -->", 1)[1].split("<!-- /checks -->", 1)[0]
    body = re.search(r"```bash\n(.*?)```", block, re.S).group(1)
    return [line.strip() for line in body.splitlines() if line.strip()]


def run(cmd: str) -> subprocess.CompletedProcess:
    (ROOT / "build").mkdir(exist_ok=True)
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("cmd", readme_checks())
def test_readme_check_passes(cmd):
    p = run(cmd)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_rendered_overlay(overlay):
    p = run(f"kubectl kustomize deploy/k8s/overlays/{overlay}")
    assert p.returncode == 0, p.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(p.stdout) if d}
    assert set(docs) >= {"Namespace", "NetworkPolicy", "Deployment", "Service", "PersistentVolumeClaim",
                         "PodDisruptionBudget", "HorizontalPodAutoscaler", "ConfigMap"}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] >= 1800
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    env = {e["name"]: e for e in c["env"]}
    assert env["GGUF_SERVE_API_KEY_FILE"]["value"].startswith("/run/secrets/")
    assert any(v.get("secret", {}).get("secretName") == "gguf-serve" for v in pod["volumes"])
    assert docs["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"] == "gguf_serve_queue_depth"
    gpu = c["resources"]["limits"].get("nvidia.com/gpu")
    assert (gpu == "1") == (overlay == "gpu")
    assert all(d["metadata"].get("namespace", "gguf-serve") == "gguf-serve" for d in docs.values())


def test_inference_gateway_overlay():
    """The InferencePool selects the server's pods on their API port, its picker is the
    overlay's EPP Service and Deployment (queue, KV cache and prefix scorers), the route
    sends to the pool, and the pods expose their metrics to it (vLLM's engine label,
    /metrics without the key); the CRD check fails on a field the schema does not name."""
    p = run("kubectl kustomize deploy/k8s/overlays/inference-gateway")
    assert p.returncode == 0, p.stderr
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(p.stdout) if d}
    pool = docs["InferencePool", "gguf-serve"]["spec"]
    server = docs["Deployment", "gguf-serve"]["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= server["metadata"]["labels"].items()
    assert pool["targetPorts"] == [{"number": 8000}]
    assert server["metadata"]["labels"]["llm-d.ai/engine-type"] == "vllm"
    env = {e["name"]: e.get("value") for e in server["spec"]["containers"][0]["env"]}
    assert env["GGUF_SERVE_METRICS_PUBLIC"] == "true"
    epp = docs["Deployment", "gguf-serve-epp"]["spec"]["template"]["spec"]
    service = docs["Service", "gguf-serve-epp"]["spec"]
    assert pool["endpointPickerRef"]["name"] == "gguf-serve-epp"
    assert pool["endpointPickerRef"]["port"]["number"] in {q["port"] for q in service["ports"]}
    assert "--pool-name=gguf-serve" in epp["containers"][0]["args"]
    config = next(d for (kind, name), d in docs.items() if kind == "ConfigMap" and name.startswith("gguf-serve-epp"))
    plugins = yaml.safe_load(config["data"]["epp-config.yaml"])
    assert {p["pluginRef"] for p in plugins["schedulingProfiles"][0]["plugins"]} == {
        "queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"}
    route = docs["HTTPRoute", "gguf-serve"]["spec"]["rules"][0]["backendRefs"][0]
    assert (route["kind"], route["name"]) == ("InferencePool", "gguf-serve")
    bad = ROOT / "build" / "bad-pool.yaml"
    bad.write_text(p.stdout.replace("failureMode: FailOpen", "failureMode: Sometimes"))
    check = run(f"python3 deploy/k8s/validate_crds.py {bad}")
    assert check.returncode == 1 and "failureMode" in check.stdout


def test_dockerfiles_run_as_non_root_with_a_healthcheck():
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        text = (ROOT / "deploy" / "docker" / name).read_text()
        assert text.count("FROM ") == 2  # multi-stage
        assert "USER 10001" in text and "HEALTHCHECK" in text and "/health" in text
        assert "HF_HOME=/data/hf" in text and 'VOLUME ["/data"]' in text


def test_compose_file_serves_with_a_persistent_cache():
    compose = yaml.safe_load((ROOT / "deploy" / "docker" / "compose.yaml").read_text())
    svc = compose["services"]["gguf-serve"]
    assert "hf-cache:/data" in svc["volumes"] and "hf-cache" in compose["volumes"]
    assert svc["ports"] == ["8000:8000"] and "GGUF_SERVE_MODELS" in svc["environment"]


def test_systemd_unit_verifies(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (a cross-check)")
    unit = (ROOT / "deploy" / "systemd" / "gguf-serve.service").read_text()
    exe = shutil.which("gguf-serve")
    assert "ExecStart=/opt/gguf-serve/bin/gguf-serve" in unit
    local = tmp_path / "gguf-serve.service"
    local.write_text(unit.replace("/opt/gguf-serve/bin/gguf-serve", exe))
    p = subprocess.run(["systemd-analyze", "verify", str(local)], capture_output=True, text=True,
                       env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"})
    assert p.returncode == 0, p.stderr
