"""The committed spec's own consistency: it is a valid OpenAPI 3.1 document, every example
validates against its schema (JSON Schema 2020-12, `$ref`s resolved against the whole
document), operation ids are unique, and every operation has a tag."""

import json
from collections import Counter
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate as validate_openapi
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).resolve().parents[2] / "openapi" / "openapi.json"
SPEC_URI = "urn:gpu-ops:openapi"
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
# Keywords whose value is one schema, or a list or a map of them.
SUBSCHEMA = {"items", "not", "if", "then", "else", "contains", "propertyNames",
             "additionalProperties", "unevaluatedItems", "unevaluatedProperties",
             "contentSchema", "itemSchema"}
SUBSCHEMA_LISTS = {"allOf", "anyOf", "oneOf", "prefixItems"}
SUBSCHEMA_MAPS = {"properties", "patternProperties", "dependentSchemas", "$defs"}


def pointer(*parts) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def schema_examples(schema, at: str):
    """(where, schema pointer, example) for a schema's `example` and `examples` and those of
    every subschema in it."""
    if not isinstance(schema, dict):
        return
    if "example" in schema:
        yield at + "/example", at, schema["example"]
    for i, example in enumerate(schema.get("examples", [])):
        yield f"{at}/examples/{i}", at, example
    for key, value in schema.items():
        if key in SUBSCHEMA:
            yield from schema_examples(value, at + pointer(key))
        elif key in SUBSCHEMA_LISTS:
            for i, sub in enumerate(value):
                yield from schema_examples(sub, at + pointer(key, i))
        elif key in SUBSCHEMA_MAPS:
            for name, sub in value.items():
                yield from schema_examples(sub, at + pointer(key, name))


def example_holder_examples(holder: dict, at: str, spec: dict):
    """Examples of a media type, parameter or header: its `example`, its `examples`
    (Example Objects, possibly `$ref`s to components/examples; `externalValue`s are not
    fetched), and those inside its schema."""
    schema_at = at + "/schema"
    if "schema" in holder:
        yield from schema_examples(holder["schema"], schema_at)
        if "example" in holder:
            yield at + "/example", schema_at, holder["example"]
        for name, example in holder.get("examples", {}).items():
            if "$ref" in example:
                example = resolve(spec, example["$ref"])
            if "value" in example:
                yield f"{at}/examples/{name}", schema_at, example["value"]
    for name, sub in holder.get("content", {}).items():  # a parameter's or header's content
        yield from example_holder_examples(sub, at + pointer("content", name), spec)
    if "x-itemSchema" in holder:
        yield from schema_examples(holder["x-itemSchema"], at + "/x-itemSchema")


def resolve(spec: dict, ref: str):
    node = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def response_examples(response: dict, at: str, spec: dict):
    for name, media in response.get("content", {}).items():
        yield from example_holder_examples(media, at + pointer("content", name), spec)
    for name, header in response.get("headers", {}).items():
        yield from example_holder_examples(header, at + pointer("headers", name), spec)


def operation_examples(op: dict, at: str, spec: dict):
    for i, param in enumerate(op.get("parameters", [])):
        yield from example_holder_examples(param, at + pointer("parameters", i), spec)
    for name, media in op.get("requestBody", {}).get("content", {}).items():
        yield from example_holder_examples(media, at + pointer("requestBody", "content", name),
                                           spec)
    for status, response in op.get("responses", {}).items():
        yield from response_examples(response, at + pointer("responses", status), spec)


def all_examples(spec: dict):
    components = spec.get("components", {})
    for name, schema in components.get("schemas", {}).items():
        yield from schema_examples(schema, pointer("components", "schemas", name))
    for kind in ("parameters", "headers", "requestBodies"):
        for name, holder in components.get(kind, {}).items():
            yield from example_holder_examples(holder, pointer("components", kind, name), spec)
    for name, response in components.get("responses", {}).items():
        yield from response_examples(response, pointer("components", "responses", name), spec)
    for path, item in spec["paths"].items():
        for i, param in enumerate(item.get("parameters", [])):
            yield from example_holder_examples(param, pointer("paths", path, "parameters", i),
                                               spec)
        for method, op in item.items():
            if method in METHODS:
                yield from operation_examples(op, pointer("paths", path, method), spec)


def operations(spec: dict):
    return [
        (f"{method.upper()} {path}", op)
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in METHODS
    ]


SPEC = json.loads(SPEC_PATH.read_text())
EXAMPLES = list(all_examples(SPEC))
REGISTRY = Registry().with_resource(SPEC_URI, DRAFT202012.create_resource(SPEC))


def test_the_spec_is_valid_openapi_3_1():
    # Strict validators and generators reject what the 3.1 meta-schema does (3.2's
    # `itemSchema`, non-string link values, snake-case link fields…).
    assert SPEC["openapi"].startswith("3.1")
    validate_openapi(SPEC)


def test_the_spec_has_examples():
    # The walk above finds them: schema, property and media-type examples alike.
    found = {where.split("/")[1] for where, _, _ in EXAMPLES}
    assert found == {"components", "paths"}, found
    assert len(EXAMPLES) > 100


@pytest.mark.parametrize(("where", "schema_at", "example"), EXAMPLES,
                         ids=[where for where, _, _ in EXAMPLES])
def test_example_validates_against_its_schema(where, schema_at, example):
    validator = Draft202012Validator({"$ref": f"{SPEC_URI}#{schema_at}"}, registry=REGISTRY)
    errors = [
        f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in validator.iter_errors(example)
    ]
    assert not errors, f"{where} does not validate against {schema_at}:\n" + "\n".join(errors)


def test_operation_ids_are_unique(spec):
    counts = Counter(op.get("operationId") for _, op in operations(spec))
    assert None not in counts, [name for name, op in operations(spec) if "operationId" not in op]
    assert [op_id for op_id, n in counts.items() if n > 1] == []


def test_every_operation_has_a_tag(spec):
    declared = {tag["name"] for tag in spec.get("tags", [])}
    untagged = [name for name, op in operations(spec) if not op.get("tags")]
    assert untagged == []
    if declared:  # tags used but not declared at the top level
        used = {tag for _, op in operations(spec) for tag in op["tags"]}
        assert used <= declared, used - declared
