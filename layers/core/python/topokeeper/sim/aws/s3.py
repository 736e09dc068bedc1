"""What S3 refuses that moto serves: a SigV2-signed read of an SSE-KMS object, an unsigned request to a bucket,
and a SigV4 presigned URL that has expired or whose signature does not match.

S3 answers ``InvalidArgument`` ("Requests specifying Server Side Encryption with AWS KMS managed keys
require AWS Signature Version 4.") to a GET or HEAD of a KMS-encrypted object signed with SigV2, by
header (``Authorization: AWS key:signature``) or by query (a presigned URL with ``AWSAccessKeyId`` and
``Signature``). botocore presigns with SigV2 in us-east-1 and us-west-2 unless told ``s3v4``, so a
presigned URL for the stack's KMS-encrypted bucket works in moto and fails on AWS; the emulator refuses it.

moto checks no signature at all: an unsigned PUT writes any object. The emulator answers ``AccessDenied`` to a
request for one of its buckets that carries no signature, and checks a SigV4 presigned URL (query
``X-Amz-Algorithm=AWS4-HMAC-SHA256``) as S3 does: past ``X-Amz-Date`` + ``X-Amz-Expires`` (wall time, which
botocore signs with) ``AccessDenied`` "Request has expired"; for a key whose secret it knows, the signature
over the canonical request (``UNSIGNED-PAYLOAD``) or ``SignatureDoesNotMatch``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import parse_qs, quote, unquote

from moto.s3.models import s3_backends

from topokeeper.sim.aws.protocol import ApiError, ApiRequest

KMS_NEEDS_SIGV4 = (
    "Requests specifying Server Side Encryption with AWS KMS managed keys require AWS Signature Version 4."
)
# The stack's bucket encryption (infra/ sets a customer managed key; moto needs no key to exist).
# S3 signs a SigV4 URL for at most a week.
MAX_PRESIGNED_SECONDS = 7 * 24 * 3600
KMS_DEFAULT_ENCRYPTION = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "aws:kms"}}]}
_VIRTUAL_HOST = re.compile(r"^(?P<bucket>[a-z0-9][a-z0-9.-]*?)\.s3[.-]")


def is_sigv2(request: ApiRequest) -> bool:
    query = parse_qs(request.query)
    by_query = "Signature" in query and "AWSAccessKeyId" in query
    return by_query or request.headers.get("Authorization", "").startswith("AWS ")


def bucket_and_key(request: ApiRequest) -> tuple[str, str]:
    """Virtual-host style (``bucket.s3.<region>.amazonaws.com/key``) or path style (``/bucket/key``)."""
    host = request.headers.get("Host", "").split(":", 1)[0]
    match = _VIRTUAL_HOST.match(host)
    if match:
        return match["bucket"], request.path.lstrip("/")
    bucket, _, key = request.path.lstrip("/").partition("/")
    return bucket, key


SIGV4_ALGORITHM = "AWS4-HMAC-SHA256"
_UNRESERVED = "-_.~"


def query_pairs(query: str) -> list[tuple[str, str]]:
    """The raw query's pairs, percent-decoded (never '+' as space: SigV4 encodes a space as %20)."""
    pairs = []
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        pairs.append((unquote(key), unquote(value)))
    return pairs


