"""The wire side of the emulator: which operation a request is, its parameters, and AWS-shaped replies.

Only what the emulator's own operations need: the AWS JSON protocol (SageMaker, SSM) and the EC2
query protocol, both driven by the botocore service model. Operations are recognised for every
protocol (JSON target header, query ``Action``, Smithy RPC v2 path, REST URI templates) so that the
call counter names every request the server receives.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, unquote
from xml.sax.saxutils import escape

import botocore.session
from botocore.exceptions import UnknownServiceError
from botocore.model import OperationModel, ServiceModel, Shape
from botocore.validate import ParamValidator

# Signing names whose botocore service name differs.
_SERVICE_FOR_SIGNING_NAME = {"monitoring": "cloudwatch", "email": "ses", "states": "stepfunctions"}
_JSON_CONTENT = ("application/x-amz-json-1.0", "application/x-amz-json-1.1", "application/json")
_FORM_CONTENT = "application/x-www-form-urlencoded"
_CBOR_PATH = re.compile(r"^/service/(?P<service>[^/]+)/operation/(?P<operation>[^/?]+)")
_SCOPE = re.compile(r"Credential=(?P<key>[^/,\s]+)/\d{8}/(?P<region>[^/]+)/(?P<service>[^/]+)/aws4_request")


# TLS is not emulated (the endpoint is http:// for every client, and every AWS SDK uses HTTPS by default): a
# request carrying this header stands for one sent over plain HTTP (AwsEmulator.client(..., use_ssl=False)).
PLAIN_HTTP_HEADER = "X-Topokeeper-Plain-Http"
UNKNOWN_OPERATION = "Unknown"  # counted as such: a request whose operation could not be recognised


class ApiError(Exception):
    """An error reply: ``code`` as AWS spells it, a message, and the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


@functools.cache
def _session() -> botocore.session.Session:
    return botocore.session.get_session()


@functools.cache
def service_model(service: str) -> ServiceModel | None:
    """The botocore model for a signing name (``sagemaker``, ``ec2``, ``monitoring``, ...)."""
    try:
        return _session().get_service_model(_SERVICE_FOR_SIGNING_NAME.get(service, service))
    except UnknownServiceError:
        return None


def operation_model(service: str, operation: str) -> OperationModel:
    model = service_model(service)
    if model is None:
        raise KeyError(service)
    return model.operation_model(operation)


@dataclass
class ApiRequest:
    """One request as the emulator sees it."""

    service: str
    operation: str
    region: str
    access_key: str
    method: str
    path: str
    query: str
    content_type: str
    headers: Mapping[str, str]
    body: bytes = b""
    source_ip: str = "127.0.0.1"
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def user_agent(self) -> str:
        return self.headers.get("User-Agent", "")

    @property
    def secure(self) -> bool:
        """Whether it came over TLS (``aws:SecureTransport``): unless marked plain HTTP (``PLAIN_HTTP_HEADER``)."""
        return PLAIN_HTTP_HEADER not in self.headers

    @property
    def protocol(self) -> str:
        if self.content_type.startswith(_FORM_CONTENT):
            return "ec2" if self.service == "ec2" else "query"
        if self.content_type.startswith(_JSON_CONTENT) and "X-Amz-Target" in self.headers:
            return "json"
        return "other"


def _environ_headers(environ: Mapping[str, Any]) -> dict[str, str]:
    headers = {}
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = "-".join(part.capitalize() for part in key[5:].split("_"))
            headers[name] = str(value)
    if environ.get("CONTENT_TYPE"):
        headers["Content-Type"] = str(environ["CONTENT_TYPE"])
    return headers


