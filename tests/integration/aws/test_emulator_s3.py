"""S3 refuses a SigV2-signed read of an SSE-KMS object, an unsigned request and a presigned URL that expired or
was changed; moto alone would serve each."""

from __future__ import annotations

import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
from botocore.config import Config

from topokeeper.adapters.aws import PRESIGN_CONFIG
from topokeeper.sim.aws.s3 import KMS_DEFAULT_ENCRYPTION, KMS_NEEDS_SIGV4
from topokeeper.sim.aws_emulator import AwsEmulator

SIGV2 = Config(signature_version="s3")


def _get(url: str | urllib.request.Request) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the emulator's http URL
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _bucket(aws: AwsEmulator, name: str, *, kms: bool) -> Any:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket=name)
    if kms:
        s3.put_bucket_encryption(Bucket=name, ServerSideEncryptionConfiguration=KMS_DEFAULT_ENCRYPTION)
    s3.put_object(Bucket=name, Key="payloads/c/plan.json", Body=b'{"plan": 1}')
    return s3


def _presign(aws: AwsEmulator, bucket: str, config: Config) -> str:
    url: str = aws.client("s3", config=config).generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "payloads/c/plan.json"}, ExpiresIn=60
    )
    return url


def test_a_sigv2_presigned_get_of_a_kms_object_is_refused(aws: AwsEmulator) -> None:
    _bucket(aws, "kms-plans", kms=True)
    url = _presign(aws, "kms-plans", SIGV2)
    assert "Signature=" in url and "X-Amz-Algorithm" not in url

    status, body = _get(url)

    assert status == 400
    assert b"<Code>InvalidArgument</Code>" in body and KMS_NEEDS_SIGV4.encode() in body


def test_a_sigv4_presigned_get_of_the_same_object_is_served(aws: AwsEmulator) -> None:
    _bucket(aws, "kms-plans", kms=True)
    url = _presign(aws, "kms-plans", PRESIGN_CONFIG)
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url
    assert _get(url) == (200, b'{"plan": 1}')


@pytest.mark.parametrize("config", [SIGV2, PRESIGN_CONFIG], ids=["sigv2", "sigv4"])
def test_an_object_without_kms_is_served_either_way(aws: AwsEmulator, config: Config) -> None:
    _bucket(aws, "plain-plans", kms=False)
    assert _get(_presign(aws, "plain-plans", config)) == (200, b'{"plan": 1}')


def test_a_sigv2_signed_client_read_of_a_kms_object_is_refused(aws: AwsEmulator) -> None:
    _bucket(aws, "kms-plans", kms=True)
    s3 = aws.client("s3", config=SIGV2.merge(Config(retries={"total_max_attempts": 1})))
    with pytest.raises(s3.exceptions.ClientError) as raised:
        s3.get_object(Bucket="kms-plans", Key="payloads/c/plan.json")
    assert raised.value.response["Error"]["Code"] == "InvalidArgument"


def _put(url: str, body: bytes) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    return _get(urllib.request.Request(url, data=body, method="PUT", headers=headers))  # noqa: S310 - emulator


def _presign_put(aws: AwsEmulator, bucket: str, key: str, expires: int = 60) -> str:
    url: str = aws.client("s3", config=PRESIGN_CONFIG).generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires
    )
    return url


def _keys(s3: Any, bucket: str) -> list[str]:
    return [item["Key"] for item in s3.list_objects_v2(Bucket=bucket).get("Contents", [])]


def test_a_sigv4_presigned_put_into_a_kms_bucket_is_stored(aws: AwsEmulator) -> None:
    """What the applier does with a document too large for SSM's stdout (a key with a space and a plus, to
    check the canonical request too)."""
    s3 = _bucket(aws, "kms-plans", kms=True)
    status, _ = _put(_presign_put(aws, "kms-plans", "results/c/a b+c.json"), b'{"outcome": "applied"}')
    assert status == 200
    assert s3.get_object(Bucket="kms-plans", Key="results/c/a b+c.json")["Body"].read() == b'{"outcome": "applied"}'


@pytest.mark.parametrize("tamper", ["other key", "longer expiry", "unsigned"])
def test_a_put_that_is_not_presigned_for_it_is_refused_and_writes_nothing(aws: AwsEmulator, tamper: str) -> None:
    """moto alone checks no signature: any of these would write the object."""
    s3 = _bucket(aws, "kms-plans", kms=True)
    url = _presign_put(aws, "kms-plans", "results/c/mine.json")
    if tamper == "other key":
        url = url.replace("results/c/mine.json", "results/c/other.json")
    elif tamper == "longer expiry":
        url = url.replace("X-Amz-Expires=60", "X-Amz-Expires=604800")
    else:
        url = url.split("?", 1)[0]

    status, body = _put(url, b"{}")

    code = b"AccessDenied" if tamper == "unsigned" else b"SignatureDoesNotMatch"
    assert (status, code in body) == (403, True)
    assert _keys(s3, "kms-plans") == ["payloads/c/plan.json"]


def test_an_expired_presigned_url_is_refused(aws: AwsEmulator) -> None:
    """Expiry is wall time, as botocore signs it: a URL signed an hour ago for a minute is refused."""
    s3 = _bucket(aws, "kms-plans", kms=True)
    session = aws.client("s3", config=PRESIGN_CONFIG)
    an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
    # botocore's signer takes the time from botocore.compat.get_current_datetime
    with mock.patch("botocore.auth.get_current_datetime", return_value=an_hour_ago.replace(tzinfo=None)):
        url: str = session.generate_presigned_url(
            "put_object", Params={"Bucket": "kms-plans", "Key": "results/c/late.json"}, ExpiresIn=60
        )
    assert "X-Amz-Date=" + an_hour_ago.strftime("%Y%m%dT%H") in url

    status, body = _put(url, b"{}")

    assert (status, b"Request has expired" in body) == (403, True)
    assert _keys(s3, "kms-plans") == ["payloads/c/plan.json"]


def test_a_url_signed_for_another_region_than_the_buckets_is_refused(aws: AwsEmulator) -> None:
    s3 = aws.client("s3", region_name="us-west-2")
    s3.create_bucket(Bucket="west-plans", CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
    s3.put_object(Bucket="west-plans", Key="payloads/c/plan.json", Body=b"{}")
    params = {"Bucket": "west-plans", "Key": "payloads/c/plan.json"}
    east = aws.client("s3", region_name="us-east-1", config=PRESIGN_CONFIG)
    status, body = _get(east.generate_presigned_url("get_object", Params=params, ExpiresIn=60))
    assert status == 400 and b"AuthorizationQueryParametersError" in body and b"expecting 'us-west-2'" in body
    west = aws.client("s3", region_name="us-west-2", config=PRESIGN_CONFIG)
    assert _get(west.generate_presigned_url("get_object", Params=params, ExpiresIn=60)) == (200, b"{}")


def test_a_url_valid_for_more_than_a_week_is_refused(aws: AwsEmulator) -> None:
    _bucket(aws, "kms-plans", kms=True)
    session = aws.client("s3", config=PRESIGN_CONFIG)
    params = {"Bucket": "kms-plans", "Key": "payloads/c/plan.json"}
    status, body = _get(session.generate_presigned_url("get_object", Params=params, ExpiresIn=7 * 24 * 3600 + 1))
    assert status == 400 and b"must be less than a week" in body
    assert _get(session.generate_presigned_url("get_object", Params=params, ExpiresIn=7 * 24 * 3600))[0] == 200
