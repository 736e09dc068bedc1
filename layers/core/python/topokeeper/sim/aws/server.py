"""moto's server application (what ``moto_server`` serves) with a gateway in front, and a clean stop.

The gateway counts every request by operation, throttles by the emulator's rate limits, and serves the
operations the emulator models itself (HyperPod, DescribeInstanceTopology, SSM Run Command); all others
go to moto. The server is our own werkzeug server around the application moto_server serves, not a
ThreadedMotoServer (whose private ``_server_entry`` we would have to override to put the gateway in front);
unlike ThreadedMotoServer's ``stop``, ours closes kept-alive client connections, joins every request thread
and releases the port.

botocore clients in this process skip the socket: ``InProcessTransport`` hands their requests to the same
gateway in the calling thread (werkzeug's server closes the connection after every response, so each HTTP
request costs a connect and a server thread), and the gateway hands what moto answers to moto's handlers
without Flask's request machinery (``MotoHandlers``). Anything else (the stdlib agent and applier, presigned
URLs) reaches the gateway over HTTP and moto through its Flask application. What goes in process is not
signed in full (``ScopeOnlySigning``): moto checks no header signature.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import botocore.auth
from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest, AWSResponse
from botocore.exceptions import ClientError, NoCredentialsError
from flask import Flask, Response
from moto.core.botocore_stubber import MockRawResponse
from moto.core.request import (
    PRESERVED_HEADER_NAMES_ENVIRON_KEY,
    environ_key_for_header,
    should_preserve_original_header_name,
)
from moto.core.utils import convert_to_flask_response
from moto.moto_api import recorder
from moto.moto_server.werkzeug_app import (
    BackendRequest,
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from moto.settings import DISABLE_GLOBAL_CORS
from urllib3 import HTTPHeaderDict
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Rule
from werkzeug.serving import ThreadedWSGIServer
from werkzeug.wrappers import Response as WerkzeugResponse

from topokeeper.sim.aws.clock import RateLimits
from topokeeper.sim.aws.iam import acting_credentials
from topokeeper.sim.aws.ids import IdFactory
from topokeeper.sim.aws.protocol import (
    ApiError,
    ApiRequest,
    Reply,
    ec2_error,
    ec2_reply,
    json_error,
    json_reply,
    operation_model,
    read_request,
    rest_xml_error,
)

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Handler = Callable[[ApiRequest], Mapping[str, Any]]
_STATUS_TEXT = {
    200: "OK",
    400: "Bad Request",
    412: "Precondition Failed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class CallCounter:
    """Requests the server received, by operation. ``calls["ListClusterNodes"]`` sums over services;
    ``calls["sagemaker:ListClusterNodes"]`` is one service's (signing name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str]] = Counter()

    def record(self, service: str, operation: str) -> None:
        with self._lock:
            self._counts[(service, operation)] += 1

    def __getitem__(self, key: str) -> int:
        service, _, operation = key.rpartition(":")
        with self._lock:
            return sum(n for (s, op), n in self._counts.items() if op == operation and service in ("", s))

    def by_operation(self) -> dict[str, int]:
        totals: Counter[str] = Counter()
        with self._lock:
            for (_, operation), count in self._counts.items():
                totals[operation] += count
        return dict(sorted(totals.items()))

    def by_service(self) -> dict[str, dict[str, int]]:
        result: dict[str, dict[str, int]] = {}
        with self._lock:
            for (service, operation), count in sorted(self._counts.items()):
                result.setdefault(service, {})[operation] = count
        return result

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Calls made meanwhile are not counted: the simulator's own (the operator's actions, reading the
        audit history), not topokeeper's. Only for a caller that makes every call meanwhile itself."""
        with self._lock:
            saved = Counter(self._counts)
        try:
            yield
        finally:
            with self._lock:
                self._counts = saved