def _read_body(environ: dict[str, Any]) -> bytes:
    """Read the body and put it back, so that moto can read it again."""
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = 0
    if length <= 0:
        return b""
    body: bytes = environ["wsgi.input"].read(length)
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def read_request(environ: dict[str, Any], default_region: str) -> ApiRequest:
    """Recognise the service and operation of a WSGI request (reads small RPC bodies only)."""
    headers = _environ_headers(environ)
    content_type = headers.get("Content-Type", "")
    query = str(environ.get("QUERY_STRING", ""))
    # A presigned URL carries its credential scope in the query (X-Amz-Credential), not in a header.
    scope = _SCOPE.search(headers.get("Authorization", "")) or _SCOPE.search(unquote(query))
    service = scope["service"].lower() if scope else "unknown"
    request = ApiRequest(
        service=service,
        operation="",
        region=scope["region"] if scope else default_region,
        access_key=scope["key"] if scope else "",
        method=str(environ.get("REQUEST_METHOD", "GET")),
        path=str(environ.get("PATH_INFO", "/")),
        query=query,
        content_type=content_type,
        headers=headers,
        source_ip=str(environ.get("REMOTE_ADDR", "127.0.0.1")),
    )
    target = headers.get("X-Amz-Target")
    cbor = _CBOR_PATH.match(request.path)
    if target:
        request.operation = target.rsplit(".", 1)[-1]
        if content_type.startswith(_JSON_CONTENT):
            request.body = _read_body(environ)
    elif content_type.startswith(_FORM_CONTENT):
        request.body = _read_body(environ)
        action = parse_qs(request.body.decode("utf-8", "replace")).get("Action")
        request.operation = action[0] if action else ""
    elif cbor:
        request.operation = cbor["operation"]
    else:
        request.operation = _rest_operation(service, request.method, request.path, request.query, headers) or ""
    if not request.operation:
        request.operation = UNKNOWN_OPERATION
    return request


@dataclass(frozen=True)
class _Route:
    method: str
    path: re.Pattern[str]
    query: Mapping[str, str | None]  # from the URI template: key -> required value (None: any)
    required_query: tuple[str, ...]  # required input members sent in the query string
    required_headers: tuple[str, ...]  # ... and in headers (lower case)
    operation: str

    def matches(self, method: str, path: str, params: Mapping[str, list[str]], headers: Mapping[str, str]) -> bool:
        return (
            method == self.method
            and self.path.match(path) is not None
            and all(k in params and (v is None or v in params[k]) for k, v in self.query.items())
            and all(k in params for k in self.required_query)
            and all(h in headers for h in self.required_headers)
        )


@functools.cache
def _rest_index(service: str) -> list[_Route]:
    """REST operations of a service, most specific first (URI literals, then required query and headers)."""
    model = service_model(service)
    if model is None or model.protocol not in ("rest-json", "rest-xml"):
        return []
    routes: list[tuple[tuple[int, int], _Route]] = []
    for name in model.operation_names:
        operation = model.operation_model(name)
        uri = str(operation.http.get("requestUri", "/"))
        path, _, query = uri.partition("?")
        pattern = ""
        literal = 0
        for piece in re.split(r"(\{[^}]+\})", path):
            if piece.startswith("{"):
                pattern += ".+" if piece.endswith("+}") else "[^/]+"
            else:
                pattern += re.escape(piece)
                literal += len(piece)
        fixed: dict[str, str | None] = {}
        for item in filter(None, query.split("&")):
            key, _, value = item.partition("=")
            if key != "x-id":
                fixed[key] = value or None
        required_query: list[str] = []
        required_headers: list[str] = []
        shape = operation.input_shape
        for member in shape.required_members if shape is not None else []:
            location = shape.members[member].serialization.get("location")
            located = str(shape.members[member].serialization.get("name", member))
            if location == "querystring":
                required_query.append(located)
            elif location == "header":
                required_headers.append(located.lower())
        route = _Route(
            str(operation.http.get("method", "GET")),
            re.compile(f"^{pattern}/?$"),
            fixed,
            tuple(required_query),
            tuple(required_headers),
            name,
        )
        routes.append(((len(fixed) + len(required_query) + len(required_headers), literal), route))
    routes.sort(key=lambda item: item[0], reverse=True)
    return [route for _, route in routes]


def _rest_operation(service: str, method: str, path: str, query: str, headers: Mapping[str, str]) -> str | None:
    params = parse_qs(query, keep_blank_values=True)
    lower = {k.lower(): v for k, v in headers.items()}
    return next((r.operation for r in _rest_index(service) if r.matches(method, path, params, lower)), None)


# ---------------------------------------------------------------- parameters


