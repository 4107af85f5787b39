"""CPU per API write, in the writer and in kube-apiserver and etcd: our two client paths, and the
identity and event shape of ours against bench/null_extender.py's.

    python -m bench.api_write_cost [--writes 300] [--rounds 3]

Starts the integration harness's etcd and kube-apiserver (no scheduler, no extender) and POSTs
Events, blocks alternated:

* ``clients``: the same Event through ``app.cluster.rest.JsonRest`` over urllib3 (the official
  client's pool) and over its keep-alive path (one socket write, httptools), one thread, with the
  extender's certificate; CPU of this process per write (``time.process_time``) and of
  kube-apiserver and etcd (``/proc``).
* ``identity``: 4 threads, keep-alive path; the admin's certificate (system:masters, as the null
  extender runs) against the extender's (RBAC), each with the null's event and with ours
  (``generateName``, a Placed-length message, reporting fields); kube-apiserver and etcd CPU per event.

CPU per write in a shared machine's processes moves with the load; alternate and compare ranges.
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from app.cluster.client import api_client
from app.cluster.rest import JsonRest
from bench.scheduler_throughput import cpu_seconds
from kubeharness import ControlPlane, find_binaries

NS = "default"
PATH = f"/api/v1/namespaces/{NS}/events"


def null_event(i: int) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"p-{i}.{uuid.uuid4().hex[:12]}", "namespace": NS},
            "involvedObject": {"kind": "Pod", "namespace": NS, "name": f"p-{i}", "uid": str(uuid.uuid4())},
            "reason": "Placed", "message": f"placed on node-{i}", "type": "Normal",
            "source": {"component": "null-extender"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1}


def our_event(i: int) -> dict[str, Any]:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Event", "metadata": {"generateName": f"p-{i}.", "namespace": NS},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": f"p-{i}", "namespace": NS,
                               "uid": str(uuid.uuid4())},
            "reason": "Placed",
            "message": "llm-placement: placed on bench-00017 (L4, 1 GPU); 12.3 ms/token predicted; "
                       "top terms: packing 0.41, cost 0.22, slo 0.12; kube-scheduler followed our ranking "
                       "(our best node)",
            "type": "Normal", "source": {"component": "llm-placement"},
            "reportingComponent": "llm-placement", "reportingInstance": "llm-placement",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llmp-write-cost-"))
    cp = ControlPlane(workdir, find_binaries(build=True))
    cp.start(extender=False, scheduler=False)
    try:
        assert cp.apiserver is not None and cp.etcd is not None
        api_pid, etcd_pid = cp.apiserver.pid, cp.etcd.pid
        keep = {"admin": JsonRest(api_client(str(cp.admin_kubeconfig))),
                "extender": JsonRest(api_client(str(cp.extender_kubeconfig)))}
        legacy = JsonRest(api_client(str(cp.extender_kubeconfig)))
        legacy.direct = None  # urllib3, as before the keep-alive path
        pool = ThreadPoolExecutor(4)

        def block(label: str, rest: JsonRest, make: Callable[[int], dict[str, Any]], threads: bool) -> None:
            n = args.writes
            a0, e0 = cpu_seconds(api_pid), cpu_seconds(etcd_pid)
            c0, t0 = time.process_time(), time.monotonic()
            if threads:
                list(pool.map(lambda i: rest.request("POST", PATH, make(i)), range(n)))
            else:
                for i in range(n):
                    rest.request("POST", PATH, make(i))
            a1, e1, c1 = cpu_seconds(api_pid), cpu_seconds(etcd_pid), time.process_time()
            wall = time.monotonic() - t0
            print(f"  {label:34s} writer {1e3 * (c1 - c0) / n:.2f} ms, kube-apiserver "
                  f"{1e3 * (a1 - a0) / n:.2f} ms, etcd {1e3 * (e1 - e0) / n:.2f} ms per write; "
                  f"wall {1e3 * wall / n:.2f} ms", flush=True)

        for rest in (legacy, keep["extender"], keep["admin"]):  # connections and caches warm
            for i in range(30):
                rest.request("POST", PATH, null_event(i))
        for r in range(args.rounds):
            print(f"round {r + 1}: clients (one thread, extender's certificate, our event)")
            block("urllib3", legacy, our_event, False)
            block("keep-alive", keep["extender"], our_event, False)
            print(f"round {r + 1}: identity x event shape (4 threads, keep-alive)")
            combos = (("admin", "null's event", null_event), ("extender", "our event", our_event),
                      ("admin", "our event", our_event), ("extender", "null's event", null_event))
            for who, shape, make in combos:
                block(f"{who}, {shape}", keep[who], make, True)
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
