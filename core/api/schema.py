"""OpenAPI post-processing: document the error responses every operation can give.

Views raise DRF exceptions that the exception handler turns into the one error format;
this hook declares them in the schema, so clients (and the schema fuzzer) know them.
"""

ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "status": {"type": "integer"},
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
            },
            "required": ["status", "code", "message"],
        }
    },
    "required": ["error"],
}

DESCRIPTIONS = {
    "400": "Invalid input",
    "401": "Not authenticated",
    "403": "Not allowed",
    "404": "Not found",
    "405": "Method not allowed",
    "409": "Conflict with the current state",
    "413": "Request too large",
    "415": "Unsupported media type",
    "429": "Too many requests",
    "503": "Overloaded: retry after the Retry-After seconds",
}


def add_error_responses(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"$ref": "#/components/schemas/Error"}
    for operations in result.get("paths", {}).values():
        for method, operation in operations.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            codes = ["400", "401", "403", "404", "405", "409", "429", "503"]
            if method in {"post", "put", "patch"}:
                codes += ["413", "415"]
            responses = operation.setdefault("responses", {})
            for code in codes:
                responses.setdefault(code, {"description": DESCRIPTIONS[code]})
            for code, response in responses.items():
                # An error a view declared by description only (discovery's 502) has the one format too.
                if code.isdigit() and int(code) >= 400 and "content" not in response:
                    response["content"] = {"application/json": {"schema": ref}}
    return result
