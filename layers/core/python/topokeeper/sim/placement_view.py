"""Where the story's jobs landed: the jobs a ``submit`` step gives the real slurmctld, and after each step the
placement figures (``topokeeper.domain.placement``, docs/placement.md) from the head-node program's
``placement-facts``, as the drift check reads them. The timeline gets a line per job (where it landed: leaves
or blocks spanned against the fewest its size needs, or why it waits) and a table when the largest job a leaf
or block can start changes; the step's result keeps the figures for the report.

The file-only head node has no slurmctld: nothing takes the jobs and nothing places them, so the timeline says
so once and the steps have no figures (a stand-in answer here would be a made-up Slurm answer).

How long a job has waited (``pending_seconds``, ``topology_pending_seconds``) is slurmctld's own clock, not the
simulated time: the story's minutes pass in seconds there.

Job names are the cluster user's text: they reach sbatch as one argv element and are never asked back from
Slurm (the facts carry ids only); the names shown are the scenario's, escaped by the report like any text.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from topokeeper.domain import placement
from topokeeper.render.narrate import columns
from topokeeper.sim.head_node import ChrootHeadNode

if TYPE_CHECKING:
    from topokeeper.sim.scenario import JobRequest
    from topokeeper.sim.world import World

MAX_LISTED = 200  # leaf or block names (and a job's leaves) kept per row; the counts stay exact
NO_SLURMCTLD = "no slurmctld on the file-only head node: no jobs submitted, no placement figures"


def options(job: JobRequest) -> list[str]:
    """sbatch's topology options for a request."""
    return [f"--switches={job.switches}"] * bool(job.switches) + [f"--segment={job.segment}"] * bool(job.segment)


def _by_free(units: Sequence[placement.Unit]) -> list[dict[str, Any]]:
    """Leaves or blocks grouped by their free nodes (most first): a row per count, not per unit."""
    groups: dict[int, list[placement.Unit]] = {}
    for unit in units:
        groups.setdefault(unit.free, []).append(unit)
    return [
        {
            "free": free,
            "units": len(members),
            "nodes": sum(unit.size for unit in members),
            "names": [unit.name for unit in members[:MAX_LISTED]],
        }
        for free, members in sorted(groups.items(), reverse=True)
    ]


def _job(facts: placement.Facts, job_id: str, name: str) -> dict[str, Any]:
    document: dict[str, Any] = placement.job_document(facts, job_id)
    placed = document.get("placed", [])
    document.update(name=name, placed=placed[:MAX_LISTED], placed_count=len(placed))
    return document


def view(facts: placement.Facts, names: Mapping[str, str], partitions: Collection[str]) -> dict[str, Any]:
    """The figures of ``partitions`` (leaves and blocks by free nodes) and the named jobs slurmctld still holds."""
    documents = []
    for figure in placement.figures(facts):
        if figure.partition not in partitions:  # the head node's own (the chroot's ``dev``: every node)
            continue
        document = placement.partition_document(figure)
        where = list(figure.largest_units)
        document.update(largest_in=where[:MAX_LISTED], largest_in_count=len(where), by_free=_by_free(figure.units))
        documents.append(document)
    held = {job.job_id for job in facts.jobs}
    jobs = [_job(facts, job_id, name) for job_id, name in names.items() if job_id in held]
    kinds = {item["partition"]: item["kind"] for item in documents}
    for job in jobs:
        job["kind"] = kinds.get(job["partition"])
    return {"partitions": documents, "jobs": jobs}


def _units(kind: str | None, count: int) -> str:
    noun = "block" if kind == "block" else "leaf"
    return f"{count} {noun if count == 1 else noun + 's' if kind == 'block' else 'leaves'}"


