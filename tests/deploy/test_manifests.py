"""deploy/: rendered manifests without drift, example workloads that speak docs/annotations.md, the kind setup."""

from __future__ import annotations

import filecmp
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.base.workload import ANNOTATION_KEYS

from .conftest import REPO

DEPLOY = REPO / "deploy"
EXAMPLES = DEPLOY / "examples"
KIND = DEPLOY / "kind"
PREFIX = "llm-placement.io/"
# The user-facing contract (docs/annotations.md): the keys the parser reads. tests/unit/
# test_contract_docs.py checks the docs and the README table against the same tuple.
CONTRACT_KEYS = set(ANNOTATION_KEYS)
STAGES = {"data-prep", "pretraining", "alignment", "deployment", "serving"}
STAGE_ALIASES = {"pretrain": "pretraining", "sft": "alignment", "rlhf": "alignment", "dpo": "alignment",
                 "finetune": "alignment", "quantize": "deployment", "package": "deployment",
                 "inference": "serving", "serve": "serving", "eval": "serving"}


# --- rendered manifests -----------------------------------------------------------------------------


def test_committed_manifests_equal_a_fresh_render(helm_bin: Path, tmp_path: Path) -> None:
    env = dict(os.environ, HELM=str(helm_bin), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "render-manifests.sh"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for sub in ("manifests", "scheduler"):
        fresh = sorted(p.name for p in (tmp_path / sub).iterdir())
        committed = sorted(p.name for p in (DEPLOY / sub).iterdir())
        assert fresh == committed, f"deploy/{sub}: files differ; run `make manifests`"
        assert fresh, f"render-manifests.sh wrote nothing into {sub}/"
        _, mismatch, errors = filecmp.cmpfiles(tmp_path / sub, DEPLOY / sub, fresh, shallow=False)
        assert not mismatch and not errors, f"deploy/{sub}/{mismatch or errors} drifted; run `make manifests`"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_raw_manifests_are_complete_installs() -> None:
    main = _docs(DEPLOY / "manifests" / "llm-placement.yaml")
    kinds = [d["kind"] for d in main]
    # Without Helm nobody creates the namespace: it must come first.
    assert kinds[0] == "Namespace" and main[0]["metadata"]["name"] == "llm-placement"
    for kind in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
                 "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"):
        assert kind in kinds, kind
    assert all(d["metadata"].get("namespace") in (None, "llm-placement", "kube-system") for d in main)
    ds = _docs(DEPLOY / "manifests" / "llm-placement-default-scheduler.yaml")
    [dep] = [d for d in ds if d["kind"] == "Deployment"]
    assert [c["name"] for c in dep["spec"]["template"]["spec"]["containers"]] == ["extender"]


def test_scheduler_folder_holds_the_chart_config_and_the_stanza() -> None:
    chart = yaml.safe_load((REPO / "helm/llm-placement/files/scheduler-config.yaml").read_text())
    cfg = yaml.safe_load((DEPLOY / "scheduler" / "scheduler-config.yaml").read_text())
    # The chart's one override here: the verbs over TLS with kube-scheduler's client certificate.
    [ext] = chart["extenders"]
    ext.update(urlPrefix=ext["urlPrefix"].replace("http://", "https://"), enableHTTPS=True,
               tlsConfig={k: f"/etc/kubernetes/llm-placement-tls/{f}"
                          for k, f in (("certFile", "tls.crt"), ("keyFile", "tls.key"), ("caFile", "ca.crt"))})
    assert cfg == chart, "deploy/scheduler/scheduler-config.yaml must be the chart file (lease in kube-system)"
    stanza = yaml.safe_load((DEPLOY / "scheduler" / "extenders-default-scheduler.yaml").read_text())
    [ext] = stanza["extenders"]
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    full = yaml.safe_load((DEPLOY / "scheduler" / "kube-scheduler-config-default-scheduler.yaml").read_text())
    assert full["extenders"] == [ext] and full["percentageOfNodesToScore"] == 100


# --- examples -----------------------------------------------------------------------------------------


def _workloads() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in _docs(path):
            out.append((path, doc))
    return out