class Gateway:
    """WSGI middleware in front of moto's dispatcher."""

    def __init__(
        self,
        app: WsgiApp,
        *,
        region: str,
        handlers: Mapping[tuple[str, str], Handler],
        calls: CallCounter,
        rate_limits: RateLimits,
        ids: IdFactory,
        refusals: Iterable[Callable[[ApiRequest], None]] = (),
    ) -> None:
        self._app = app
        self._refusals = tuple(refusals)  # raise ApiError for what AWS refuses and moto would serve
        self._region = region
        self._handlers = handlers
        self._calls = calls
        self._rate_limits = rate_limits
        self._ids = ids

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO", "")).startswith("/moto-api"):
            return self._app(environ, start_response)
        request = read_request(environ, self._region)
        self._calls.record(request.service, request.operation)
        handler = self._handlers.get((request.service, request.operation))
        throttled = not self._rate_limits.allow(request.operation)
        refusal = self._refusal(request)
        if handler is None and not throttled and refusal is None:
            return self._app(environ, start_response)
        request_id = self._ids.uuid("request")
        try:
            if refusal is not None:
                raise refusal
            if throttled:
                if request.protocol in {"ec2", "query"}:
                    raise ApiError("RequestLimitExceeded", "Request limit exceeded.", 503)
                raise ApiError("ThrottlingException", "Rate exceeded", 400)
            assert handler is not None  # noqa: S101 - narrowed above
            result = handler(request)
            reply = self._reply(request, result, request_id)
        except ApiError as error:
            reply = self._error(request, error, request_id)
        except Exception:
            log.exception("emulator handler for %s failed", request.operation)
            reply = self._error(request, ApiError("InternalFailure", "The emulator failed.", 500), request_id)
        status, headers, body = reply
        start_response(f"{status} {_STATUS_TEXT.get(status, '')}", [*headers, ("Content-Length", str(len(body)))])
        return [body]

    def _refusal(self, request: ApiRequest) -> ApiError | None:
        for refuse in self._refusals:
            try:
                refuse(request)
            except ApiError as error:
                return error
        return None

    @staticmethod
    def _reply(request: ApiRequest, result: Mapping[str, Any], request_id: str) -> Reply:
        if request.protocol == "ec2":
            return ec2_reply(operation_model(request.service, request.operation), result, request_id)
        return json_reply(result, request_id)

    @staticmethod
    def _error(request: ApiRequest, error: ApiError, request_id: str) -> Reply:
        if request.protocol in ("ec2", "query"):
            return ec2_error(error, request_id)
        if request.protocol == "other":
            return rest_xml_error(error, request_id)
        return json_error(error, request_id)


class MotoHandlers:
    """moto's server application for botocore's requests in this process: the request goes to the handler of
    the backend and URL rule moto's Flask application would route it to, and comes back as the response that
    application would make of the handler's answer (``convert_to_flask_response`` and flask-cors' header), but
    without Flask's request context, signals, session and dispatch around it (about a fifth of a request's time
    in process). What needs them goes to the Flask application itself: moto's own API, a CORS request (an
    ``Origin``, a private-network preflight header, ``OPTIONS``), a URL no rule or a view of another kind takes.
    tests/integration/aws/test_emulator_transport.py holds the two to the same bytes."""

    _RULES_KEPT = 4096  # (application, method, path) -> rule; S3 paths name objects, so the memo is bounded

    def __init__(self, dispatcher: DomainDispatcherApplication) -> None:
        self._dispatcher = dispatcher
        self._rules: dict[tuple[Flask, str, str], Rule] = {}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if _needs_flask(environ):
            flask_answer: Iterable[bytes] = self._dispatcher(environ, start_response)
            return flask_answer
        app: Flask = self._dispatcher.get_application(environ)
        request = BackendRequest(environ)
        rule = self._rule(app, request)
        if rule is None:
            return app(environ, start_response)
        view = app.view_functions[rule.endpoint]
        if not isinstance(view, convert_to_flask_response):
            return app(environ, start_response)
        response: WerkzeugResponse
        try:
            response = _moto_response(view, request)
        except HTTPException as error:
            if app.trap_http_exception(error):
                raise  # as Flask raises it (moto's app runs in debug mode)
            # What Flask makes of an HTTP error a view raises: the error's own response (moto registers no handler).
            response = app.response_class.force_type(error, environ)  # type: ignore[arg-type]
        if not DISABLE_GLOBAL_CORS and _ALLOW_ORIGIN not in response.headers:
            response.headers.add(_ALLOW_ORIGIN, "*")  # flask-cors' defaults, for a request without an Origin
        return response(environ, start_response)

    def _rule(self, app: Flask, request: BackendRequest) -> Rule | None:
        """The URL rule Flask routes the request to, None if it routes it to none (an error, a redirect). A rule
        is matched on the method and the path alone (moto's applications match no host or subdomain), so each
        is matched once: werkzeug binds and walks the application's whole map for every request."""
        key = (app, request.method, request.path)
        rule = self._rules.get(key)
        if rule is not None and _routes_by_path(app):
            return rule
        adapter = app.create_url_adapter(request)
        try:
            matched, _ = adapter.match(return_rule=True) if adapter is not None else (None, {})
        except HTTPException:
            return None
        if not isinstance(matched, Rule):
            return None
        if len(self._rules) >= self._RULES_KEPT:
            self._rules.clear()
        self._rules[key] = matched
        return matched


