"""Validate the custom resources of rendered manifests (kinds Kubernetes itself does not
know, which kubernetes-validate passes over) against their CRDs' schemas, kept in
deploy/k8s/crds/ from the releases named in each file (the Gateway API Inference
Extension's InferencePool, the Gateway API's HTTPRoute). Strict as kubernetes-validate
--strict: a field a schema does not name is an error.

    python3 deploy/k8s/validate_crds.py build/k8s-inference-gateway.yaml"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import yaml

CRDS = Path(__file__).resolve().parent / "crds"


def strict(schema: dict) -> dict:
    """The schema with additionalProperties false wherever it lists properties and says
    nothing of others (Kubernetes prunes unknown fields; here they are errors)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def schemas() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(path.read_text())
        schema = strict(crd["schema"])
        schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: Kubernetes' own, checked by it
        out[(f"{crd['group']}/{crd['version']}", crd["kind"])] = schema
    return out


def main(files: list[str]) -> int:
    known, failures, checked = schemas(), 0, 0
    for name in files:
        for doc in yaml.safe_load_all(Path(name).read_text()):
            key = (doc.get("apiVersion"), doc.get("kind")) if doc else None
            if key not in known:
                continue
            checked += 1
            for error in jsonschema.Draft7Validator(known[key]).iter_errors(doc):
                where = "/".join(str(p) for p in error.absolute_path) or "(root)"
                print(f"{name}: {key[1]} {doc['metadata'].get('name')}: {where}: {error.message}")
                failures += 1
    if not checked:
        print(f"no custom resources of {', '.join(k for _, k in sorted(known))} in {', '.join(files)}")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
