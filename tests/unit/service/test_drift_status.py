from topokeeper.contract.config import Mode
from topokeeper.contract.ports import ApplyResult, Outcome
from topokeeper.service.drift import live_status


def _result(outcome: Outcome, grouping: bool | None = None) -> ApplyResult:
    extra = {} if grouping is None else {"grouping_drift": grouping}
    return ApplyResult.model_validate({"outcome": outcome.value, "applier_version": "1.0.0", "mode": "verify", **extra})


def test_naming_only_drift_is_not_drift_in_verify_mode() -> None:
    """HyperPod names its topologies, switches and blocks its own way: verify mode must not cry wolf."""
    assert live_status(_result(Outcome.DRIFT, grouping=False), Mode.VERIFY) == "in_sync"
    assert live_status(_result(Outcome.DRIFT, grouping=True), Mode.VERIFY) == "drift"
    # A document that does not say (an agent's summary of an older applier) is drift, not silence.
    assert live_status(_result(Outcome.DRIFT), Mode.VERIFY) == "drift"


def test_in_enforce_mode_the_files_are_ours_names_included() -> None:
    assert live_status(_result(Outcome.DRIFT, grouping=False), Mode.ENFORCE) == "drift"


def test_no_document_means_unknown() -> None:
    assert live_status(_result(Outcome.TIMED_OUT), Mode.ENFORCE) == "unknown"
    assert live_status(_result(Outcome.IN_SYNC), Mode.VERIFY) == "in_sync"
