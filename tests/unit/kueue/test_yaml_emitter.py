"""The Kueue files' YAML emitter (no PyYAML in the Lambda layer) reads back, through PyYAML, as what was written."""

from __future__ import annotations

from typing import Any

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from topokeeper.kueue.objects import dump_yaml

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.text(max_size=30))
_keys = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["true", "No", "on", "null", "kueue.x-k8s.io/queue-name", "- x", "a: b", "#c", "1"]),
)
_documents = st.recursive(
    _scalars,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=4)),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(_keys, _documents, max_size=5), min_size=1, max_size=3))
def test_every_document_reads_back_as_written(documents: list[dict[str, Any]]) -> None:
    assert list(yaml.safe_load_all(dump_yaml(*documents))) == documents
