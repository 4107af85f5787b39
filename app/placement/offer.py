"""Was a member's offer all the nodes that could take it, or a part of them? Pure.

kube-scheduler shows an extender only some of the nodes in two cases (v1.36,
``pkg/scheduler/schedule_one.go``):

* **sampling**: it stops filtering once it has found ``numFeasibleNodesToFind`` feasible nodes
  (``percentageOfNodesToScore``; adaptive by default, every node in the chart's configuration) and
  sends those;
* **one node first**: a pod with a nominated node (``status.nominatedNodeName``: written by
  preemption, or by another component) is first tried on that node alone, extenders included; if
  it fails there, the same cycle goes on to the full search, which calls the extender again.
  (Opportunistic batching's node hints take the same path, but a profile with extenders has them
  off: ``computeBatchablePlugins`` in ``framework/runtime/framework.go``.)

A planned node missing from such an offer says nothing about the node: the gang keeps its plan. A
planned node missing from an offer that holds every node kube-scheduler's filters passed did fail
them for this member (a taint, its affinity, a resource the extender does not count): the gang is
replanned without it (docs/gangs.md, "Offers that are a part of the cluster").
"""

from __future__ import annotations

import math

# kube-scheduler's minFeasibleNodesToFind and minFeasibleNodesPercentageToFind.
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5


def num_feasible_nodes_to_find(num_all: int, percentage: int | None = None) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering (``None`` or 0:
    its adaptive default)."""
    if num_all < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all
    pct = percentage
    if pct is None or pct <= 0:
        pct = max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND, 50 - num_all // 125)
    return max(num_all * pct // 100, MIN_FEASIBLE_NODES_TO_FIND)


def partial(offered: int, num_all: int, percentage: int | None) -> bool:
    """Could an offer of ``offered`` nodes, in a cluster of ``num_all``, leave out a node that passes
    kube-scheduler's filters? Yes when it is as long as a sample (kube-scheduler stopped looking),
    or one node of several (a nominated node tried alone). Shorter offers are every node
    that passed."""
    if offered >= num_all:
        return False
    return offered == 1 or offered >= num_feasible_nodes_to_find(num_all, percentage)


def patience(offered: int, num_all: int, percentage: int | None) -> int:
    """How many partial offers in a row may leave out a member's planned node, while the extender
    sees nothing wrong with it, before the gang is replanned without it.

    kube-scheduler starts each search where the last one stopped, so a sample of ``offered`` nodes
    covers the cluster in about ``num_all / offered`` scheduling cycles (of any pods). Four times that
    misses a node that passes kube-scheduler's filters in under 2 % of cases (``(1 - p) ** (4 / p)``
    < e^-4), and ends the wait for one that does not (a filter the extender cannot see). A node tried
    alone is followed by the full search in the same cycle, whose offer settles it: three."""
    if offered < num_feasible_nodes_to_find(num_all, percentage):
        return 3
    return max(3, math.ceil(4 * num_all / max(offered, 1)))
