"""Ray as the cluster engine: a node agent on every Ray node that offers the `rollbox` resource, as a detached
actor pinned to that node (hard node affinity) that Ray restarts when it dies; the nodes as Ray lists them; and
Ray's autoscaler asked for nodes when the warm pools need them.

A Ray node says how it wants to be run by its labels (`ray start --labels`): its node name (`rollbox.io/node`,
else the end of its Ray node id), its data directory (`rollbox.io/data-dir`, else the router's
`--node-data-dir`, where `{node}` stands for the node's name) and how many sandboxes it holds
(`rollbox.io/max-sandboxes`, else the router's `--max-sandboxes`). A node that leaves and comes back on the same
data directory finds there the sandboxes whose claims were declared lost, and deletes them; with a name of its
own (the label), calls on those sandboxes answer node_lost until it is back, then not found.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import ray
from ray.autoscaler.sdk import request_resources
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rollbox._logs import throttled
from rollbox.cluster.agent import NodeAgent
from rollbox.cluster.view import Member
from rollbox.server.listen import listen_tcp

log = logging.getLogger("rollbox.cluster")

RESOURCE = "rollbox"
NAMESPACE = "rollbox"
NAME_LABEL = "rollbox.io/node"
DATA_DIR_LABEL = "rollbox.io/data-dir"
CAPACITY_LABEL = "rollbox.io/max-sandboxes"
FIRST_ANSWER = 0.2
"""Seconds a look waits for an agent's address when it first asks; later looks only check for the answer."""
DEFAULT_NAME = 12
"""Characters of the Ray node id (its end) that name a node without a name label."""
STARTUP_TIMEOUT = 120.0
"""Seconds a node agent may take to adopt what its data directory holds and start serving."""


class NodeAgentActor:
    """A node agent inside a Ray actor's process: if the agent dies, so does the process, and Ray restarts it."""

    def __init__(self, name: str, data_dir: str, secret: str, max_sandboxes: int, host: str,
                 incarnation: str) -> None:
        self.agent = NodeAgent(data_dir, name, secret, max_sandboxes=max_sandboxes, incarnation=incarnation)
        listener = listen_tcp(host, 0)
        self._url = f"http://{host}:{listener.getsockname()[1]}"
        serving = threading.Thread(target=self._run, args=(listener,), name="rollbox-node-agent", daemon=True)
        serving.start()
        if not self.agent.serving.wait(STARTUP_TIMEOUT):
            os._exit(1)

    def _run(self, listener: Any) -> None:
        try:
            with listener:
                self.agent.run(listener)
        finally:
            os._exit(1)  # an agent that stopped serving takes its actor with it, for Ray to restart

    def address(self) -> str:
        return self._url


class RayMembers:
    """The Ray cluster's rollbox nodes, each with its node agent actor (started here when missing)."""

    scales = True

    def __init__(self, address: str | None, secret: str, *, data_dir: str, node_capacity: int) -> None:
        ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
        self.secret = secret
        self.data_dir = data_dir
        self.node_capacity = node_capacity
        self._actors: dict[str, Any] = {}
        self._urls: dict[str, str] = {}
        self._asking: dict[str, Any] = {}
        self._released: set[str] = set()
        """Ray node ids of empty nodes whose agents were stopped for the autoscaler to take them back."""
        self._names: dict[str, str] = {}
        """Ray node id to node name, for every rollbox node seen (dead ones keep theirs)."""

    def poll(self, stale: set[str]) -> list[Member]:
        members = []
        for node in ray.nodes():
            node_id, labels = node["NodeID"], node.get("Labels") or {}
            if node_id in self._released:
                continue
            if node["Alive"] and node["Resources"].get(RESOURCE):
                name = self._names.setdefault(node_id, labels.get(NAME_LABEL) or node_id[-DEFAULT_NAME:])
                if name in stale:
                    self._urls.pop(node_id, None)
                members.append(Member(self._url(node, name), name, True, node_id))
            elif not node["Alive"] and (node_id in self._names or NAME_LABEL in labels):
                name = self._names.setdefault(node_id, labels.get(NAME_LABEL) or node_id[-DEFAULT_NAME:])
                members.append(Member(None, name, False, node_id))
                self._forget(node_id)
        return members

    def _url(self, node: dict[str, Any], name: str) -> str | None:
        """The node agent's URL once its actor says it serves; asked without waiting, answered on a later poll."""
        node_id = node["NodeID"]
        if node_id in self._urls:
            return self._urls[node_id]
        asking = self._asking.get(node_id)
        if asking is None:
            asking = self._asking[node_id] = self._actor(node, name).address.remote()
            timeout = FIRST_ANSWER  # a running agent answers at once
        else:
            timeout = 0
        ready, _ = ray.wait([asking], timeout=timeout)
        if not ready:
            return None
        del self._asking[node_id]
        try:
            self._urls[node_id] = ray.get(asking)
        except Exception as error:  # the actor is restarting, or failed to start: ask again next time
            throttled(log, logging.WARNING, "node %s: its agent did not answer: %s", name, error)
            return None
        return self._urls[node_id]

    def _actor(self, node: dict[str, Any], name: str) -> Any:
        node_id, labels = node["NodeID"], node.get("Labels") or {}
        actor = self._actors.get(node_id)
        if actor is None:
            options = {"name": f"rollbox-node-{node_id}", "namespace": NAMESPACE, "lifetime": "detached",
                       "get_if_exists": True, "max_restarts": -1, "num_cpus": 0, "max_concurrency": 4,
                       "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}
            capacity = int(labels.get(CAPACITY_LABEL, self.node_capacity))
            data_dir = labels.get(DATA_DIR_LABEL) or self.data_dir.replace("{node}", name)
            actor = self._actors[node_id] = ray.remote(NodeAgentActor).options(**options).remote(
                name, data_dir, self.secret, capacity, node["NodeManagerAddress"], node_id)
        return actor

    def _forget(self, node_id: str) -> None:
        self._actors.pop(node_id, None)
        self._urls.pop(node_id, None)
        self._asking.pop(node_id, None)

    def want_nodes(self, count: int) -> None:
        missing = count - len(self._actors)
        if missing > 0:  # said only when nodes are really missing: a request for as many as run is routine
            log.warning("warm pools need %d rollbox nodes, %d more than run: asking Ray's autoscaler for them",
                        count, missing)
        else:
            log.info("warm pools need %d rollbox nodes: the autoscaler's request follows", count)
        if count > len(self._actors):
            self._released.clear()  # nodes not taken back yet serve again
        request_resources(bundles=[{RESOURCE: 1}] * count)

    def release(self, name: str) -> None:
        for node_id, known in self._names.items():
            actor = self._actors.get(node_id)
            if known == name and actor is not None:
                ray.kill(actor, no_restart=True)
                self._released.add(node_id)
                self._forget(node_id)

    def close(self) -> None:
        """The node agents stay: they outlive routers."""
        ray.shutdown()
