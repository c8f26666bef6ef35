"""Error answers. Every failure a client can cause is an APIError with an HTTP status, rendered in
OpenAI's shape {"error": {"message", "type", "param", "code"}} — or, on Anthropic's /v1/messages,
Anthropic's {"type": "error", "error": {"type", "message"}} — never a bare 500 page."""

from __future__ import annotations

import json

from pydantic import ValidationError

# OpenAI's error types by status; Anthropic's by status
_OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                 429: "rate_limit_error", 500: "server_error", 503: "server_busy"}
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                    429: "rate_limit_error", 500: "api_error", 503: "overloaded_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def openai_body(self) -> dict:
        return {"error": {"message": self.message, "type": _OPENAI_TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status, "api_error"),
                                           "message": self.message}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def parse_json_body(body: bytes):
    """The request body as JSON, or a 400 saying where it is malformed."""
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad_request("the request body is not UTF-8", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"malformed JSON body: {exc.msg} at line {exc.lineno} column {exc.colno}",
                          code="invalid_json") from None
    except RecursionError:  # json's decoder recurses once per nested array or object
        raise bad_request("malformed JSON body: nested too deeply", code="invalid_json") from None


_TYPE_TAGS = ("str", "int", "float", "bool", "list", "dict", "none", "literal", "function-", "constrained-")


def _field_path(loc) -> list:
    """An error location without pydantic's union-member tags ('stop.str' -> 'stop')."""
    path = []
    for part in loc:
        if isinstance(part, str) and ("[" in part or part.startswith(_TYPE_TAGS)) and path:
            break
        path.append(part)
    return path


def validated(model_class, data):
    """data checked against a pydantic request model; the first problem as a 400 naming the field."""
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_json")
    try:
        return model_class.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in _field_path(first["loc"])) or None
        value = first.get("input")
        shown = "" if first["type"] == "missing" else f" (got {json.dumps(value, default=str)[:80]})"
        raise bad_request(f"{param}: {first['msg']}{shown}" if param else first["msg"], param=param,
                          code="invalid_value") from None
