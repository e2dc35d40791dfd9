"""/v1/openapi.json: the OpenAPI 3.1 document of the HTTP API, made from the
route table (api.ROUTES) and the msgspec types its handlers decode and its
answers are checked against (apitypes.py), never written by hand. msgspec
emits JSON Schema 2020-12, the dialect OpenAPI 3.1 uses.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from sessionlog_store.server.edge import apitypes as t
from sessionlog_store.server.version import version
from sessionlog_store.server.edge.routes import Route

_REF = "#/components/schemas/{name}"
_DESCRIPTIONS = {200: "OK", 201: "Created", 204: "No Content", 400: "The request is malformed or a value is "
                 "refused", 401: "Missing or wrong credentials", 403: "Host or Origin not allowed",
                 404: "No such session, message, project or endpoint (another user's is as unknown as none)",
                 405: "Method not allowed here", 408: "The body did not arrive in time",
                 409: "Not allowed in the current state",
                 413: "The body is over the limit", 429: "Over a quota or the rate",
                 500: "A fault of the server", 503: "The store failed, or the server is stopping"}


def _without_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter's schema: absent means null, so null is not a value to send."""
    if schema.get("default", 0) is None:
        schema = {k: v for k, v in schema.items() if k != "default"}
    options = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if "anyOf" in schema and len(options) == 1:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**rest, **options[0]}
    if "anyOf" in schema:
        return {**schema, "anyOf": options}
    return schema


def openapi_document(routes: Iterable[Route], statuses: Mapping[str, int]) -> dict[str, Any]:
    routes = list(routes)
    kinds: list[Any] = [t.Error]
    for r in routes:
        kinds += [k for k in (r.answer, r.query, r.body) if k is not None]
    schemas, components = msgspec.json.schema_components(kinds, ref_template=_REF)
    of = dict(zip(map(id, kinds), schemas))
    error_ref = of[id(t.Error)]
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {"operationId": r.name, "summary": r.summary, "parameters": []}
        for name in _path_params(r.path):
            op["parameters"].append({"name": name, "in": "path", "required": True,
                                     "schema": {"type": "string", "pattern": t.ID_PATTERN}})
        if r.query is not None:
            qs = components[r.query.__name__]
            required = set(qs.get("required", []))
            for name, schema in qs["properties"].items():
                op["parameters"].append({"name": name, "in": "query", "required": name in required,
                                         "schema": _without_null(schema)})
        if r.body is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": of[id(r.body)]}}}
        responses: dict[str, Any] = {}
        if r.answer is None:
            responses[str(r.status)] = {"description": _DESCRIPTIONS[r.status]}
        else:
            responses[str(r.status)] = {"description": _DESCRIPTIONS[r.status],
                                        "content": {"application/json": {"schema": of[id(r.answer)]}}}
        for status in sorted({*r.errors, 401, 403, 405, 408, 413, 429, 500, 503}):
            responses[str(status)] = {"description": _DESCRIPTIONS[status],
                                      "content": {"application/json": {"schema": error_ref}}}
        if not op["parameters"]:
            del op["parameters"]
        paths.setdefault(r.path, {})[r.method.lower()] = {**op, "responses": responses}
    paths["/v1/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document", "security": [],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"type": "object"}}}},
                      "403": {"description": _DESCRIPTIONS[403],
                              "content": {"application/json": {"schema": error_ref}}}}}}
    codes = ", ".join(f"`{c}` {s}" for c, s in sorted(statuses.items(), key=lambda kv: (kv[1], kv[0])))
    return {
        "openapi": "3.1.0",
        "info": {"title": "sessionlog", "version": version(),
                 "description": "The HTTP API of a sessionlog server (docs/HTTP.md). Every error is "
                                "`{\"error\": {\"code\", \"message\"}}`; its HTTP status by code: " + codes +
                                "; any other code: 400."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "The server's token (--token), a user's "
                                                                     "token (--tokens-file) or a JWT (--auth jwt)"}}},
    }


def _path_params(path: str) -> list[str]:
    out, rest = [], path
    while "{" in rest:
        rest = rest[rest.index("{") + 1:]
        out.append(rest[:rest.index("}")])
    return out
