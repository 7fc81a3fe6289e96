"""The generated OpenAPI schema (drf-spectacular) and its browsable page, served without any CDN."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.validation import validate_schema

pytestmark = [pytest.mark.django_db]

V2 = "/v2/{project_id}/training-jobs"
OPERATIONS = {
    (V2, "get"): "list_training_jobs",
    (V2, "post"): "create_training_job",
    (f"{V2}/{{job_id}}", "get"): "show_training_job",
    (f"{V2}/{{job_id}}", "delete"): "delete_training_job",
    (f"{V2}/{{job_id}}/actions", "post"): "act_on_training_job",
    (f"{V2}/{{job_id}}/events", "get"): "list_training_job_events",
    (f"{V2}/{{job_id}}/metrics", "get"): "show_training_job_metrics",
    (f"{V2}/{{job_id}}/recoveries", "get"): "list_training_job_recoveries",
    (f"{V2}/{{job_id}}/tasks/{{task}}/logs", "get"): "show_training_job_task_log",
}


def test_schema_is_valid_and_describes_every_v2_route():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    validate_schema(schema)
    found = {(path, method): op["operationId"] for path, ops in schema["paths"].items() for method, op in ops.items()}
    assert found == OPERATIONS
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])
    listing = schema["paths"][V2]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {"phase", "name", "sort_by", "order", "limit", "offset"}
    job = listing["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["items"]["items"]
    assert {"restarts_used", "max_restarts", "phase"} <= set(job["properties"]["status"]["properties"])
    create = schema["paths"][V2]["post"]
    body = create["requestBody"]["content"]["application/json"]
    assert "metadata" in body["schema"]["properties"] and body["examples"]
    assert "400" in create["responses"] and "404" in create["responses"]
    log = schema["paths"][f"{V2}/{{job_id}}/tasks/{{task}}/logs"]["get"]["responses"]["200"]["content"]
    assert "text/plain" in log


def test_schema_and_docs_are_served_from_this_server():
    client = Client()
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    assert set(schema.json()["paths"]) == {path for path, _ in OPERATIONS}
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "/api/schema/" in html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(url.startswith("/static/") for url in assets), assets  # no CDN is reachable
    for url in assets:
        assert client.get(url).status_code == 200, url
    # Redoc too (its page also names web fonts, optional: the text falls back to local fonts).
    redoc = client.get("/api/redoc/")
    assert redoc.status_code == 200
    scripts = re.findall(r'<script src="([^"]+)"', redoc.content.decode())
    assert scripts and all(url.startswith("/static/") for url in scripts), scripts
