"""Which nodes the first waiting gang keeps for itself as they free, past the starvation bound.

Without it, a gang needing several whole nodes at once waits while smaller jobs keep taking each
node that frees (measured in BENCHMARKS.md, section 4: 4-node pretraining gangs waited 13x longer
than under Kueue's in-order admission). Once it has waited ``gang_hold_after_seconds``, the first
such gang of the gang queue holds whole nodes of one GPU model, enough for all its members: no
other GPU pod is placed there, the pods already running finish, and the gang is planned on them.
The extender cannot tell whether a small job would finish before the held nodes free (pods carry no
run time), so the held GPUs idle meanwhile: the bound trades GPU-hours for the largest gangs' wait
(docs/gangs.md, "Starvation bound"). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

from app.base.catalog import GpuSpec
from app.gang.instance import GangInstance
from app.gang.problem import Candidate


def nodes_to_hold(inst: GangInstance, gpus: Mapping[str, GpuSpec], long_running: Set[str],
                  fits_when_free: Callable[[str], bool], held: Set[str] = frozenset()) -> dict[str, int]:
    """Node -> its GPUs: whole nodes of one GPU model that hold every pending member once free,
    the fastest model that can and, within it, free nodes first, then the nodes it holds already
    (``held``), then the closest to free. A held node only drains: swapping it for a node with
    more free GPUs but work started since would let the gang wait for that work too, and the hold
    could keep moving onto newer work, unbounded. Nodes running
    pods that do not end on their own (``long_running``: serving) are never held, nor are nodes a
    member could not use even empty (``fits_when_free``). Empty when no model can hold the gang,
    when the nodes it would hold are free and offered already, or when it has members bound."""
    shapes = sorted((s for s in inst.problem.shapes if s.gpus > 0), key=lambda s: -s.gpus)
    if not shapes or inst.bound:
        return {}
    # One GPU model (a lockstep gang runs at its slowest member's speed) and one domain of the
    # gang's required topology, when it has one.
    groups: dict[tuple[str, str], list[Candidate]] = {}
    for c in inst.problem.nodes:
        gpu = gpus.get(c.name)
        if gpu is None or c.total_gpus <= 0 or c.name in long_running:
            continue
        if not (c.shapes is None or c.shapes or c.fixed) and not fits_when_free(c.name):
            continue
        groups.setdefault((gpu.name, c.required or ""), []).append(c)
    speed = {g: max(gpus[c.name].bf16_tflops for c in cs) for g, cs in groups.items()}
    for group in sorted(groups, key=lambda g: (-speed[g], g)):
        need = {s.key: s.count for s in shapes}
        chosen: list[Candidate] = []
        order = sorted(groups[group], key=lambda c: (c.free_gpus < c.total_gpus, c.name not in held,
                                                     -c.free_gpus, c.name))
        for c in order:
            room = c.total_gpus
            for s in shapes:
                take = min(need[s.key], room // s.gpus)
                need[s.key] -= take
                room -= take * s.gpus
            if room < c.total_gpus:
                chosen.append(c)
            if not any(need.values()):
                # Free, offered to the gang and still no plan: something else keeps it out, and
                # holding would only idle the nodes. A held node kube-scheduler did not offer may
                # just be one whose pods' end it has not seen yet: the hold stays.
                if all(c.pristine and (c.shapes is None or c.shapes) for c in chosen):
                    return {}
                return {c.name: c.total_gpus for c in chosen}
    return {}
