"""A large gap is swept without ids (MaxResults 100, an instance-type filter) when that costs fewer pages.

botocore's Stubber validates every request against the EC2 model; each page spends one second of the
clock (the 1 call/s bucket).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from botocore.stub import Stubber

from tests.fakes import FakeClock
from tests.unit.adapters.topology_support import stubbed_ec2, topology_item
from topokeeper.adapters.ec2 import InstanceTopologyReader, MemoryNodeFactsCache

CLUSTER = "c"
SWEEP = {"Filters": [{"Name": "instance-type", "Values": ["p5.48xlarge"]}], "MaxResults": 100}


class OneCallPerSecond:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def acquire(self) -> None:
        self.clock.advance(1)


def _ids(start: int, count: int) -> list[str]:
    return [f"i-{n:017x}" for n in range(start, start + count)]


@pytest.fixture
def ec2() -> Iterator[tuple[Any, Stubber]]:
    client = stubbed_ec2()
    with Stubber(client) as stubber:
        yield client, stubber
        stubber.assert_no_pending_responses()


def _reader(client: Any, clock: FakeClock, cache: MemoryNodeFactsCache | None = None) -> InstanceTopologyReader:
    return InstanceTopologyReader(client, cache or MemoryNodeFactsCache(), OneCallPerSecond(clock), clock.now)


def _page(stubber: Stubber, items: list[str], token: str | None, next_token: str | None) -> None:
    response: dict[str, Any] = {"Instances": [topology_item(i) for i in items]}
    if next_token:
        response["NextToken"] = next_token
    stubber.add_response("describe_instance_topology", response, {**SWEEP, **({"NextToken": token} if token else {})})


def test_a_new_cluster_is_swept_in_pages_of_100_and_only_its_instances_are_kept(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    clock, cache = FakeClock(), MemoryNodeFactsCache()
    wanted = _ids(1, 250)
    others = _ids(10_000, 40)  # the account's other p5 instances, in another cluster
    late = wanted[-1]  # launched after the sweep read its page: asked by id
    account = sorted([*wanted[:-1], *others])
    _page(stubber, account[:100], None, "t1")
    _page(stubber, account[100:200], "t1", "t2")
    _page(stubber, account[200:], "t2", None)
    stubber.add_response("describe_instance_topology", {"Instances": [topology_item(late)]}, {"InstanceIds": [late]})
    reader = _reader(client, clock, cache)

    items = reader.read(CLUSTER, wanted, instance_types=dict.fromkeys(wanted, "ml.p5.48xlarge"))

    assert [item["InstanceId"] for item in items] == wanted
    assert reader.calls == 4  # 3 pages of 100 instead of 13 pages of 20
    assert reader.undescribed == [] and reader.not_visible == []
    assert sorted(cache.get_many(CLUSTER, [*wanted, *others])) == wanted


def test_a_small_gap_is_asked_by_ids(ec2: tuple[Any, Stubber]) -> None:
    client, stubber = ec2
    clock, cache = FakeClock(), MemoryNodeFactsCache()
    wanted = _ids(1, 1000)
    cache.put_many(CLUSTER, {i: {**topology_item(i), "topokeeper:launched": ""} for i in wanted[50:]}, clock.now())
    # 50 new of 1,000: 3 pages by ids against at least 10 for the sweep.
    stubber.add_response(
        "describe_instance_topology",
        {"Instances": [topology_item(i) for i in wanted[:20]], "NextToken": "n1"},
        {"InstanceIds": wanted[:50]},
    )
    stubber.add_response(
        "describe_instance_topology",
        {"Instances": [topology_item(i) for i in wanted[20:40]], "NextToken": "n2"},
        {"InstanceIds": wanted[:50], "NextToken": "n1"},
    )
    stubber.add_response(
        "describe_instance_topology",
        {"Instances": [topology_item(i) for i in wanted[40:50]]},
        {"InstanceIds": wanted[:50], "NextToken": "n2"},
    )
    reader = _reader(client, clock, cache)

    items = reader.read(CLUSTER, wanted, instance_types=dict.fromkeys(wanted, "p5.48xlarge"))

    assert len(items) == 1000 and reader.calls == 3


def test_a_sweep_that_would_not_fit_the_time_left_is_not_started(ec2: tuple[Any, Stubber]) -> None:
    """A sweep cut short starts again from its first page next time: one that cannot finish would never
    reach its end, so the gap goes by ids, which resume from the cache."""
    client, stubber = ec2
    clock = FakeClock()
    wanted = _ids(1, 1000)  # a sweep of 10 pages, 4 seconds left: ids, one batch of 100 started in time
    for page in range(5):
        response: dict[str, Any] = {"Instances": [topology_item(i) for i in wanted[page * 20 : page * 20 + 20]]}
        if page < 4:
            response["NextToken"] = f"n{page + 1}"
        expected: dict[str, Any] = {"InstanceIds": wanted[:100], **({"NextToken": f"n{page}"} if page else {})}
        stubber.add_response("describe_instance_topology", response, expected)
    reader = _reader(client, clock)
    reader.deadline = clock.now() + timedelta(seconds=4)

    items = reader.read(CLUSTER, wanted, instance_types=dict.fromkeys(wanted, "p5.48xlarge"))

    assert len(items) == 100 and reader.undescribed == wanted[100:]


def test_a_sweep_over_an_account_full_of_the_type_stops_at_the_id_path_cost(ec2: tuple[Any, Stubber]) -> None:
    """The account holds many more p5 than the cluster: after as many pages as the ids would have cost, the
    rest of the gap goes by ids."""
    client, stubber = ec2
    clock = FakeClock()
    wanted = _ids(1, 100)
    cache = MemoryNodeFactsCache()
    cache.put_many(CLUSTER, {i: {**topology_item(i), "topokeeper:launched": ""} for i in wanted[40:]}, clock.now())
    gap = wanted[:40]  # 2 pages by ids; the sweep counts on 1 page (100 instances) and gets 2
    _page(stubber, [*_ids(20_000, 90), *gap[:10]], None, "t1")
    _page(stubber, _ids(20_090, 100), "t1", "t2")
    stubber.add_response(
        "describe_instance_topology",
        {"Instances": [topology_item(i) for i in gap[10:30]], "NextToken": "n1"},
        {"InstanceIds": gap[10:]},
    )
    stubber.add_response(
        "describe_instance_topology",
        {"Instances": [topology_item(i) for i in gap[30:]]},
        {"InstanceIds": gap[10:], "NextToken": "n1"},
    )
    reader = _reader(client, clock, cache)

    items = reader.read(CLUSTER, wanted, instance_types=dict.fromkeys(wanted, "p5.48xlarge"))

    assert [item["InstanceId"] for item in items] == wanted
    assert reader.calls == 4
