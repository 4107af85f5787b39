"""Whole-workflow planning: makespan-optimal placement of a task graph (docs/planner.md).

Module map, one job each:

* ``files``     reading the two input files within their limits (counts checked before parsing);
* ``workflow``  the workflow file (pydantic) and its loading, bundled default included;
* ``estimate``  task durations per node (given, or from the sizing model and the GPU catalog);
* ``problem``   a workflow on a cluster -> PlanProblem (eligibility by the filter's own hard rules,
  durations, costs, transfer seconds per GB from the data-gravity ladder; identical nodes as groups);
* ``schedule``  the schedule type, its checker and the earliest-start rule the list schedulers share;
* ``cpsat``     the exact model (OR-Tools CP-SAT), lexicographic makespan then cost or transfer;
* ``heft``      the HEFT baseline;  ``greedy``  one pod at a time through our own placer;
* ``explain``   critical path and co-locations in words;  ``gantt``  the PNG;
* ``manifest``  the plan as pods carrying the plan (annotations + node affinity);
* ``cluster``   node objects (and link speeds) from a cluster file, strictly checked;
* ``live``      nodes from the API server (the only module here that imports the Kubernetes client);
* ``run``       ties them together for the CLI;  ``report``  the rich table and JSON.
"""
