"""AWS clients: one place that sets retries, timeouts and the user agent.

botocore's own sessions make the clients: boto3 adds nothing our clients use (its resources and S3 transfer
methods) and importing it costs a Lambda cold start ~20 ms more, s3transfer and concurrent.futures with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import botocore.session
from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConfigParseError,
    ConnectTimeoutError,
    EndpointConnectionError,
    InvalidRegionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    SSOError,
    TokenRetrievalError,
)

from topokeeper.contract.errors import InputError, Permanent, Retryable, TopokeeperError, one_line

# Adaptive retries back off on throttling (DescribeInstanceTopology's bucket is 1 call per second).
CLIENT_CONFIG = Config(
    retries={"mode": "adaptive", "max_attempts": 8},
    connect_timeout=5,
    read_timeout=30,
    user_agent_extra="topokeeper/0.1",
)
# SendCommand is not idempotent (no client token): botocore would send it again after a read timeout, when the
# first may have created a command, and a later attempt's error would then release the claim of a delivery that
# is running. Its client sends once; the SSM channel retries only answers that prove no command was created.
SEND_COMMAND_CONFIG = CLIENT_CONFIG.merge(Config(retries={"mode": "standard", "total_max_attempts": 1}))
# What AWS answers when it refused a request for its rate (botocore's throttling codes): nothing was done.
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "SlowDown",
    }
)
# S3 refuses SigV2 for SSE-KMS objects (the plan bucket is KMS-encrypted), and botocore presigns with SigV2
# on the global endpoint unless told otherwise: SigV4 on the regional virtual-host endpoint.
PRESIGN_CONFIG = CLIENT_CONFIG.merge(
    Config(signature_version="s3v4", s3={"addressing_style": "virtual", "us_east_1_regional_endpoint": "regional"})
)


def client(service: str, region: str | None = None, config: Config = CLIENT_CONFIG) -> Any:
    """A cached client per service, region and config, each from a new session as boto3's ``Session().client``
    makes it (botocore honours AWS_ENDPOINT_URL for emulators). Without ``region``: AWS_REGION, then what
    botocore finds (AWS_DEFAULT_REGION, the profile), the AWS CLI v2's order; botocore alone ignores AWS_REGION."""
    return _client(service, region or os.environ.get("AWS_REGION") or None, config)


def clear_clients() -> None:
    """Forget the cached clients (tests point the next ones at another emulator)."""
    _client.cache_clear()


@cache
def _client(service: str, region: str | None, config: Config) -> Any:
    return botocore.session.get_session().create_client(service, region_name=region, config=config)


def presigning_s3(region: str | None = None) -> Any:
    """The S3 client whose presigned URLs S3 accepts for KMS-encrypted objects (``region``: the bucket's; S3
    refuses a URL signed for another)."""
    return client("s3", region, PRESIGN_CONFIG)


def bucket_region(bucket: str) -> str:
    """The region ``bucket`` lives in (GetBucketLocation answers from any region; no constraint is us-east-1)."""
    with aws_errors():
        location = client("s3").get_bucket_location(Bucket=bucket).get("LocationConstraint")
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, str(location))


# Codes that will fail the same way on every retry (AWS spells access errors several ways).
PERMANENT_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "AuthorizationError",
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "ResourceNotFound",
        "ResourceNotFoundException",
        "NoSuchBucket",
        "NoSuchKey",
        "ValidationException",
        "ValidationError",
        "InvalidParameterValue",
        "InvalidParameterValueException",
        "DisabledException",
        "KMSInvalidStateException",
        "NotFoundException",
        "InvalidKeyUsageException",
        "OptInRequired",
        "Blocked",
        "SignatureDoesNotMatch",
        "MissingAuthenticationToken",
    }
)


def is_permanent(code: str) -> bool:
    """The codes above, and any other access-denied spelling (``*AccessDenied*``, ``Unauthorized*``)."""
    return code in PERMANENT_CODES or "AccessDenied" in code or code.startswith("Unauthorized")


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def translate(error: ClientError) -> TopokeeperError:
    """An AWS error as the package's hierarchy: ``Permanent`` for the codes above, else ``Retryable``."""
    code = error_code(error)
    kind = Permanent if is_permanent(code) else Retryable
    return kind(str(error), code=code or None)


