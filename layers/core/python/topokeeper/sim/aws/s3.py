"""What S3 refuses that moto serves: a SigV2-signed read of an SSE-KMS object.

S3 answers ``InvalidArgument`` ("Requests specifying Server Side Encryption with AWS KMS managed keys
require AWS Signature Version 4.") to a GET or HEAD of a KMS-encrypted object signed with SigV2, by
header (``Authorization: AWS key:signature``) or by query (a presigned URL with ``AWSAccessKeyId`` and
``Signature``). botocore presigns with SigV2 in us-east-1 and us-west-2 unless told ``s3v4``, so a
presigned URL for the stack's KMS-encrypted bucket works in moto and fails on AWS; the emulator refuses it.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs

from moto.s3.models import s3_backends

from topokeeper.sim.aws.protocol import ApiError, ApiRequest

KMS_NEEDS_SIGV4 = (
    "Requests specifying Server Side Encryption with AWS KMS managed keys require AWS Signature Version 4."
)
# The stack's bucket encryption (infra/ sets a customer managed key; moto needs no key to exist).
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


class S3Refusals:
    """``check(request)`` raises what S3 would answer instead of the object, or returns None."""

    def __init__(self, account_id: str) -> None:
        self._account_id = account_id

    def check(self, request: ApiRequest) -> None:
        if request.method not in ("GET", "HEAD") or not is_sigv2(request):
            return
        bucket_name, key_name = bucket_and_key(request)
        bucket = s3_backends[self._account_id]["aws"].buckets.get(bucket_name)
        key = bucket.keys.get(key_name) if bucket is not None and key_name else None
        if getattr(key, "encryption", None) == "aws:kms":
            raise ApiError("InvalidArgument", KMS_NEEDS_SIGV4, 400)