def _pod_meta_spec(doc: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    if doc["kind"] == "Pod":
        return doc["metadata"], doc["spec"]
    if doc["kind"] in ("Job", "Deployment", "StatefulSet"):
        t = doc["spec"]["template"]
        return t["metadata"], t["spec"]
    return None


def _pods() -> list[tuple[Path, dict[str, Any], dict[str, Any], dict[str, Any]]]:
    out = []
    for path, doc in _workloads():
        ms = _pod_meta_spec(doc)
        if ms:
            out.append((path, doc, *ms))
    return out


def test_examples_parse_and_use_only_contract_annotation_keys() -> None:
    pods = _pods()
    assert len(pods) >= 10
    for path, doc, meta, spec in pods:
        where = f"{path.relative_to(REPO)}: {doc['kind']} {doc['metadata']['name']}"
        assert spec.get("schedulerName") == "llm-placement", where
        ann = meta.get("annotations") or {}
        ours = {k.removeprefix(PREFIX) for k in ann if k.startswith(PREFIX)}
        assert ours, f"{where} says nothing about itself"
        assert ours <= CONTRACT_KEYS, f"{where} uses keys outside docs/annotations.md: {ours - CONTRACT_KEYS}"
        assert all(isinstance(v, str) for v in ann.values()), f"{where}: annotation values must be strings"
        stage = ann[PREFIX + "stage"]
        assert stage in STAGES or stage in STAGE_ALIASES, f"{where}: stage {stage!r}"
        assert doc["metadata"]["namespace"] == "llm-examples", where


def test_examples_parse_in_the_extender(tmp_path: Path) -> None:
    # The extender's own parser must understand every example: no "invalid annotation" events.
    from app.base.workload import WorkloadError, parse_workload

    for path, doc, meta, spec in _pods():
        pod = {"metadata": {**meta, "name": doc["metadata"]["name"], "namespace": "llm-examples"},
               "spec": spec}
        try:
            w = parse_workload(pod)
        except WorkloadError as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"{path.name} {doc['metadata']['name']}: {exc}")
        assert w.stage is not None, path


def _stage(ann: dict[str, str]) -> str:
    s = ann[PREFIX + "stage"]
    return STAGE_ALIASES.get(s, s)


def _gpus(spec: dict[str, Any]) -> int:
    total = 0
    for c in spec["containers"]:
        res = c.get("resources") or {}
        total += int((res.get("limits") or {}).get("nvidia.com/gpu", (res.get("requests") or {})
                                                   .get("nvidia.com/gpu", 0)))
    return total


def test_one_example_per_stage() -> None:
    stage_files = {p.stem: p for p in (EXAMPLES / "stages").glob("*.yaml") if p.name != "kustomization.yaml"}
    assert set(stage_files) == STAGES
    for stage, path in stage_files.items():
        pods = [ms for d in _docs(path) if (ms := _pod_meta_spec(d))]
        assert len(pods) == 1, path
        meta, spec = pods[0]
        assert _stage(meta["annotations"]) == stage, path
        # CPU-bound stages request no GPU; the GPU stages do.
        assert (_gpus(spec) == 0) == (stage in ("data-prep", "deployment")), path


def test_pretraining_gang_is_eight_by_eight() -> None:
    [job] = [d for d in _docs(EXAMPLES / "gang" / "pretraining-gang.yaml") if d["kind"] == "Job"]
    meta, spec = _pod_meta_spec(job)  # type: ignore[misc]
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 8
    assert _gpus(spec) == 8
    assert meta["labels"]["scheduling.x-k8s.io/pod-group"] == job["metadata"]["name"]
    assert meta["annotations"][PREFIX + "gang-size"] == "8"
    assert _stage(meta["annotations"]) == "pretraining"
    assert meta["annotations"][PREFIX + "topology-required-placement"] == "fabric.topograph.run/tier-1"


def test_pipeline_chains_five_stages_with_depends_on() -> None:
    docs = [d for d in _docs(EXAMPLES / "pipeline" / "pipeline.yaml") if d["kind"] == "Pod"]
    names = [d["metadata"]["name"] for d in docs]
    assert [_stage(d["metadata"]["annotations"]) for d in docs] == [
        "data-prep", "pretraining", "alignment", "deployment", "serving"]
    for prev, d in zip(names, docs[1:], strict=False):
        assert d["metadata"]["annotations"][PREFIX + "depends-on"] == prev, d["metadata"]["name"]
        assert float(d["metadata"]["annotations"][PREFIX + "input-data-gb"]) > 0
    assert PREFIX + "depends-on" not in docs[0]["metadata"]["annotations"]


