"""docs/reference/api.md, generated from the app's own OpenAPI document (`service.http.app.create_app().openapi()`)."""

from __future__ import annotations

from typing import Any

HEADER = """# HTTP API reference

Generated from the service's OpenAPI document when the site is built (the app is created with an API key, so the
routes that need one show their 401; without `SEQREC_API_KEY` every route is open). A running service serves the
same document at `/openapi.json` and an interactive page at `/docs`.
"""
METHODS = ("get", "post", "put", "patch", "delete")


def _cell(text: Any) -> str:
    return str(text if text is not None else "").replace("|", "\\|").replace("\n", " ")


def type_of(schema: dict[str, Any]) -> str:
    """A short type for a JSON schema: `string`, `integer` (1..1000), `array of string or integer`, `Filters`."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        kinds = [type_of(s) for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = any(s.get("type") == "null" for s in schema["anyOf"])
        return " or ".join(dict.fromkeys(kinds)) + (" or null" if nullable else "")
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    bounds = [f"{word} {schema[key]:g}" for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"),
                                                          ("maximum", "<="), ("exclusiveMaximum", "<"))
              if isinstance(schema.get(key), (int, float))]
    if "enum" in schema:
        bounds.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _body(operation: dict[str, Any]) -> list[str]:
    content = operation.get("requestBody", {}).get("content", {})
    return [f"Body (`{media}`): {type_of(spec.get('schema', {}))}" for media, spec in content.items()]


def _parameters(operation: dict[str, Any]) -> list[str]:
    params = operation.get("parameters", [])
    if not params:
        return []
    lines = ["| parameter | in | type | required | description |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{p['name']}` | {p['in']} | {_cell(type_of(p.get('schema', {})))} | {p.get('required', False)} | "
              f"{_cell(p.get('description') or p.get('schema', {}).get('description'))} |" for p in params]
    return [*lines, ""]


def _responses(operation: dict[str, Any]) -> list[str]:
    lines = ["| status | description | body |", "| --- | --- | --- |"]
    for status, response in sorted(operation.get("responses", {}).items()):
        bodies = [type_of(spec.get("schema", {})) for spec in response.get("content", {}).values()]
        lines.append(f"| {status} | {_cell(response.get('description'))} | {_cell(', '.join(bodies))} |")
    return lines


def operation_section(path: str, method: str, operation: dict[str, Any]) -> str:
    security = operation.get("security", [])
    keyed = "" if not any(security) else " (API key for some requests: see 401)" if {} in security else " (API key)"
    lines = [f"### `{method.upper()} {path}`{keyed}", ""]
    for text in (operation.get("summary"), operation.get("description")):
        if text:
            lines += [text.strip(), ""]
    lines += _parameters(operation)
    lines += [*(f"{line}\n" for line in _body(operation))]
    lines += _responses(operation)
    return "\n".join([*lines, ""])


def schema_section(name: str, schema: dict[str, Any]) -> str:
    lines = [f"### {name} {{#{name.lower()}}}", ""]
    if schema.get("description"):
        lines += [_cell(schema["description"]), ""]
    required = set(schema.get("required", []))
    properties = schema.get("properties", {})
    if properties:
        lines += ["| field | type | required | default | description |", "| --- | --- | --- | --- | --- |"]
        for field, spec in properties.items():
            default = f"`{spec['default']}`" if "default" in spec else ""
            lines.append(f"| `{field}` | {_cell(type_of(spec))} | {field in required} | {_cell(default)} | "
                         f"{_cell(spec.get('description'))} |")
    else:
        lines.append(f"{type_of(schema)}")
    return "\n".join([*lines, ""])


def render(document: dict[str, Any]) -> str:
    parts = [HEADER, f"OpenAPI {document.get('openapi', '')}, `{document['info']['title']}` "
                     f"{document['info'].get('version', '')}.", "", "## Routes", ""]
    for path, item in document["paths"].items():
        parts += [operation_section(path, m, item[m]) for m in METHODS if m in item]
    parts += ["## Schemas", ""]
    parts += [schema_section(n, s) for n, s in document.get("components", {}).get("schemas", {}).items()]
    return "\n".join(parts)


def openapi_document() -> dict[str, Any]:
    from service.http.app import create_app
    from service.http.settings import Settings

    # no bundle is loaded: the lifespan (which loads it) never runs to produce the document
    return create_app(Settings(artifacts="artifacts", api_key="documented-key-16chars")).openapi()
