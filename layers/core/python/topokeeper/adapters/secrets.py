"""Secrets Manager for the login host identity: create or update a secret under the stack's KMS key,
with a resource policy naming who may read it."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError

from topokeeper.adapters.aws import aws_errors, error_code

# Secrets Manager's limit for a secret value (botocore does not check it).
MAX_SECRET_BYTES = 65536


def readers_only_policy(readers: list[str]) -> dict[str, Any]:
    """Allow ``readers`` to read the value and deny every other principal (admins included)."""
    read = ["secretsmanager:GetSecretValue"]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Readers", "Effect": "Allow", "Principal": {"AWS": readers}, "Action": read, "Resource": "*"},
            {
                "Sid": "NobodyElseReads",
                "Effect": "Deny",
                "Principal": "*",
                "Action": read,
                "Resource": "*",
                "Condition": {"StringNotEquals": {"aws:PrincipalArn": readers}},
            },
        ],
    }


def deny_readers_policy(denied: list[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "NotTheLoginNodes",
                "Effect": "Deny",
                "Principal": {"AWS": denied},
                "Action": "secretsmanager:GetSecretValue",
                "Resource": "*",
            }
        ],
    }


class SecretStore:
    def __init__(self, secretsmanager: Any) -> None:
        self._sm = secretsmanager

    def read(self, name: str) -> str | None:
        try:
            return str(self._sm.get_secret_value(SecretId=name)["SecretString"])
        except ClientError as error:
            if error_code(error) == "ResourceNotFoundException":
                return None
            with aws_errors():
                raise

    def write(self, name: str, value: str, *, kms_key_id: str, policy: dict[str, Any], description: str) -> str:
        """Store ``value`` (a new version when the secret exists) and set its policy; return the secret ARN."""
        if len(value.encode()) > MAX_SECRET_BYTES:
            raise ValueError(f"secret {name}: {len(value.encode())} bytes, over Secrets Manager's {MAX_SECRET_BYTES}")
        with aws_errors():
            try:
                arn = self._sm.create_secret(
                    Name=name, SecretString=value, KmsKeyId=kms_key_id, Description=description
                )["ARN"]
            except ClientError as error:
                if error_code(error) != "ResourceExistsException":
                    raise
                self._sm.update_secret(SecretId=name, KmsKeyId=kms_key_id, Description=description)
                arn = self._sm.put_secret_value(SecretId=name, SecretString=value)["ARN"]
            self._sm.put_resource_policy(SecretId=name, ResourcePolicy=json.dumps(policy), BlockPublicPolicy=True)
        return str(arn)
