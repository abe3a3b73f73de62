"""/openapi.json describes what the server does: schemathesis generates requests from it
(valid and invalid, bounded) against a real server, and every answer must be one the
document lists, in the content type and shape it lists, and never a 5xx."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_schema_conformance,
                                 status_code_conformance)

from server_harness import server


@pytest.fixture(scope="module")
def srv(tiny_path):
    with server(tiny_path, "--max-queue", "4", "--max-tokens", "8") as b:
        yield b


@pytest.fixture(scope="module")
def api(srv):
    return schemathesis.openapi.from_url(f"{srv}/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


def test_no_422_and_every_error_in_the_envelope(srv):
    doc = httpx.get(f"{srv}/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            if path.startswith("/v1/chat") or path in ("/v1/completions", "/v1/responses"):
                assert set(op["responses"]) == {"200", "400", "401", "404", "413", "429", "500"}
                assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
                assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith(
                    "/ErrorResponse")
    assert "HTTPValidationError" not in doc["components"]["schemas"]


@schema.parametrize()
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_document_is_what_the_server_does(case):
    case.call_and_validate(checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                   response_schema_conformance])