def _routes_by_path(app: Flask) -> bool:
    """Whether the application's rules match on the method and path alone: no host or subdomain matching, and no
    trusted hosts to check (``create_url_adapter`` refuses an untrusted one)."""
    return not (app.url_map.host_matching or app.subdomain_matching or app.config["TRUSTED_HOSTS"])


class BackendDispatcher(DomainDispatcherApplication):
    """moto's dispatcher, finding each host's backend once: ``get_backend_for_host`` tries the host against every
    service's URL patterns (a fifth of moto's routing of a request), and its answer depends on the host alone (the
    patterns and moto's modules are fixed once it starts)."""

    def __init__(self, create_app: Callable[..., Flask]) -> None:
        super().__init__(create_app)
        self._backends: dict[str | None, Any] = {}

    def get_backend_for_host(self, host: str | None) -> Any:
        if host not in self._backends:
            self._backends[host] = super().get_backend_for_host(host)
        return self._backends[host]


_ALLOW_ORIGIN = "Access-Control-Allow-Origin"


def _needs_flask(environ: Mapping[str, Any]) -> bool:
    path = str(environ.get("PATH_INFO", ""))
    return (
        path.startswith(("/moto-api", "/favicon.ico", "/latest/"))
        or environ.get("REQUEST_METHOD") == "OPTIONS"
        or "HTTP_ORIGIN" in environ
        or "HTTP_ACCESS_CONTROL_REQUEST_PRIVATE_NETWORK" in environ
    )


def _moto_response(view: convert_to_flask_response, request: BackendRequest) -> Response:
    """``convert_to_flask_response.__call__`` with the request given rather than Flask's context-local one."""
    recorder._record_request(request)
    try:
        result = view.callback(request, request.raw_url, dict(request.headers))
    except ClientError as error:
        result = 400, {}, error.response["Error"]["Message"]
    status, headers, content = result if len(result) == 3 else (200, {}, result)
    response = Response(response=content, status=status, headers=headers)
    if request.method == "HEAD" and "content-length" in headers:
        response.headers["Content-Length"] = headers["content-length"]
    return response


