"""A simulation twin of the AWS APIs topokeeper calls: moto in server mode plus the project's models.

Importing this module changes nothing; an ``AwsEmulator`` applies its moto fixes when it starts and
undoes them when it stops. Needs the ``sim`` extra (``moto[server]``).
"""

from __future__ import annotations

from topokeeper.sim.aws.clock import Clock, ManualClock, RateLimits, SystemClock, TokenBucket
from topokeeper.sim.aws.emulator import ACCOUNT_ID, AwsEmulator
from topokeeper.sim.aws.events import CLOUDTRAIL, HYPERPOD, SSM, EventEmitter
from topokeeper.sim.aws.hyperpod import ClusterNode, HyperPodModel
from topokeeper.sim.aws.network import NetworkLayout, NetworkModel, Placement
from topokeeper.sim.aws.protocol import ApiError
from topokeeper.sim.aws.server import CallCounter
from topokeeper.sim.aws.ssm import CommandInvocationRequest, CommandOutcome, SsmRunCommand

__all__ = [
    "ACCOUNT_ID",
    "CLOUDTRAIL",
    "HYPERPOD",
    "SSM",
    "ApiError",
    "AwsEmulator",
    "CallCounter",
    "Clock",
    "ClusterNode",
    "CommandInvocationRequest",
    "CommandOutcome",
    "EventEmitter",
    "HyperPodModel",
    "ManualClock",
    "NetworkLayout",
    "NetworkModel",
    "Placement",
    "RateLimits",
    "SsmRunCommand",
    "SystemClock",
    "TokenBucket",
]
