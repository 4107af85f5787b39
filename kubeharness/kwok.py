"""kwok against the harness's kube-apiserver: fake nodes that stay Ready, pods that run and finish.

There are no kubelets in the harness, so a bound pod would stay Pending forever and its resources
would never be freed. kwok (built from its Go module by scripts/build-kwok.sh) plays the kubelet for
the nodes matching a label selector, driven by the Stage objects written here:

* ``pod-run``: a pod bound to a managed node becomes Running and Ready at once;
* ``pod-complete``: a Running pod carrying the annotation ``COMPLETE_AFTER`` (a Go duration such as
  ``"2.5s"``, kwok's own convention) becomes Succeeded that long after it started; kube-scheduler
  drops terminal pods from its cache, so their resources are free for the next pods (pods without
  the annotation run until deleted);
* ``pod-delete``: a deleted pod on a managed node is removed (kwok confirms the deletion a kubelet
  would);
* ``node-initialize``: a managed node created without a Ready condition gets one.

No node heartbeats or leases: nothing in the harness (no kube-controller-manager) would mark a
silent node NotReady, and thousands of heartbeats would only load the 2-core machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from .procs import Component, run_build_script, wait_until
from .schedconfig import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-kwok.sh"
KWOK_LABEL = "kwok.x-k8s.io/node"
KWOK_LABEL_VALUE = "fake"
# kwok's own annotation name for the pod-complete delay (kustomize/stage/pod/general in kwok).
COMPLETE_AFTER = "pod-complete.stage.kwok.x-k8s.io/delay"
KWOK_READY_TIMEOUT = 60.0


class KwokBuildError(RuntimeError):
    """kwok could not be built or found."""


def build_kwok(timeout: float = 3600.0) -> Path:
    """Run scripts/build-kwok.sh (a no-op when cached) and return the binary's path."""
    return run_build_script(BUILD_SCRIPT, cwd=REPO_ROOT, error=KwokBuildError, timeout=timeout)


def kwok_node_labels() -> dict[str, str]:
    """Labels that put a node under the harness's kwok."""
    return {KWOK_LABEL: KWOK_LABEL_VALUE}


def _stage(name: str, kind: str, selector: list[dict[str, Any]], nxt: dict[str, Any],
           delay: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "resourceRef": {"apiGroup": "v1", "kind": kind},
        "selector": {"matchExpressions": selector},
        "next": nxt,
    }
    if delay is not None:
        spec["delay"] = delay
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}

_RUNNING = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Initialized
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
startTime: {{ $now | Quote }}
phase: Running
"""

_SUCCEEDED = """\
{{ $now := Now }}
conditions:
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: PodCompleted
  type: Ready
- lastTransitionTime: {{ $now | Quote }}
  status: "False"
  reason: PodCompleted
  type: ContainersReady
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  restartCount: 0
  started: false
  state:
    terminated:
      exitCode: 0
      finishedAt: {{ $now | Quote }}
      reason: Completed
{{ end }}
phase: Succeeded
"""

_NODE_READY = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
phase: Running
"""