def json_params(request: ApiRequest) -> dict[str, Any]:
    if not request.body:
        return {}
    try:
        parsed = json.loads(request.body)
    except ValueError as error:
        raise ApiError("SerializationException", f"malformed JSON body: {error}") from error
    if not isinstance(parsed, dict):
        raise ApiError("SerializationException", "the JSON body is not an object")
    return parsed


def _query_list_name(member_name: str, shape: Shape) -> str:
    name = shape.serialization.get("queryName") or shape.serialization.get("name") or member_name
    return str(name[0].upper() + name[1:])


def ec2_params(request: ApiRequest, operation: OperationModel) -> dict[str, Any]:
    """The EC2 query protocol's flattened form (``InstanceId.1``, ``Filter.1.Value.1``) back into a dict."""
    form = {key: values[-1] for key, values in parse_qs(request.body.decode("utf-8", "replace")).items()}
    shape = operation.input_shape
    return _ec2_struct(form, "", shape) if shape is not None else {}


def _ec2_struct(form: Mapping[str, str], prefix: str, shape: Shape) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for member_name, member in shape.members.items():
        key = prefix + _query_list_name(member_name, member)
        value = _ec2_value(form, key, member)
        if value is not None:
            result[member_name] = value
    return result


def _ec2_value(form: Mapping[str, str], key: str, shape: Shape) -> Any:
    if shape.type_name == "structure":
        nested = _ec2_struct(form, key + ".", shape)
        return nested or None
    if shape.type_name == "list":
        items = []
        index = 1
        while True:
            item = _ec2_value(form, f"{key}.{index}", shape.member)
            if item is None:
                break
            items.append(item)
            index += 1
        return items or None
    if key not in form:
        return None
    raw = form[key]
    if shape.type_name in ("integer", "long"):
        try:
            return int(raw)
        except ValueError as error:
            raise ApiError("InvalidParameterValue", f"Invalid value '{raw}' for {key}") from error
    if shape.type_name == "boolean":
        return raw.lower() == "true"
    return raw


# ---------------------------------------------------------------- validation


def lower_camel(name: str) -> str:
    return name[:1].lower() + name[1:]


def validate_input(
    operation: OperationModel,
    params: Mapping[str, Any],
    *,
    skip_enum_shapes: Iterable[str] = (),
    client_checks: bool = False,
) -> None:
    """The checks AWS makes and botocore does not (max, pattern, enum), with AWS's message; with
    ``client_checks`` also botocore's own (required members, types, min), for requests that did not
    come through a boto3 client.

    Raises ``ValidationException`` listing every violation, as the JSON services do.
    """
    shape = operation.input_shape
    if shape is None:
        return
    if client_checks:
        report = ParamValidator().validate(params, shape)
        if report.has_errors():
            raise ApiError("ValidationException", report.generate_report())
    problems: list[str] = []
    _validate(shape, params, "", problems, frozenset(skip_enum_shapes))
    if problems:
        count = len(problems)
        noun = "error" if count == 1 else "errors"
        raise ApiError("ValidationException", f"{count} validation {noun} detected: " + "; ".join(problems))


def _validate(shape: Shape, value: Any, path: str, problems: list[str], skip: frozenset[str]) -> None:
    meta = shape.metadata
    shown = json.dumps(value, default=str) if isinstance(value, list | dict) else str(value)

    def fail(constraint: str) -> None:
        problems.append(f"Value '{shown}' at '{path}' failed to satisfy constraint: Member must {constraint}")

    if shape.type_name == "structure" and isinstance(value, Mapping):
        for name, member in shape.members.items():
            if name in value and value[name] is not None:
                child = f"{path}.{lower_camel(name)}" if path else lower_camel(name)
                _validate(member, value[name], child, problems, skip)
    elif shape.type_name == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            fail(f"have length less than or equal to {meta['max']}")
        for index, item in enumerate(value, start=1):
            _validate(shape.member, item, f"{path}.{index}.member", problems, skip)
    elif shape.type_name == "map" and isinstance(value, Mapping):
        for item in value.values():
            _validate(shape.value, item, f"{path}.value", problems, skip)
    elif shape.type_name == "string" and isinstance(value, str):
        for constraint in _string_violations(shape, value, skip):
            fail(constraint)
    elif shape.type_name in ("integer", "long") and isinstance(value, int) and "max" in meta and value > meta["max"]:
        fail(f"have value less than or equal to {meta['max']}")