@contextmanager
def aws_errors() -> Iterator[None]:
    """Raise AWS errors from the block as ``Retryable`` / ``Permanent`` (the original is the cause)."""
    try:
        yield
    except ClientError as error:
        raise translate(error) from error


# What an operator can do about the answers a first day brings, by error code: one line instead of a traceback.
_OPERATOR_HINTS = {
    "InvalidInstanceId": "SSM Run Command cannot reach that instance: check the id, that it is running and that "
    "its SSM agent is registered (aws ssm describe-instance-information)",
    "NoSuchBucket": "no such bucket in this account and region: pass the stack's PlanBucket output",
    "ExpiredToken": "the credentials have expired: renew them (aws sso login, or new keys)",
    "ExpiredTokenException": "the credentials have expired: renew them (aws sso login, or new keys)",
    "InvalidClientTokenId": "AWS does not know these credentials: check AWS_PROFILE or the access key",
    "UnrecognizedClientException": "AWS does not know these credentials: check AWS_PROFILE or the access key",
    "SignatureDoesNotMatch": "AWS refused the credentials' signature: check the secret key and the clock",
    "AuthFailure": "AWS refused the credentials: check AWS_PROFILE or the access key",
}
_STACK_MISSING = "deploy the stack first (cdk deploy), or pass --stack-name and --region of a deployed one"


def operator_hint(error: ClientError) -> str:
    """One line for an AWS refusal the operator's CLI met: what AWS said and, where known, what to do."""
    code = error_code(error)
    message = str(error.response.get("Error", {}).get("Message", "")).strip()
    if code == "ValidationError" and message.startswith("Stack with id") and message.endswith("does not exist"):
        hint = _STACK_MISSING
    elif is_permanent(code) and ("AccessDenied" in code or code.startswith("Unauthorized")):
        hint = (
            "these credentials may not do this: the operator CLI reads the stack, the table and the bucket, "
            "and writes only as operator_role_arn (docs/deploy.md)"
        )
    else:
        hint = _OPERATOR_HINTS.get(code, "")
    said = f"{code}: {message}" if message else code
    return one_line(f"{said} ({hint})" if hint else said)


@contextmanager
def aws_setup_errors() -> Iterator[None]:
    """What goes wrong on an operator's machine as one line saying what to do: a missing region or credentials,
    an endpoint out of reach, and AWS refusing a request (raw or translated by an adapter)."""
    try:
        yield
    except NoRegionError as error:
        raise InputError("--region", "no AWS region: pass --region REGION or set AWS_REGION") from error
    except InvalidRegionError as error:
        raise InputError("--region", one_line(f"{error} (a region looks like us-west-2)")) from error
    except ProfileNotFound as error:
        raise InputError("AWS_PROFILE", one_line(f"{error} (aws configure list-profiles lists them)")) from error
    except ConfigParseError as error:
        raise InputError("AWS config", one_line(str(error))) from error
    except (SSOError, TokenRetrievalError) as error:  # no SSO token yet, or an expired one
        raise InputError("credentials", one_line(f"{error}: run aws sso login")) from error
    except (NoCredentialsError, PartialCredentialsError) as error:
        raise InputError(
            "credentials",
            "no AWS credentials found: set AWS_PROFILE (after aws sso login / aws configure) or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ) from error
    except (EndpointConnectionError, ConnectTimeoutError) as error:
        raise InputError("network", one_line(f"cannot reach AWS: {error}")) from error
    except ClientError as error:
        raise InputError(_operation(error), operator_hint(error)) from error
    except TopokeeperError as error:
        cause = error.__cause__
        if isinstance(error, InputError) or not isinstance(cause, ClientError):
            raise
        raise InputError(_operation(cause), operator_hint(cause)) from error


def _operation(error: ClientError) -> str:
    return f"AWS {error.operation_name}" if error.operation_name else "AWS"
