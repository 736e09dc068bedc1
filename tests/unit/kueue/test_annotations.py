"""Kueue's pod-set annotation rules (tas_validation.go ValidateTASPodSetRequest), case by case."""

from __future__ import annotations

import pytest

from topokeeper.kueue.annotations import (
    GROUP_NAME,
    POD_INDEX_OFFSET,
    PREFERRED,
    REQUIRED,
    SLICE_CONSTRAINTS,
    SLICE_REQUIRED,
    SLICE_SIZE,
    UNCONSTRAINED,
    manifest_errors,
    podset_errors,
)

LAYER3 = "topology.k8s.aws/network-node-layer-3"


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {REQUIRED: LAYER3},
        {PREFERRED: LAYER3},
        {UNCONSTRAINED: "true"},
        {REQUIRED: LAYER3, SLICE_REQUIRED: "kubernetes.io/hostname", SLICE_SIZE: "2"},
        {REQUIRED: LAYER3, GROUP_NAME: "leader-workers"},
        {PREFERRED: LAYER3, POD_INDEX_OFFSET: "0"},
        {SLICE_CONSTRAINTS: '[{"topology": "a/b", "size": 8}, {"topology": "a/c", "size": 4}]'},
    ],
)
def test_valid_annotations_pass(annotations: dict[str, str]) -> None:
    assert podset_errors(annotations) == []


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({REQUIRED: LAYER3, PREFERRED: LAYER3}, "must not contain more than one topology annotation"),
        ({PREFERRED: LAYER3, UNCONSTRAINED: "true"}, "must not contain more than one topology annotation"),
        ({REQUIRED: "not a label"}, "name part must be"),
        ({PREFERRED: "Bad_Prefix/layer"}, "prefix must be a DNS subdomain"),
        ({UNCONSTRAINED: "yes"}, "must be a boolean value"),
        ({SLICE_REQUIRED: "kubernetes.io/hostname"}, f"[{SLICE_SIZE}]: must be set when"),
        ({SLICE_SIZE: "2"}, f"[{SLICE_SIZE}]: may not be set when '{SLICE_REQUIRED}' is not specified"),
        ({SLICE_REQUIRED: "kubernetes.io/hostname", SLICE_SIZE: "two"}, "must be a numeric value"),
        ({SLICE_REQUIRED: "kubernetes.io/hostname", SLICE_SIZE: "0"}, "must be greater than or equal to 1"),
        ({REQUIRED: LAYER3, GROUP_NAME: "42"}, "must not be a number"),
        ({GROUP_NAME: "group"}, "may not be set when neither"),
        (
            {REQUIRED: LAYER3, GROUP_NAME: "g", SLICE_REQUIRED: LAYER3, SLICE_SIZE: "1"},
            f"may not be set when '{SLICE_SIZE}'",
        ),
        (
            {REQUIRED: LAYER3, GROUP_NAME: "g", POD_INDEX_OFFSET: "1"},
            f"may not be set when '{GROUP_NAME}' is specified",
        ),
        ({POD_INDEX_OFFSET: "-1"}, "must be a non-negative integer"),
        ({SLICE_CONSTRAINTS: "not json"}, "must be a valid JSON array"),
        ({SLICE_CONSTRAINTS: "[]"}, "between 1 and 3 layers"),
        ({SLICE_CONSTRAINTS: '[{"topology": "a/b", "size": 8}, {"topology": "a/b", "size": 4}]'}, "duplicate a/b"),
        ({SLICE_CONSTRAINTS: '[{"topology": "a/b", "size": 8}, {"topology": "a/c", "size": 3}]'}, "must evenly divide"),
        ({SLICE_CONSTRAINTS: '[{"topology": "a/b", "size": 0}]'}, "must be greater than or equal to 1"),
        (
            {SLICE_CONSTRAINTS: '[{"topology": "a/b", "size": 2}]', SLICE_REQUIRED: "a/b", SLICE_SIZE: "2"},
            f"may not be set when '{SLICE_REQUIRED}' is specified",
        ),
    ],
)
def test_invalid_annotations_are_refused(annotations: dict[str, str], message: str) -> None:
    errors = podset_errors(annotations)
    assert any(message in error for error in errors), errors


def test_manifest_errors_name_the_pod_set() -> None:
    job = {
        "kind": "PyTorchJob",
        "spec": {
            "pytorchReplicaSpecs": {
                "Master": {"template": {"metadata": {"annotations": {REQUIRED: LAYER3}}}},
                "Worker": {"template": {"metadata": {"annotations": {REQUIRED: LAYER3, PREFERRED: LAYER3}}}},
            }
        },
    }
    (error,) = manifest_errors(job)
    assert error.startswith("spec.pytorchReplicaSpecs.Worker.template.metadata.annotations: must not contain")