def kwok_config(label_selector: str, pod_stages: bool = True) -> list[dict[str, Any]]:
    """The KwokConfiguration plus the Stage documents (one multi-document YAML file).

    ``pod_stages=False`` keeps only the node stage: the caller plays the pods' kubelet itself (the
    soak, kubeharness/soak.py, which must not race a second writer of pod status).
    """
    options = {
        "manageAllNodes": False,
        "manageNodesWithLabelSelector": label_selector,
        "manageNodesWithAnnotationSelector": "",
        "manageSingleNode": "",
        # Stages come from this file, not from CRDs the harness's apiserver does not have.
        "enableCRDs": [],
        "nodeLeaseDurationSeconds": 0,
        "enableDebuggingHandlers": False,
        "enableProfilingHandler": False,
        "serverAddress": "",
        # Trace bursts bind tens of pods a second; more workers keep Running/Succeeded timely.
        "podPlayStageParallelism": 8,
        # A config file replaces kwok's defaults instead of merging with them: zero would be refused.
        "nodePlayStageParallelism": 2,
        "nodeLeaseParallelism": 1,
        "podsOnNodeSyncParallelism": 2,
    }
    conf = {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration", "options": options}
    stages = [
        _stage(
            "node-initialize",
            "Node",
            [{"key": '.status.conditions.[] | select( .type == "Ready" ) | .status',
              "operator": "NotIn", "values": ["True"]}],
            {"statusTemplate": _NODE_READY},
        ),
        _stage(
            "pod-run",
            "Pod",
            [_NOT_DELETED,
             {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
             {"key": ".status.containerStatuses.[].state.running.startedAt", "operator": "DoesNotExist"}],
            {"statusTemplate": _RUNNING},
            delay={"durationMilliseconds": 0},
        ),
        _stage(
            "pod-complete",
            "Pod",
            [_NOT_DELETED,
             {"key": ".status.phase", "operator": "In", "values": ["Running"]},
             {"key": f'.metadata.annotations["{COMPLETE_AFTER}"]', "operator": "Exists"}],
            {"statusTemplate": _SUCCEEDED},
            delay={"durationMilliseconds": 0,
                   "durationFrom": {"expressionFrom": f'.metadata.annotations["{COMPLETE_AFTER}"]'}},
        ),
        _stage(
            "pod-delete",
            "Pod",
            [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
            {"delete": True},
            delay={"durationMilliseconds": 0},
        ),
    ]
    return [conf, *(stages if pod_stages else stages[:1])]


def complete_after(seconds: float) -> dict[str, str]:
    """The pod annotation that makes kwok finish the pod ``seconds`` after it started running."""
    return {COMPLETE_AFTER: f"{max(0.0, seconds):.3f}s"}


class Kwok:
    """One kwok process managing the nodes that match ``label_selector``.

    ``kwok = Kwok(binary, kubeconfig, workdir); kwok.start(); ...; kwok.stop()``. Its log is
    ``<workdir>/logs/kwok.log`` next to the control plane's.
    """

    def __init__(self, binary: Path, kubeconfig: Path, workdir: Path,
                 label_selector: str = f"{KWOK_LABEL}={KWOK_LABEL_VALUE}", pod_stages: bool = True) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.label_selector = label_selector
        self.pod_stages = pod_stages
        self.config_path = workdir / "kwok.yaml"
        self.component: Component | None = None

    def start(self, timeout: float = KWOK_READY_TIMEOUT) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump_all(kwok_config(self.label_selector, self.pod_stages),
                                                       sort_keys=False))
        argv = [
            str(self.binary),
            f"--kubeconfig={self.kubeconfig}",
            f"--config={self.config_path}",
            f"--manage-nodes-with-label-selector={self.label_selector}",
            "--v=INFO",
        ]
        log = self.workdir / "logs" / "kwok.log"
        # client-go in kwok asks for watch-list streams, which this apiserver refuses (etcd without
        # RequestWatchProgress); every refusal restarted the pod watch with a growing backoff and
        # left pods unseen for up to ~30 s. Plain list+watch delivers events at once.
        env = {**os.environ, "KUBE_FEATURE_WatchListClient": "false"}
        self.component = Component("kwok", argv, log, env=env)
        self.component.start()
        comp = self.component

        # kwok logs "Starting" lines once its informers run; a process that dies on a bad config
        # ends the wait at once with its log attached.
        def started() -> bool:
            comp.check_alive()
            return log.is_file() and "Watch nodes" in log.read_text(errors="replace")

        wait_until(started, timeout, "kwok to start watching nodes", interval=0.2, watch=[comp])

    def alive(self) -> bool:
        return self.component is not None and self.component.alive()

    def check_alive(self) -> None:
        if self.component is not None:
            self.component.check_alive()

    def stop(self) -> None:
        if self.component is not None:
            self.component.stop()

    def tail(self, lines: int = 40) -> str:
        return self.component.tail(lines) if self.component else ""
