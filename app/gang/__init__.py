"""Gangs: all-or-nothing, topology-compact placement of multi-pod jobs (docs/gangs.md).

Pure planning (no Kubernetes, no HTTP):
  ``problem``   the problem, the lexicographic objective, node classes, pruning, ``assess``;
  ``dp``        exact tree DP of the separable relaxation (warm start and lower bound);
  ``solver``    the OR-Tools CP-SAT model and ``plan`` (DP-certified or CP-SAT search);
  ``greedy``    the Kueue-TAS-like topology best-fit baseline;
  ``ledger``    reservations with TTL;
  ``diagnose``  domains chosen / why a gang cannot be placed, in words;
Around the core (each part handed what it needs; nothing here imports the service layer):
  ``instance``    snapshot + members -> problem, and the capacity re-check of a finished plan;
  ``book``        the gang table: per-gang state and the ledger (one owner);
  ``planning``    brief under the lock, solve without it, validate and commit; admission order;
  ``barrier``     the all-or-nothing bind barrier (asyncio), given one bind callable;
  ``regroup``     park members after an incomplete bind, wake them together (timers);
  ``lifecycle``   sweep (bound, deleted, complete, expired) and restore after a restart;
  ``report``      events and the metrics protocol;
  ``coordinator`` the thin facade: the placer's GangHook and the service's gang binder;
  ``persist``     plans as pod annotations, restored at start;
  ``kube``        PodGroup minMember watch and the restore listing (the only Kubernetes client use).
"""
