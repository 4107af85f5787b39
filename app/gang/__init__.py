"""Gangs: all-or-nothing, topology-compact placement of multi-pod jobs (DESIGN §5).

Pure planning (no Kubernetes, no HTTP):
  ``problem``   the problem, the lexicographic objective, node classes, pruning, ``assess``;
  ``dp``        exact tree DP of the separable relaxation (warm start and lower bound);
  ``solver``    the OR-Tools CP-SAT model and ``plan`` (DP-certified or CP-SAT search);
  ``greedy``    the Kueue-TAS-like topology best-fit baseline;
  ``ledger``    reservations with TTL;
  ``diagnose``  domains chosen / why a gang cannot be placed, in words;
  ``synth``     synthetic fleets for the benchmark and property tests.
Around the core:
  ``instance``  snapshot + members -> problem;
  ``coordinator`` the placer's GangHook and the service's bind barrier;
  ``persist``   plans as pod annotations, restored at start;
  ``kube``      PodGroup minMember watch and the restore listing (the only Kubernetes client use).
"""
