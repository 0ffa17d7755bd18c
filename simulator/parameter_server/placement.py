"""Which hosts serve and which GPUs work, and how the model's parameter tensors are sharded over the servers.

A server is a whole host of the topology; its shard is striped evenly over the host's GPUs, so that every NIC
of the host carries its share of the pushes and pulls (a multi-NIC server process). Every GPU of the other hosts
is a data-parallel worker holding the whole model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.config.parameter_server import ParameterServerConfig, Sharding
from simulator.errors import ScenarioError
from simulator.topology.graph import Topology


@dataclass(frozen=True)
class Placement:
    """``server_hosts`` in the order given; ``endpoints`` the GPUs that serve, host by host; ``workers`` the GPUs
    that train, in index order."""

    server_hosts: tuple[int, ...]
    endpoints: tuple[int, ...]
    workers: tuple[int, ...]


def place(config: ParameterServerConfig, topology: Topology) -> Placement:
    """The server hosts (a count takes the last hosts) and the workers, checked against the cluster."""
    hosts = topology.num_hosts
    allowed = f"1 to {hosts - 1} server hosts, or a list of host indices 0..{hosts - 1}"
    if hosts < 2:
        raise ScenarioError(f"the cluster has {hosts} host; parameter servers need a server host and a worker host",
                            field="cluster.topology", allowed="a cluster of 2 or more hosts")
    if isinstance(config.servers, int):
        if config.servers < 1:
            raise ScenarioError(f"{config.servers} server hosts: a parameter-server run needs at least one",
                                field="ps.servers", allowed=allowed)
        if config.servers >= hosts:
            more = "more servers than" if config.servers > hosts else "as many servers as"
            raise ScenarioError(f"{config.servers} servers: {more} the cluster's {hosts} hosts, no worker is left",
                                field="ps.servers", allowed=allowed)
        server_hosts = tuple(range(hosts - config.servers, hosts))
    else:
        server_hosts = tuple(config.servers)
        if not server_hosts:
            raise ScenarioError("no server hosts listed", field="ps.servers", allowed=allowed)
        unknown = [host for host in server_hosts if not 0 <= host < hosts]
        if unknown:
            raise ScenarioError(f"host {unknown[0]} does not exist (the cluster has {hosts} hosts)",
                                field="ps.servers", allowed=allowed)
        if len(set(server_hosts)) != len(server_hosts):
            raise ScenarioError("a host is listed twice", field="ps.servers", allowed="distinct host indices")
        if len(server_hosts) >= hosts:
            raise ScenarioError(f"all {hosts} hosts serve, no worker is left", field="ps.servers", allowed=allowed)
    serving = set(server_hosts)
    endpoints = tuple(gpu for host in server_hosts for gpu in topology.host_gpus(host))
    workers = tuple(gpu for gpu in range(topology.num_gpus) if topology.gpu_host[gpu] not in serving)
    return Placement(server_hosts, endpoints, workers)


def worker_gpus(config: ParameterServerConfig, gpus: int, host_gpus: int) -> int | None:
    """How many GPUs `place` makes workers on a cluster of ``gpus`` GPUs, ``host_gpus`` to a host, before it is
    built: those of the hosts that do not serve (None where no worker is left)."""
    servers = config.servers if isinstance(config.servers, int) else len(set(config.servers))
    workers = gpus - servers * host_gpus
    return workers if workers > 0 else None


def shard_tensors(tensors: Sequence[int], servers: int, how: Sharding) -> tuple[int, ...]:
    """Parameters each server holds. ``round_robin``: tensor j goes to server j mod servers, in model order.
    ``by_size``: largest tensor first onto the server holding the fewest parameters so far (ties: the lower
    index), the longest-processing-time rule, which keeps the largest server within 4/3 of the best split."""
    held = [0] * servers
    if how == "round_robin":
        for index, size in enumerate(tensors):
            held[index % servers] += size
        return tuple(held)
    for size in sorted(tensors, reverse=True):
        held[min(range(servers), key=lambda s: (held[s], s))] += size
    return tuple(held)


def stripe(total: int, parts: int) -> tuple[int, ...]:
    """``total`` split into ``parts`` whole numbers differing by at most one (the first ones larger)."""
    base, extra = divmod(total, parts)
    return tuple(base + (1 if index < extra else 0) for index in range(parts))