def presigned_sigv4_signature(request: ApiRequest, secret_key: str) -> str:
    """The signature S3 computes for a SigV4 presigned request (query auth, unsigned payload)."""
    pairs = query_pairs(request.query)
    params = dict(pairs)
    canonical_query = "&".join(
        f"{quote(k, safe=_UNRESERVED)}={quote(v, safe=_UNRESERVED)}" for k, v in sorted(pairs) if k != "X-Amz-Signature"
    )
    headers = {name.lower(): value for name, value in request.headers.items()}
    signed = params.get("X-Amz-SignedHeaders", "").split(";")
    canonical_headers = "".join(f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed)
    canonical = "\n".join(
        [
            request.method,
            quote(request.path, safe="/~"),
            canonical_query,
            canonical_headers,
            ";".join(signed),
            "UNSIGNED-PAYLOAD",
        ]
    )
    _, date, region, service, terminal = params.get("X-Amz-Credential", "////").split("/", 4)
    scope = "/".join([date, region, service, terminal])
    to_sign = "\n".join(
        [SIGV4_ALGORITHM, params.get("X-Amz-Date", ""), scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = ("AWS4" + secret_key).encode()
    for part in (date, region, service, terminal):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


class S3Refusals:
    """``check(request)`` raises what S3 would answer instead of the object, or returns None.

    ``secrets``: the secret key of each access key whose presigned signatures the emulator can check.
    """

    def __init__(self, account_id: str, secrets: Mapping[str, str] | None = None) -> None:
        self._account_id = account_id
        self._secrets = secrets if secrets is not None else {}  # the emulator's, as roles get their keys

    def check(self, request: ApiRequest) -> None:
        query = parse_qs(request.query)
        if query.get("X-Amz-Algorithm") == [SIGV4_ALGORITHM]:
            self._check_presigned_sigv4(request, query)
        bucket_name, key_name = bucket_and_key(request)
        bucket = s3_backends[self._account_id]["aws"].buckets.get(bucket_name)
        if bucket is not None and not self._signed(request, query):
            raise ApiError("AccessDenied", "Access Denied", 403)
        if request.method not in ("GET", "HEAD") or not is_sigv2(request):
            return
        key = bucket.keys.get(key_name) if bucket is not None and key_name else None
        if getattr(key, "encryption", None) == "aws:kms":
            raise ApiError("InvalidArgument", KMS_NEEDS_SIGV4, 400)

    def _check_credential_region(self, request: ApiRequest, credential: str) -> None:
        """S3 refuses a URL signed for another region than its bucket's (botocore presigns for the client's)."""
        bucket_name, _ = bucket_and_key(request)
        bucket = s3_backends[self._account_id]["aws"].buckets.get(bucket_name)
        parts = credential.split("/")
        signed_region = parts[2] if len(parts) == 5 else ""
        if bucket is not None and signed_region != bucket.region_name:
            raise ApiError(
                "AuthorizationQueryParametersError",
                f"Error parsing the X-Amz-Credential parameter; the region '{signed_region}' is wrong; expecting "
                f"'{bucket.region_name}'",
                400,
            )

    @staticmethod
    def _signed(request: ApiRequest, query: Mapping[str, list[str]]) -> bool:
        return bool(request.headers.get("Authorization")) or "X-Amz-Signature" in query or is_sigv2(request)

    def _check_presigned_sigv4(self, request: ApiRequest, query: Mapping[str, list[str]]) -> None:
        try:
            signed_at = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
            expires = int(query["X-Amz-Expires"][0])
            access_key = query["X-Amz-Credential"][0].split("/", 1)[0]
            signature = query["X-Amz-Signature"][0]
        except (KeyError, IndexError, ValueError):
            raise ApiError(
                "AuthorizationQueryParametersError",
                "Query-string authentication version 4 requires "
                "the X-Amz-Algorithm, X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, "
                "and X-Amz-Expires parameters.",
                400,
            ) from None
        if expires > MAX_PRESIGNED_SECONDS:
            raise ApiError(
                "AuthorizationQueryParametersError",
                f"X-Amz-Expires must be less than a week (in seconds) that is {MAX_PRESIGNED_SECONDS}",
                400,
            )
        self._check_credential_region(request, query["X-Amz-Credential"][0])
        if time.time() > signed_at.timestamp() + expires:
            raise ApiError("AccessDenied", "Request has expired", 403)
        secret = self._secrets.get(access_key)
        if secret is not None and not hmac.compare_digest(presigned_sigv4_signature(request, secret), signature):
            raise ApiError(
                "SignatureDoesNotMatch",
                "The request signature we calculated does not match the signature you provided. Check your key "
                "and signing method.",
                403,
            )
