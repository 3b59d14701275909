"""The Ray cluster as truthput sees it: joining it, its live nodes, and what each node's GPUs are.

Shared by the run executor (truthput.run.executors.ray_cluster) and the load workers
(truthput.load.cluster). Ray is an optional extra, imported only here and only when asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from truthput.errors import InputError

RAY_MISSING = "--executor ray needs Ray on this machine: pip install 'truthput[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(RAY_MISSING) from None
    return ray


def is_loopback_host(host: str) -> bool:
    """localhost or an address in 127.0.0.0/8 (or ::1)."""
    import ipaddress

    if host == "localhost":
        return True

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect(address: str | None) -> Any:
    """Join the running cluster at `address` ('auto': the one this machine belongs to)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    where = address or "auto"
    kwargs: dict[str, Any] = {}
    host = where.rsplit(":", 1)[0] if ":" in where else ""
    if is_loopback_host(host):
        # a cluster on this host's loopback (127.0.0.2 and the like: Ray maps 127.0.0.1 itself onto
        # the host's outward address): the driver is that node too, at the same address
        kwargs["_node_ip_address"] = host
    if host and where.rsplit(":", 1)[1].isdigit():
        import socket

        try:  # Ray itself retries an absent head for minutes, printing as it goes
            socket.create_connection((host, int(where.rsplit(":", 1)[1])), timeout=5).close()
        except OSError as exc:
            raise InputError(f"--executor ray --address {where}: no Ray cluster there ({exc.strerror or exc}); start "
                            "one with `ray start --head` (and `ray start --address HEAD:6379` on each other "
                            "node)") from None
    try:
        ray.init(address=where, namespace="truthput", log_to_driver=False, logging_level="ERROR",
                 configure_logging=True, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"--executor ray --address {where}: no Ray cluster there ({first}); start one with "
                        "`ray start --head` (and `ray start --address HEAD:6379` on each other node)") from None
    return ray


@dataclass(frozen=True)
class Node:
    node_id: str
    address: str
    gpus: float
    cpus: float
    accelerator: str | None
    """Ray's accelerator_type resource of the node (e.g. "A100"), when it declares one."""
    labels: dict[str, str]
    head: bool
    gpu_type: str = ""
    """What the node's GPUs are: NVML's names there, else Ray's accelerator_type, else 'logical'."""
    driver: str = ""
    hostname: str = ""

    @property
    def hardware_class(self) -> str:
        return f"{self.gpu_type}, driver {self.driver}"

    def describe(self) -> str:
        head = " (head)" if self.head else ""
        return f"{self.address}{head}: {self.gpus:g} GPU(s), {self.hardware_class}"


def nodes_from_ray(ray: Any) -> list[Node]:
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        acc = next((k.split(":", 1)[1] for k in res if k.startswith("accelerator_type:")), None)
        out.append(Node(node_id=n["NodeID"], address=n.get("NodeManagerAddress", "?"), gpus=float(res.get("GPU", 0)),
                        cpus=float(res.get("CPU", 0)), accelerator=acc, labels=dict(n.get("Labels") or {}),
                        head="node:__internal_head__" in res))
    return out


def _node_facts() -> dict[str, Any]:
    """Runs on a node: its host name and what NVML says of its GPUs."""
    import socket

    from truthput.engines.versions import gpu_metadata

    return {"hostname": socket.gethostname(), "gpu": gpu_metadata()}


def cluster_nodes(ray: Any) -> list[Node]:
    """The live nodes, each asked (one small task) what its GPUs and driver are."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = nodes_from_ray(ray)
    probe = ray.remote(num_cpus=0)(_node_facts)
    refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote()
            for n in nodes]
    out = []
    for node, ref in zip(nodes, refs):
        try:
            facts = ray.get(ref, timeout=60)
        except Exception as exc:  # a node that cannot run a task cannot run a start either
            facts = {"hostname": "?", "gpu": {"available": False, "reason": f"probe failed: {exc}"}}
        gpu = facts.get("gpu") or {}
        names = sorted({g.get("name") or "?" for g in gpu.get("gpus", [])}) if gpu.get("available") else []
        gpu_type = " + ".join(names) if names else (node.accelerator or "logical (no NVML)")
        driver = str(gpu.get("driver") or "none") if gpu.get("available") else "none"
        out.append(Node(**{**node.__dict__, "gpu_type": gpu_type, "driver": driver,
                           "hostname": facts.get("hostname", "?")}))
    return out


_REMOTE: dict[type, Any] = {}


def actor_class(ray: Any, cls: type, **options: Any) -> Any:
    """`cls` as a Ray actor class (made once per process: Ray exports each class to the cluster)."""
    if cls not in _REMOTE:
        _REMOTE[cls] = ray.remote(**options)(cls)
    return _REMOTE[cls]


def lost_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """Ray's errors that mean an actor (or its node) is gone, as opposed to an error raised by the
    actor's own code."""
    ex = ray.exceptions
    return tuple(e for e in (getattr(ex, n, None) for n in (
        "RayActorError", "NodeDiedError", "ObjectLostError", "WorkerCrashedError", "LocalRayletDiedError",
        "OwnerDiedError", "ActorUnschedulableError")) if e is not None)