def _dra_docs() -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for p in sorted((EXAMPLES / "dra").glob("*.yaml"))
            if p.name != "kustomization.yaml" for d in _docs(p)}


def test_dra_example_claims_gpus_the_extender_counts() -> None:
    # The DRA example must be read by the extender as what it says (docs/dra.md): its class selects
    # full GPUs of NVIDIA's driver, and the pod's template claim counts as 4 GPUs for the 70B model.
    from app.base import workload
    from app.dra.index import DRIVER, DraIndex

    docs = _docs(EXAMPLES / "dra" / "serving-70b-dra.yaml")
    by_kind = {d["kind"]: d for d in docs}
    assert {d["apiVersion"] for d in docs if d["kind"] != "Deployment"} == {"resource.k8s.io/v1"}
    dra = DraIndex()
    dra.put_class(by_kind["DeviceClass"])
    cls = dra.device_classes.classes[by_kind["DeviceClass"]["metadata"]["name"]]
    assert (cls.driver, cls.kind) == (DRIVER, "gpu")
    dra.put_template(by_kind["ResourceClaimTemplate"])
    meta, spec = _pod_meta_spec(by_kind["Deployment"])  # type: ignore[misc]
    assert _gpus(spec) == 0, "GPUs come from the claim, not from nvidia.com/gpu"
    claims = {c["name"] for c in spec["resourceClaims"]}
    assert {c["name"] for c in spec["containers"][0]["resources"]["claims"]} <= claims
    pod = {"metadata": {**meta, "name": "chat-70b-dra-0", "namespace": "llm-examples"}, "spec": spec}
    w = workload.parse_workload(pod, claims=dra)
    assert (w.gpus, w.model_params, _stage(meta["annotations"])) == (4, 70e9, "serving")


def test_mig_example_claims_one_40gb_slice() -> None:
    # The MIG example (docs/dra.md, "MIG"): its class selects MIG devices of NVIDIA's driver and the
    # template's profile selector is read, so the pod is fitted to a 3g.40gb slice, not to a GPU.
    from app.base import workload
    from app.dra.index import DRIVER, DraIndex

    by_kind = {d["kind"]: d for d in _docs(EXAMPLES / "dra" / "serving-7b-mig.yaml")}
    dra = DraIndex()
    dra.put_class(by_kind["DeviceClass"])
    cls = dra.device_classes.classes[by_kind["DeviceClass"]["metadata"]["name"]]
    assert (cls.driver, cls.kind) == (DRIVER, "mig")
    dra.put_template(by_kind["ResourceClaimTemplate"])
    meta, spec = _pod_meta_spec(by_kind["Deployment"])  # type: ignore[misc]
    pod = {"metadata": {**meta, "name": "chat-7b-mig-0", "namespace": "llm-examples"}, "spec": spec}
    w = workload.parse_workload(pod, claims=dra)
    assert (w.gpus, w.mig_slices, w.mig_profiles, w.claim_notes) == (0, 1, ("3g.40gb",), ())


