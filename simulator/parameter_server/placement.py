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
    """The server hosts (`server_hosts`) and the workers, checked against the cluster."""
    hosts = server_hosts(config, topology.num_hosts)
    serving = set(hosts)
    endpoints = tuple(gpu for host in hosts for gpu in topology.host_gpus(host))
    workers = tuple(gpu for gpu in range(topology.num_gpus) if topology.gpu_host[gpu] not in serving)
    return Placement(hosts, endpoints, workers)


def server_hosts(config: ParameterServerConfig, hosts: int) -> tuple[int, ...]:
    """The hosts that serve on a cluster of ``hosts`` hosts, in the order given (a count takes the last hosts),
    checked: at least one serves, each exists once, and one host at least is left to work."""
    allowed = f"1 to {hosts - 1} server hosts, or a list of host indices 0..{hosts - 1}"
    if hosts < 2:
        raise ScenarioError(f"the cluster has {hosts} host; parameter servers need a server host and a worker host",
                            field="cluster.topology", allowed="a cluster of 2 or more hosts", reads=("cluster",))
    if isinstance(config.servers, int):
        if config.servers < 1:
            raise ScenarioError(f"{config.servers} server hosts: a parameter-server run needs at least one",
                                field="ps.servers", allowed=allowed)
        if config.servers >= hosts:
            more = "more servers than" if config.servers > hosts else "as many servers as"
            raise ScenarioError(f"{config.servers} servers: {more} the cluster's {hosts} hosts, no worker is left",
                                field="ps.servers", allowed=allowed)
        return tuple(range(hosts - config.servers, hosts))
    listed = tuple(config.servers)
    if not listed:
        raise ScenarioError("no server hosts listed", field="ps.servers", allowed=allowed)
    unknown = [host for host in listed if not 0 <= host < hosts]
    if unknown:
        raise ScenarioError(f"host {unknown[0]} does not exist (the cluster has {hosts} hosts)",
                            field="ps.servers", allowed=allowed)
    if len(set(listed)) != len(listed):
        raise ScenarioError("a host is listed twice", field="ps.servers", allowed="distinct host indices")
    if len(listed) >= hosts:
        raise ScenarioError(f"all {hosts} hosts serve, no worker is left", field="ps.servers", allowed=allowed)
    return listed


def worker_gpus(config: ParameterServerConfig, host_gpus: Sequence[int]) -> int:
    """How many GPUs `place` makes workers on a cluster whose hosts hold ``host_gpus`` GPUs each, before it is
    built: those of the hosts that do not serve, with `server_hosts`' checks (its error where it refuses)."""
    serving = set(server_hosts(config, len(host_gpus)))
    return sum(gpus for host, gpus in enumerate(host_gpus) if host not in serving)


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