def job_line(job: Mapping[str, Any]) -> str:
    """One timeline line: the job, what it asked, and where it landed or why it waits."""
    asked = "".join(f" --{key}={job[key]}" for key in ("switches", "segment") if job[key])
    head = f"job {job['job']} '{job['name']}' {job['partition']} {job['nodes']} nodes{asked}"
    if job["state"] == "PENDING":
        why = ""
        if job["on_topology"]:
            why = "; on topology: the partition has the nodes, but not in the leaves or blocks asked for"
        elif job["largest_placeable"] >= job["nodes"]:
            why = "; fits one leaf or block now: waits for slurmctld's next scheduling pass"
        return f"{head}: pending ({job['reason']}){why}"
    units = ",".join(place["unit"] or "-" for place in job["placed"])
    more = f",+{job['placed_count'] - len(job['placed'])}" if job["placed_count"] > len(job["placed"]) else ""
    spans = f"{_units(job['kind'], job['spans'])}, the fewest its size needs {job['fewest']}"
    beyond = ": spread beyond need" if job["beyond_need"] else ""
    return f"{head}: {job['state'].lower()} on {spans}{beyond} ({units}{more})"


def figures_text(document: Mapping[str, Any], before: Mapping[str, int]) -> str:
    """The largest job each partition can start in one leaf or block now (with what it was), and a table of
    its leaves or blocks by free nodes."""
    now = {item["partition"]: item["largest_placeable"] for item in document["partitions"] if item["kind"]}
    changes = ", ".join(
        f"{name} {largest}" + (f" (was {before[name]})" if name in before and before[name] != largest else "")
        for name, largest in now.items()
    )
    rows = [["PARTITION", "KIND", "LARGEST", "FREE", "PENDING-TOPO", "LEAVES/BLOCKS BY FREE NODES (free:count)"]]
    for item in document["partitions"]:
        groups = " ".join(f"{group['free']}:{group['units']}" for group in item["by_free"][:12])
        more = f" +{len(item['by_free']) - 12} more" if len(item["by_free"]) > 12 else ""
        # A flat partition has no leaf or block to start a job in, and its free nodes are counted in none.
        figures = [str(item["largest_placeable"]), str(item["free"])] if item["kind"] else ["-", "-"]
        row = [item["partition"], item["kind"] or "flat", *figures]
        rows.append([*row, str(item["pending_on_topology"]), (groups + more) or "-"])
    return "\n".join([f"largest job one leaf or block starts now: {changes}", *columns(rows)])


class StoryJobs:
    """The jobs a story submitted and the placement it last showed."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.names: dict[str, str] = {}  # job id -> the name it was submitted with, in submit order
        self._largest: dict[str, int] = {}
        self._lines: dict[str, str] = {}  # job id -> the line the timeline last showed

    def submit(self, jobs: Iterable[JobRequest]) -> None:
        head = self.world.head
        if not isinstance(head, ChrootHeadNode):
            self.world.note("jobs", NO_SLURMCTLD)
            return
        jobs = list(jobs)
        submitted = [head.submit_job(job.partition, job.nodes, job.name, options(job)) for job in jobs]
        self.names.update(zip(submitted, (job.name for job in jobs), strict=True))
        for job_id in submitted:  # one scheduler pass takes them in submit order (priority/basic)
            head.scheduled(job_id)

    def observe(self) -> dict[str, Any] | None:
        """After a step: the placement now (None before any job or without slurmctld), and timeline lines for
        what changed since the last step."""
        head = self.world.head
        if not self.names or not isinstance(head, ChrootHeadNode):
            return None
        facts = placement.facts_from_compact(head.placement_facts(), "the head node's placement-facts")
        document = view(facts, self.names, head.partitions)
        for job in document["jobs"]:
            line = job_line(job)
            if self._lines.get(job["job"]) != line:
                self._lines[job["job"]] = line
                self.world.note("jobs", line)
        held = {job["job"] for job in document["jobs"]}
        for job_id in [job_id for job_id in self._lines if job_id not in held]:
            del self._lines[job_id]
            self.world.note("jobs", f"job {job_id} '{self.names[job_id]}': ended (no longer in squeue)")
        largest = {item["partition"]: item["largest_placeable"] for item in document["partitions"]}
        if largest != self._largest:
            self.world.note("placement", figures_text(document, self._largest))
            self._largest = largest
        return document
