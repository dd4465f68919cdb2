"""Scale-out: node agents on many machines, and the router in front of them (docs/cluster.md).

`rollbox serve --ray` runs the router over a Ray cluster (on_ray.py), `--node URL` over fixed node agents
(static.py). Nothing here is loaded by a single-machine `rollbox serve`, and Ray only with `--ray`.
"""
