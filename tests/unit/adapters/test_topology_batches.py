"""InvalidInstanceID errors that name no id of the batch: the reader halves the batch until it finds them."""

from __future__ import annotations

from datetime import UTC, datetime

from botocore.stub import Stubber

from tests.unit.adapters.topology_support import stubbed_ec2, topology_item
from topokeeper.adapters.ec2 import InstanceTopologyReader, MemoryNodeFactsCache

IDS = [f"i-{n:017x}" for n in range(1, 5)]
UNOWNED = IDS[2]


class Unlimited:
    def acquire(self) -> None:
        return None


def test_an_error_naming_no_id_is_bisected_down_to_the_unowned_instance() -> None:
    ec2 = stubbed_ec2()
    reader = InstanceTopologyReader(ec2, MemoryNodeFactsCache(), Unlimited(), lambda: datetime.now(UTC))
    with Stubber(ec2) as stubber:

        def refuse(batch: list[str]) -> None:
            stubber.add_client_error(
                "describe_instance_topology",
                service_error_code="InvalidInstanceID.NotFound",
                service_message="The instance ID does not exist",
                expected_params={"InstanceIds": batch},
            )

        def answer(batch: list[str]) -> None:
            response = {"Instances": [topology_item(i) for i in batch]}
            stubber.add_response("describe_instance_topology", response, {"InstanceIds": batch})

        refuse(IDS)
        answer(IDS[:2])
        refuse(IDS[2:])
        refuse([UNOWNED])
        answer(IDS[3:])

        items = reader.read("c", IDS)
        stubber.assert_no_pending_responses()

    assert [item["InstanceId"] for item in items] == [IDS[0], IDS[1], IDS[3]]
    assert reader.not_visible == [UNOWNED]
    assert reader.calls == 5  # every call spends the 1/s bucket, refused ones too
