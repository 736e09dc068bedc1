"""The benchmark zips a function's asset as the stack stages it: the same files, picked by CDK's own exclusion."""

from __future__ import annotations

from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk import aws_lambda as lambda_

from bench.lambda_cold_start import asset_files
from infra.constants import FUNCTION_ASSET_EXCLUDE, RUNTIME

pytestmark = pytest.mark.infra


def test_the_bench_keeps_the_files_cdk_stages_for_a_function_asset(tmp_path: Path) -> None:
    # A checkout under a folder the patterns would match, bytecode at two depths, names the patterns must not
    # match (a dot file: CDK's wildcards match no leading dot; a folder whose name only contains ".pyc").
    source = tmp_path / "checkout.pyc" / "functions" / "ingest"
    for name in [
        "handler.py",
        "__pycache__/handler.cpython-314.pyc",
        "pkg/mod.py",
        "pkg/__pycache__/mod.cpython-314.pyc",
        "stray.pyc",
        ".hidden.pyc",
        "data.pyc.d/keep.txt",
    ]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(name)
    app = cdk.App(outdir=str(tmp_path / "cdk.out"))
    stack = cdk.Stack(app, "Assets")
    code = lambda_.Code.from_asset(str(source), exclude=list(FUNCTION_ASSET_EXCLUDE))
    lambda_.Function(stack, "Ingest", runtime=RUNTIME, handler="handler.lambda_handler", code=code)
    app.synth()
    (staged,) = (tmp_path / "cdk.out").glob("asset.*")

    staged_files = sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file())
    assert staged_files == [".hidden.pyc", "data.pyc.d/keep.txt", "handler.py", "pkg/mod.py"]
    assert [p.relative_to(source).as_posix() for p in asset_files(source, FUNCTION_ASSET_EXCLUDE)] == staged_files