class _Handler(MotoRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as werkzeug would set on moto's handler class itself

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        log.debug("%s %s", self.requestline, code)


class _Server(ThreadedWSGIServer):
    """Request threads are tracked and joined on close (kept-alive connections are closed first); they
    stay daemon threads so that an emulator never stopped cannot hold the interpreter at exit. socketserver
    joins only non-daemon threads, so this class keeps its own list."""

    daemon_threads = True

    def __init__(self, host: str, port: int, app: WsgiApp) -> None:
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        self._request_threads: list[threading.Thread] = []
        super().__init__(host, port, app, handler=_Handler)

    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.add(request)
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self._connections_lock:
            self._request_threads = [t for t in self._request_threads if t.is_alive()]
            self._request_threads.append(thread)
        thread.start()

    def server_close(self) -> None:
        super().server_close()
        with self._connections_lock:
            threads, self._request_threads = self._request_threads, []
        for thread in threads:
            thread.join(timeout=10)

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        if isinstance(request, socket.socket):
            with self._connections_lock:
                self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


class EmulatorServer:
    """moto's application on a free port with the gateway in front, served from a thread."""

    def __init__(self, wrap: Callable[[WsgiApp], WsgiApp], host: str = "127.0.0.1") -> None:
        self._wrap = wrap
        self._host = host
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.app: WsgiApp | None = None  # what the server serves
        self.in_process_app: WsgiApp | None = None  # the same gateway and moto, for InProcessTransport

    def start(self) -> None:
        """Binds before returning (a bind error is raised here), then serves in a daemon thread."""
        dispatcher = BackendDispatcher(create_backend_app)
        self.app = self._wrap(dispatcher)
        self.in_process_app = self._wrap(MotoHandlers(dispatcher))
        server = _Server(self._host, 0, self.app)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="aws-emulator", daemon=True
        )
        self._thread.start()

    def get_host_and_port(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("the emulator's server is not running")
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def stop(self) -> None:
        server = self._server
        if server is not None:
            server.shutdown()
            server.close_connections()
            server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None
        self._thread = None


class InProcessTransport:
    """A botocore ``before-send`` handler: a request for ``host:port`` is answered by ``app`` in the calling
    thread, with the WSGI environ werkzeug's server (and moto's request handler) would have built from it, and
    the response botocore would have read from the socket. Requests for anywhere else go on over HTTP."""

    def __init__(self, app: WsgiApp, host: str, port: int) -> None:
        self._app: WsgiApp | None = app
        self._host = host
        self._port = port

    def close(self) -> None:
        """Answer nothing more: a session made meanwhile keeps this handler, and a later emulator may get the port."""
        self._app = None

    def answers(self, url: str) -> bool:
        """Whether a request for ``url`` is answered here (else it goes on over HTTP)."""
        parts = urlsplit(url)
        host = str(parts.hostname)
        return (
            self._app is not None
            and parts.port == self._port
            and (host == self._host or host.endswith(f".{self._host}"))
        )

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse | None:
        app = self._app
        if app is None or not self.answers(request.url):
            return None
        url = urlsplit(request.url)
        body = request.body
        if body is None:
            data = b""
        elif isinstance(body, bytes | bytearray):
            data = bytes(body)
        elif isinstance(body, str):
            data = body.encode("utf-8")
        else:
            data = body.read()
        status: list[str] = []
        response_headers: list[tuple[str, str]] = []

        def start_response(line: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
            status[:] = [line]
            response_headers[:] = headers

        chunks = app(self._environ(request, url.netloc, data), start_response)
        try:
            content = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        return AWSResponse(
            request.url, int(status[0].split(" ", 1)[0]), HTTPHeaderDict(response_headers), MockRawResponse(content)
        )

    def _environ(self, request: AWSPreparedRequest, netloc: str, data: bytes) -> dict[str, Any]:
        """``werkzeug.serving.WSGIRequestHandler.make_environ`` plus ``MotoRequestHandler``'s preserved names."""
        target = request.url.split(netloc, 1)[1] or "/"
        path, _, query = target.partition("?")
        headers = {"Host": netloc, **{k: _text(v) for k, v in request.headers.items()}}
        if data or request.method not in ("GET", "HEAD"):
            headers.setdefault("Content-Length", str(len(data)))
        environ: dict[str, Any] = {
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(data),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": False,
            "wsgi.run_once": False,
            "REQUEST_METHOD": request.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": _wsgi_text(unquote(path)),
            "QUERY_STRING": _wsgi_text(query),
            "REQUEST_URI": _wsgi_text(target),
            "RAW_URI": _wsgi_text(target),
            "REMOTE_ADDR": "127.0.0.1",
            "REMOTE_PORT": 0,
            "SERVER_NAME": self._host,
            "SERVER_PORT": str(self._port),
            "SERVER_PROTOCOL": "HTTP/1.1",
        }
        for name, raw in headers.items():
            if "_" in name:
                continue
            key, value = name.upper().replace("-", "_"), raw.replace("\r\n", "")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = f"HTTP_{key}"
                if key in environ:
                    value = f"{environ[key]},{value}"
            environ[key] = value
        dashed = {environ_key_for_header(name) for name in headers if "_" not in name}
        names: dict[str, str] = {}
        values: dict[str, list[str]] = {}
        for name, value in headers.items():
            if not should_preserve_original_header_name(name):
                continue
            key = environ_key_for_header(name)
            if key in dashed:
                continue
            names.setdefault(key, name)
            values.setdefault(key, []).append(value.replace("\r\n", ""))
        for key, joined in values.items():
            environ[key] = ",".join(joined)
        environ[PRESERVED_HEADER_NAMES_ENVIRON_KEY] = names
        return environ


UNCOMPUTED_SIGNATURE = "0" * 64  # where a request answered in process carries its SigV4 signature


class ScopeOnlySigning:
    """botocore's SigV4 header signing (``v4``, ``s3v4``) for the requests ``answers(url)`` takes in process:
    every header botocore sets (``X-Amz-Date``, the session token, S3's payload hash, ``Authorization`` with
    its credential scope and signed header names) but the signature itself is not computed: hashing the
    canonical request and the key derivation were a tenth of a request's time, and moto checks no header
    signature (the gateway reads the scope: service, region, access key). A client without credentials still
    fails as botocore's does, an unsigned one still sends no ``Authorization`` (and S3 refuses it), and what
    goes over HTTP or is presigned (the agent, presigned URLs, which the emulator verifies) is signed in full.
    ``apply`` replaces the two entries of botocore's signer table with subclasses; ``restore`` puts them back."""

    _VERSIONS = ("v4", "s3v4")
    _PRESIGNERS = ("v4-query", "s3v4-query")

    def __init__(self, answers: Callable[[str], bool]) -> None:
        self._answers = answers
        self._originals: dict[str, type[SigV4Auth]] = {}

    def apply(self) -> None:
        for version in self._VERSIONS:
            original = botocore.auth.AUTH_TYPE_MAPS[version]
            if issubclass(original, SigV4Auth):  # botocore's own signer (not awscrt's)
                self._originals[version] = original
                botocore.auth.AUTH_TYPE_MAPS[version] = _scope_only(original, self._answers)
        for version in self._PRESIGNERS:
            original = botocore.auth.AUTH_TYPE_MAPS[version]
            self._originals[version] = original
            botocore.auth.AUTH_TYPE_MAPS[version] = _acting(original)

    def restore(self) -> None:
        for version, original in self._originals.items():
            botocore.auth.AUTH_TYPE_MAPS[version] = original
        self._originals.clear()


def _scope_only(signer: type[SigV4Auth], answers: Callable[[str], bool]) -> type[SigV4Auth]:
    class ScopeOnly(signer):  # type: ignore[misc]
        def add_auth(self, request: AWSRequest) -> None:
            self.credentials: Any = acting_credentials.get() or self.credentials
            if not answers(request.url):
                super().add_auth(request)
                return
            # SigV4Auth.add_auth without the canonical request, the string to sign and the signature.
            if self.credentials is None:
                raise NoCredentialsError()
            request.context["timestamp"] = botocore.auth.get_current_datetime().strftime(SIGV4_TIMESTAMP)
            self._modify_request_before_signing(request)
            self._inject_signature_to_request(request, UNCOMPUTED_SIGNATURE)

    ScopeOnly.__name__ = ScopeOnly.__qualname__ = f"ScopeOnly{signer.__name__}"
    return ScopeOnly


def _acting(signer: type[SigV4Auth]) -> type[SigV4Auth]:
    """A presigner that signs with the credentials of the role acting in this thread (iam.acting_as), if any."""

    class Acting(signer):  # type: ignore[misc]
        def add_auth(self, request: AWSRequest) -> None:
            self.credentials: Any = acting_credentials.get() or self.credentials
            super().add_auth(request)

    Acting.__name__ = Acting.__qualname__ = f"Acting{signer.__name__}"
    return Acting


def _text(value: str | bytes) -> str:
    """A header value as http.server reads it off the wire."""
    return value.decode("iso-8859-1") if isinstance(value, bytes) else value


def _wsgi_text(value: str) -> str:
    """werkzeug's ``_wsgi_encoding_dance``: WSGI strings are latin-1 code points of the UTF-8 bytes."""
    return value.encode().decode("latin1")