def _kustomize(kustomize: Path, path: Path) -> list[dict[str, Any]]:
    proc = subprocess.run([str(kustomize), "build", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_kustomizations_cover_every_example(kustomize_bin: Path) -> None:
    everything = {(d["kind"], d["metadata"]["name"]) for _, d in _workloads()}
    built = {(d["kind"], d["metadata"]["name"]) for d in _kustomize(kustomize_bin, EXAMPLES)}
    assert built == everything


def test_kind_overlays_shrink_requests_but_keep_gpus_and_annotations(kustomize_bin: Path) -> None:
    originals = {(d["kind"], d["metadata"]["name"]): d for _, d in _workloads()}
    seen = set()
    for phase in ("phase1", "phase2"):
        for doc in _kustomize(kustomize_bin, KIND / "e2e" / phase):
            key = (doc["kind"], doc["metadata"]["name"])
            seen.add(key)
            ms = _pod_meta_spec(doc)
            if not ms:
                continue
            meta, spec = ms
            ometa, ospec = _pod_meta_spec(originals[key])  # type: ignore[misc]
            assert spec["containers"][0]["resources"]["requests"] == {"cpu": "10m", "memory": "16Mi"}, key
            assert _gpus(spec) == _gpus(ospec), key
            assert meta.get("annotations") == ometa.get("annotations"), key
    # kind runs no DRA driver, so nothing would publish the GPUs the dra/ example claims; and its
    # default cluster serves no scheduling.k8s.io/v1alpha2 for the workload/ example.
    native = {(d["kind"], d["metadata"]["name"]) for d in _docs(EXAMPLES / "workload" / "finetune-native-gang.yaml")}
    assert seen == {k for k in originals if k[0] != "Namespace" and k not in _dra_docs() and k not in native}


# --- kind ------------------------------------------------------------------------------------------


def test_kind_cluster_has_labelled_fake_gpu_nodes() -> None:
    cfg = yaml.safe_load((KIND / "cluster.yaml").read_text())
    assert (cfg["kind"], cfg["apiVersion"]) == ("Cluster", "kind.x-k8s.io/v1alpha4")
    workers = [n for n in cfg["nodes"] if n["role"] == "worker"]
    gpu = [n["labels"] for n in workers if "nvidia.com/gpu.product" in n.get("labels", {})]
    h100 = [lab for lab in gpu if lab["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"]
    # The gang example needs 8 nodes x 8 GPUs under one spine.
    assert len(h100) >= 8 and all(lab["nvidia.com/gpu.count"] == "8" for lab in h100)
    assert len({lab["fabric.topograph.run/tier-1"] for lab in h100}) == 1
    assert len({lab["fabric.topograph.run/tier-0"] for lab in h100}) >= 2
    assert all(lab.get("feature.node.kubernetes.io/pci-15b3.present") == "true" for lab in h100)
    assert any(n.get("labels", {}).get("llm-placement.io/node-class") in ("cpu", "storage") for n in workers)
    # kubelet may only set labels outside kubernetes.io/k8s.io, except a short allow-list
    # (NodeRestriction); anything else would make `kind create cluster` fail.
    allowed = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")
    for n in workers:
        for key in n.get("labels", {}):
            domain = key.split("/", 1)[0] if "/" in key else ""
            restricted = domain.endswith(("kubernetes.io", "k8s.io"))
            ok = (not restricted or key in allowed
                  or domain.endswith(("node.kubernetes.io", "kubelet.kubernetes.io")))
            assert ok, key
    # The GPU catalog knows every fake product (an unknown product is handled conservatively).
    from app.base.catalog import GpuCatalog

    cat = GpuCatalog.load()
    for lab in gpu:
        assert cat.lookup(lab["nvidia.com/gpu.product"]) is not None, lab["nvidia.com/gpu.product"]


def test_kind_script_is_valid_bash_and_wired_to_the_makefile_targets() -> None:
    script = KIND / "kind.sh"
    assert os.access(script, os.X_OK)
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "up|e2e|down" in usage.stderr
    text = script.read_text()
    for path in re.findall(r'\$here/((?:deploy|helm|scripts)/[\w./-]+)', text):
        assert (REPO / path).exists(), f"kind.sh refers to missing {path}"


def test_native_workload_example_is_one_gang_of_min_count_members() -> None:
    # The Workload API example (docs/gangs.md, native Workload API): the extender must read its pods
    # as one gang named by spec.schedulingGroup, sized by the PodGroup's minCount = the Job's width.
    from app.base.workload import parse_workload
    from app.gang.kube import native_min_counts

    docs = _docs(EXAMPLES / "workload" / "finetune-native-gang.yaml")
    by_kind = {d["kind"]: d for d in docs}
    job, group = by_kind["Job"], by_kind["PodGroup"]
    assert by_kind["Workload"]["spec"]["podGroupTemplates"][0]["schedulingPolicy"] == group["spec"]["schedulingPolicy"]
    meta, spec = _pod_meta_spec(job)  # type: ignore[misc]
    gang = parse_workload({"metadata": {**meta, "name": "finetune-70b-0", "namespace": "llm-examples"},
                           "spec": spec}).gang
    assert gang is not None and gang.native and gang.key == f"llm-examples/{group['metadata']['name']}"
    assert native_min_counts([group]) == {gang.key: job["spec"]["parallelism"]}
