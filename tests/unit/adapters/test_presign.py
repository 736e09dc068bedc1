"""Presigned URLs for the plan bucket: SigV4 on the regional virtual-host endpoint, in every region."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import boto3
import pytest

from topokeeper.adapters.aws import CLIENT_CONFIG, PRESIGN_CONFIG

REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "ap-northeast-1"]


def _url(region: str, config: object) -> str:
    session = boto3.session.Session(aws_access_key_id="testing", aws_secret_access_key="testing")  # noqa: S106
    s3 = session.client("s3", region_name=region, config=config)
    url: str = s3.generate_presigned_url("get_object", Params={"Bucket": "plans-bucket", "Key": "payloads/c/p.json"})
    return url


@pytest.mark.parametrize("region", REGIONS)
def test_presigned_urls_are_sigv4_on_the_regional_virtual_host(region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    url = urlsplit(_url(region, PRESIGN_CONFIG))
    query = parse_qs(url.query)
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert f"/{region}/s3/aws4_request" in query["X-Amz-Credential"][0]
    assert url.hostname == f"plans-bucket.s3.{region}.amazonaws.com"


@pytest.mark.parametrize("region", ["us-east-1", "us-west-2"])
def test_the_plain_client_config_would_presign_sigv2(region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Why the channel needs PRESIGN_CONFIG: botocore's default here is SigV2 on the global endpoint."""
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    url = urlsplit(_url(region, CLIENT_CONFIG))
    assert "Signature" in parse_qs(url.query) and "X-Amz-Algorithm" not in parse_qs(url.query)
