"""The copy of the config directory a throw-away slurmctld proves a new set on (topokeeper.headnode.proof).

That slurmctld itself runs in tests/integration/slurm (test_applier_on_slurmctld.py, the crash matrix); here:
what its copy holds, so that it touches nothing of the production daemon's.
"""

from __future__ import annotations

import os
from pathlib import Path

from topokeeper.headnode.config_dir import BACKUP_DIR, LOCK_FILE
from topokeeper.headnode.proof import _copy_config, _remove, proof_dir_prefix
from topokeeper.headnode.slurm_conf import SlurmConf
from topokeeper.headnode.steps import Step

PRODUCTION = """\
ClusterName=prod
SlurmctldHost=head-a(10.0.0.1)
SlurmctldHost=head-b(10.0.0.2)
SlurmctldPort=6817
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=/var/log/slurmctld.log
StateSaveLocation=/var/spool/slurmctld
AccountingStorageType=accounting_storage/slurmdbd
SlurmctldPrimaryOnProg=/usr/local/bin/take-the-ip
AuthType=auth/slurm
AuthInfo=use_client_ids
SlurmctldParameters=enable_configless,reconfig_on_restart
SlurmctldSyslogDebug=debug5
DebugFlags=Route,TraceJobs
Include {etc}/partitions.conf
"""


def test_the_copy_holds_the_new_files_and_settings_of_its_own(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(PRODUCTION.format(etc=etc))
    (etc / "partitions.conf").write_text("PartitionName=gpu Nodes=ALL\n")
    (etc / "topology.yaml").write_text("- topology: old\n  flat: true\n")
    (etc / BACKUP_DIR).mkdir()
    (etc / BACKUP_DIR / "journal.json").write_text("{}")
    (etc / LOCK_FILE).write_text("")
    os.mkfifo(etc / "a-fifo")  # never opened: it would block
    like = (etc / "partitions.conf").stat()
    steps = [
        Step("topology.yaml", "topology.yaml", ".topology.yaml.00000000.topokeeper-new", "- topology: new\n", like),
        Step("partitions.conf", "partitions.conf", ".p.topokeeper-new", "PartitionName=gpu Topology=new\n", like),
    ]
    directory = tmp_path / (proof_dir_prefix(str(etc)) + "x")
    directory.mkdir()

    main = _copy_config(SlurmConf(str(etc / "slurm.conf")), steps, str(directory))

    assert main == str(directory / "slurm.conf")
    assert sorted(p.name for p in directory.iterdir()) == ["partitions.conf", "slurm.conf", "state", "topology.yaml"]
    assert (directory / "topology.yaml").read_text() == "- topology: new\n"
    assert (directory / "partitions.conf").read_text() == "PartitionName=gpu Topology=new\n"
    lines = (directory / "slurm.conf").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith("#")]
    assert settings[0] == "ClusterName=prod"
    assert f"Include {directory}/partitions.conf" in settings  # the copy's, not the production file
    for production in ("head-a", "head-b", "6817", "/run/", "/var/", "slurmdbd", "take-the-ip", "reconfig_on_restart"):
        assert not any(production in line for line in settings), production
    assert f"SlurmctldPidFile={directory}/slurmctld.pid" in settings
    assert f"StateSaveLocation={directory}/state" in settings
    assert "AccountingStorageType=accounting_storage/none" in settings
    assert "AuthInfo=use_client_ids,disable_sack" in settings  # the production daemon keeps its SACK socket
    assert "SlurmctldParameters=enable_configless" in settings
    assert sum(line.startswith("SlurmctldHost=") for line in settings) == 1
    assert [line for line in settings if "Syslog" in line or "DebugFlags" in line] == ["SlurmctldSyslogDebug=quiet"]
    assert (etc / "topology.yaml").read_text() == "- topology: old\n  flat: true\n"  # production untouched

    _remove(str(directory))
    assert not directory.exists()


def test_a_production_key_later_on_a_line_is_not_kept(tmp_path: Path) -> None:
    """Slurm parses every Key=value of a line; a production setting after another key on its line must not reach
    the throw-away (SlurmctldPrimaryOnProg would run on this host, a second SlurmctldHost names a peer)."""
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "slurm.conf").write_text(
        "ClusterName=prod SlurmctldPrimaryOnProg=/usr/local/bin/take-the-ip\n"
        "SlurmUser=root SlurmctldHost=head-b(10.0.0.2)\n"
    )
    directory = tmp_path / (proof_dir_prefix(str(etc)) + "x")
    directory.mkdir()

    _copy_config(SlurmConf(str(etc / "slurm.conf")), [], str(directory))

    lines = (directory / "slurm.conf").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith("#")]
    assert not any("take-the-ip" in line or "head-b" in line for line in settings), settings


def test_a_production_setting_in_an_include_outside_the_config_dir_does_not_reach_the_throw_away(
    tmp_path: Path,
) -> None:
    """SlurmConf follows no Include outside its directory, and the copy left such an Include pointing at the
    production file: its SlurmctldPrimaryOnProg (and SlurmctldHost, a list Slurm extends) reached the throw-away."""
    etc, shared = tmp_path / "etc", tmp_path / "shared"
    etc.mkdir()
    shared.mkdir()
    (shared / "controllers.conf").write_text(
        "SlurmctldHost=head-a(10.0.0.1)\nSlurmctldPrimaryOnProg=/usr/local/bin/take-the-ip\n"
    )
    (etc / "slurm.conf").write_text(f"ClusterName=prod\nInclude {shared}/controllers.conf\n")
    directory = tmp_path / (proof_dir_prefix(str(etc)) + "x")
    directory.mkdir()

    _copy_config(SlurmConf(str(etc / "slurm.conf")), [], str(directory))

    lines = (directory / "slurm.conf").read_text().splitlines()
    settings = [line for line in lines if line and not line.startswith("#")]
    assert not any(str(shared) in line for line in settings), settings