def _string_violations(shape: Shape, value: str, skip: frozenset[str]) -> list[str]:
    meta = shape.metadata
    found = []
    if "max" in meta and len(value) > meta["max"]:
        found.append(f"have length less than or equal to {meta['max']}")
    if "pattern" in meta and not _pattern_matches(str(meta["pattern"]), value):
        found.append(f"satisfy regular expression pattern: {meta['pattern']}")
    if shape.enum and shape.name not in skip and value not in shape.enum:
        found.append(f"satisfy enum value set: [{', '.join(shape.enum)}]")
    return found


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern)
    except re.error:
        return None


def _pattern_matches(pattern: str, value: str) -> bool:
    regex = _compiled(pattern)
    return True if regex is None else regex.fullmatch(value) is not None


# ---------------------------------------------------------------- replies

Reply = tuple[int, list[tuple[str, str]], bytes]


def epoch(value: datetime) -> float:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return epoch(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def json_reply(result: Mapping[str, Any], request_id: str) -> Reply:
    body = json.dumps(result, default=_json_default).encode()
    return 200, [("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-RequestId", request_id)], body


def json_error(error: ApiError, request_id: str) -> Reply:
    body = json.dumps({"__type": error.code, "message": error.message}).encode()
    headers = [
        ("Content-Type", "application/x-amz-json-1.1"),
        ("x-amzn-RequestId", request_id),
        ("x-amzn-ErrorType", error.code),
    ]
    return error.status, headers, body


def _xml_value(shape: Shape, value: Any) -> str:
    if shape.type_name == "structure":
        parts = []
        for name, member in shape.members.items():
            if name in value and value[name] is not None:
                tag = str(member.serialization.get("name") or lower_camel(name))
                parts.append(f"<{tag}>{_xml_value(member, value[name])}</{tag}>")
        return "".join(parts)
    if shape.type_name == "list":
        tag = str(shape.member.serialization.get("name") or "item")
        return "".join(f"<{tag}>{_xml_value(shape.member, item)}</{tag}>" for item in value)
    if shape.type_name == "boolean":
        return "true" if value else "false"
    if shape.type_name == "timestamp" and isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return escape(str(value))


def ec2_reply(operation: OperationModel, result: Mapping[str, Any], request_id: str) -> Reply:
    namespace = str(operation.service_model.metadata.get("xmlNamespace", "http://ec2.amazonaws.com/doc/2016-11-15"))
    shape = operation.output_shape
    inner = _xml_value(shape, result) if shape is not None else ""
    name = f"{operation.name}Response"
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<{name} xmlns="{namespace.rstrip("/")}/">'
        f"<requestId>{request_id}</requestId>{inner}</{name}>"
    )
    return 200, [("Content-Type", "text/xml;charset=UTF-8")], body.encode()


def ec2_error(error: ApiError, request_id: str) -> Reply:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
        f"<Code>{escape(error.code)}</Code><Message>{escape(error.message)}</Message>"
        f"</Error></Errors><RequestID>{request_id}</RequestID></Response>"
    )
    return error.status, [("Content-Type", "text/xml;charset=UTF-8")], body.encode()


def rest_xml_error(error: ApiError, request_id: str) -> Reply:
    """S3's error document (REST services other than JSON ones)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error>'
        f"<Code>{escape(error.code)}</Code><Message>{escape(error.message)}</Message>"
        f"<RequestId>{request_id}</RequestId></Error>"
    )
    return error.status, [("Content-Type", "application/xml"), ("x-amz-request-id", request_id)], body.encode()


def encode_token(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value, separators=(",", ":")).encode()).decode()


def decode_token(token: str, code: str = "ValidationException") -> Any:
    try:
        return json.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, TypeError) as error:
        raise ApiError(code, f"Invalid pagination token: {token!r}") from error


Handler = Callable[[ApiRequest], Mapping[str, Any]]
