"""S3 refuses a SigV2-signed read of an SSE-KMS object; moto alone would serve it."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import pytest
from botocore.config import Config

from topokeeper.adapters.aws import PRESIGN_CONFIG
from topokeeper.sim.aws.s3 import KMS_DEFAULT_ENCRYPTION, KMS_NEEDS_SIGV4
from topokeeper.sim.aws_emulator import AwsEmulator

SIGV2 = Config(signature_version="s3")


def _get(url: str) -> tuple[int, bytes]:
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
