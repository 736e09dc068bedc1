"""Slurm 25.11 built from source: the third real version, laid out as a ParallelCluster head node has it.

No Debian suite packages 25.11 (sid has 26.05, trixie 24.11), and ParallelCluster runs the 25.11 series, so
the project builds it from the tarball in ``../shared/slurm/`` (beside the clone) into a trixie chroot:
``./configure --prefix=/opt/slurm --sysconfdir=/opt/slurm/etc``, ``make -j2``, ``make install``. The chroot
is cached beside the Debian ones under a name holding the tarball's sha256, so it is built once (under a
file lock, so parallel tests wait for one build) and again only when the source changes.

``SlurmController`` drives it as it drives Debian's: it sees Slurm under ``/opt/slurm`` (``slurm_prefix``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from topokeeper.sim.slurm_chroot import (
    OPT_SLURM,
    READY_MARKER,
    HarnessError,
    _run,
    apt_install,
    built_once,
    cache_root,
    can_run,
    debootstrap_into,
)

SOURCE_SERIES = "25.11"
SOURCE_TARBALL = "slurm-25.11.7.tar.gz"
# Where the tarball is when it is not in ../shared/slurm/ beside the clone: a directory holding it.
SOURCE_DIR_ENV = "TOPOKEEPER_SLURM_SOURCE"
BASE_SUITE = "trixie"
# ../shared/slurm/README.md: what the build needs, and python3 for the head-node program; and libjwt-dev, without
# which auth/slurm (the harness's AuthType: no munged to run) is not built, and libhttp-parser-dev, without which
# slurmctld logs "cannot create url_parser context" at every start.
BUILD_PACKAGES = (
    "build-essential",
    "pkg-config",
    "python3",
    "perl",
    "libyaml-dev",
    "libjson-c-dev",
    "libmunge-dev",
    "libssl-dev",
    "zlib1g-dev",
    "liblz4-dev",
    "libreadline-dev",
    "procps",
    "libjwt-dev",
    "libhttp-parser-dev",
)
CONFIGURE = f"./configure --prefix={OPT_SLURM} --sysconfdir={OPT_SLURM}/etc"
_BUILD_DIR = "/usr/src/slurm-build"
# The plugins a head node here needs: a build without one of them is not the build these tests mean.
REQUIRED_PLUGINS = (
    "auth_slurm.so",
    "topology_tree.so",
    "topology_block.so",
    "topology_flat.so",
    "serializer_yaml.so",
    "http_parser_libhttp_parser.so",
)


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[5]


def _clones() -> list[Path]:
    """This clone, the main checkout when this is a git worktree, and the local checkout it was cloned from (each
    one's ``../shared`` is looked for beside it)."""
    clones = [_repo_root()]
    result = subprocess.run(
        ["git", "-C", str(clones[0]), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        capture_output=True,
        text=True,
        check=False,
    )
    common = Path(result.stdout.strip()) if result.returncode == 0 and result.stdout.strip() else None
    if common is not None and common.name == ".git" and common.parent not in clones:
        clones.append(common.parent)
    # A clone of a local checkout (git clone /work/main /tmp/check, as CI makes): the checkout it came from.
    origin = subprocess.run(
        ["git", "-C", str(clones[0]), "config", "--get", "remote.origin.url"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if origin.startswith("/") and Path(origin).is_dir() and Path(origin).resolve() not in clones:
        clones.append(Path(origin).resolve())
    return clones


def source_tarball() -> tuple[Path | None, str]:
    """The 25.11 tarball, or None and why it is not there."""
    configured = os.environ.get(SOURCE_DIR_ENV, "").strip()
    candidates = [Path(configured)] if configured else [clone.parent / "shared" / "slurm" for clone in _clones()]
    for directory in candidates:
        tarball = directory / SOURCE_TARBALL
        if tarball.is_file():
            return tarball, ""
    looked = ", ".join(str(directory / SOURCE_TARBALL) for directory in candidates)
    return None, f"no Slurm {SOURCE_SERIES} source: {looked} does not exist (set {SOURCE_DIR_ENV} to its directory)"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_key(tarball_sha256: str) -> str:
    """What a build is made of: the tarball (by sha256) and the recipe; either changing means a rebuild."""
    recipe = "\n".join([tarball_sha256, BASE_SUITE, CONFIGURE, *BUILD_PACKAGES, *REQUIRED_PLUGINS])
    return hashlib.sha256(recipe.encode()).hexdigest()


def chroot_name(key: str) -> str:
    """The cache entry for a build (see ``build_key``)."""
    return f"{BASE_SUITE}-slurm-{SOURCE_SERIES}-{key[:16]}"


def can_build() -> tuple[bool, str]:
    """Whether this machine can run the 25.11 tier, and if not, why."""
    ok, reason = can_run()
    if not ok:
        return False, reason
    tarball, reason = source_tarball()
    return tarball is not None, reason


def ensure_source_chroot(cache: Path | None = None) -> Path:
    """A ready chroot with Slurm 25.11 in /opt/slurm, building it (about 5 minutes) when it is missing."""
    ok, reason = can_run()
    if not ok:
        raise HarnessError(reason)
    tarball, reason = source_tarball()
    if tarball is None:
        raise HarnessError(reason)
    digest = sha256_of(tarball)

    def build(building: Path) -> None:
        debootstrap_into(BASE_SUITE, building)
        apt_install(building, BUILD_PACKAGES)
        _build_slurm(building, tarball)
        version = _run(["chroot", str(building), f"{OPT_SLURM}/sbin/slurmctld", "-V"]).stdout.strip()
        (building / READY_MARKER).write_text(f"{version}\nsource: {tarball.name} sha256 {digest}\n")

    name = chroot_name(build_key(digest))
    return built_once(cache or cache_root(), name, lambda root: (root / READY_MARKER).exists(), build)


def _build_slurm(root: Path, tarball: Path) -> None:
    """configure, make -j2, make install as ParallelCluster lays Slurm out; then drop what a head node here
    never reads (static libraries, libtool archives, man pages, the build tree) and debug symbols."""
    build = root / _BUILD_DIR.lstrip("/")
    build.mkdir(parents=True)
    _run(["tar", "-xzf", str(tarball), "-C", str(build), "--strip-components=1"])
    script = (
        f"cd {_BUILD_DIR} && {CONFIGURE} > configure.log 2>&1"
        " && make -j2 > make.log 2>&1 && make install > install.log 2>&1"
    )
    result = _run(["chroot", str(root), "sh", "-c", script], timeout=5400, check=False)
    if result.returncode != 0:
        logs = " ".join(str(build / log) for log in ("configure.log", "make.log", "install.log"))
        raise HarnessError(f"building Slurm {SOURCE_SERIES} exited {result.returncode}; see {logs}")
    plugins = root / OPT_SLURM.lstrip("/") / "lib" / "slurm"
    missing = [plugin for plugin in REQUIRED_PLUGINS if not (plugins / plugin).exists()]
    if missing:
        raise HarnessError(f"the Slurm {SOURCE_SERIES} build in {root} lacks {', '.join(missing)} in {plugins}")
    slim = (
        f"find {OPT_SLURM} \\( -name '*.a' -o -name '*.la' \\) -delete && rm -rf {OPT_SLURM}/share"
        f" && find {OPT_SLURM}/bin {OPT_SLURM}/sbin {OPT_SLURM}/lib -type f"
        " -exec sh -c 'for f; do strip --strip-debug \"$f\" 2>/dev/null || true; done' sh {} +"
        f" && rm -rf {_BUILD_DIR} && mkdir -p {OPT_SLURM}/etc && apt-get clean"
    )
    _run(["chroot", str(root), "sh", "-c", slim], timeout=900)
