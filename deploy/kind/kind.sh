#!/usr/bin/env bash
# llm-placement on kind, for laptops with Docker:
#   deploy/kind/kind.sh up     create the cluster (deploy/kind/cluster.yaml), fake the GPUs, build and
#                              load the image, install the chart              (make kind-up)
#   deploy/kind/kind.sh e2e    apply the examples and check where they landed  (make kind-e2e)
#   deploy/kind/kind.sh down   delete the cluster
# Needs docker, kind and kubectl on PATH; helm from PATH or scripts/build-helm.sh (needs Go).
# NOT exercised in this repository's CI (its Docker refuses privileged containers, docs/install.md): kept correct on paper.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
cluster="${KIND_CLUSTER:-llm-placement}"
image="${LLMP_IMAGE:-llm-placement:dev}"
ns=llm-placement
examples_ns=llm-examples
ctx="kind-$cluster"
kc() { kubectl --context "$ctx" "$@"; }

need() {
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "kind.sh: $tool is required on PATH" >&2; exit 1; }
  done
}

helm_bin() {
  if [[ -n "${HELM:-}" ]]; then echo "$HELM"
  elif command -v helm >/dev/null; then command -v helm
  else "$here/scripts/build-helm.sh"
  fi
}

# kind has no GPUs and no device plugin. Advertise nvidia.com/gpu on every node labelled with a GFD
# gpu.count by patching the node status (how Kubernetes documents advertising an extended resource):
# the scheduler then accounts GPUs as on a real cluster, and kubelet admits the pods (it only checks
# allocatable for resources no device plugin owns).
fake_gpus() {
  local node count
  for node in $(kc get nodes -l nvidia.com/gpu.count -o name); do
    count=$(kc get "$node" -o jsonpath='{.metadata.labels.nvidia\.com/gpu\.count}')
    kc patch "$node" --subresource=status --type=json -p "[
      {\"op\": \"add\", \"path\": \"/status/capacity/nvidia.com~1gpu\", \"value\": \"$count\"},
      {\"op\": \"add\", \"path\": \"/status/allocatable/nvidia.com~1gpu\", \"value\": \"$count\"}]" >/dev/null
    echo "  $node: nvidia.com/gpu=$count"
  done
}

up() {
  need docker kind kubectl
  if ! kind get clusters | grep -qx "$cluster"; then
    kind create cluster --name "$cluster" --config "$here/deploy/kind/cluster.yaml" --wait 180s
  fi
  echo "faking GPUs:"
  fake_gpus
  docker build -t "$image" "$here"
  kind load docker-image "$image" --name "$cluster"
  # kube-scheduler must not be newer than the API server (version-skew policy): run the cluster's own.
  local server
  server=$(kc version -o json | sed -n '/"serverVersion"/,/}/s/.*"gitVersion": *"\([^"]*\)".*/\1/p')
  [[ -n "$server" ]] || { echo "kind.sh: cannot read the server version" >&2; exit 1; }
  "$(helm_bin)" upgrade --install llm-placement "$here/helm/llm-placement" \
    --kube-context "$ctx" --namespace "$ns" --create-namespace \
    --set extender.image.repository="${image%:*}" --set extender.image.tag="${image##*:}" \
    --set extender.image.pullPolicy=Never \
    --set scheduler.image.tag="$server" \
    --wait --timeout 5m
  kc -n "$ns" rollout status deploy/llm-placement --timeout 3m
  echo "llm-placement is up on kind-$cluster (scheduler $server). Next: make kind-e2e"
}

# --- checks --------------------------------------------------------------------------------------

failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok:   $*"; }

# Wait until every pod matching the selector has a node, or time out (and show why not).
wait_bound() {  # selector expected_count timeout_s
  local sel=$1 want=$2 deadline=$((SECONDS + $3)) bound
  while ((SECONDS < deadline)); do
    bound=$(kc -n "$examples_ns" get pods -l "$sel" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | grep -c . || true)
    ((bound >= want)) && return 0
    sleep 3
  done
  return 1
}

node_of() { kc -n "$examples_ns" get pod "$1" -o jsonpath='{.spec.nodeName}'; }
label_of() {  # node label-key; jsonpath needs the dots of the key escaped
  local key=${2//./\\.}
  kc get node "$1" -o jsonpath="{.metadata.labels.$key}"
}
gpus_of() { label_of "$1" nvidia.com/gpu.count; }
pods_of() { kc -n "$examples_ns" get pods -l "$1" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'; }

explain() {
  echo "--- why $1 is where it is (llm-placement explain) ---" >&2
  kc -n "$ns" exec deploy/llm-placement -c extender -- llm-placement explain "$examples_ns/$1" >&2 || true
}

expect_cpu_node() {  # pod
  local node
  node=$(node_of "$1")
  if [[ -z "$node" ]]; then fail "$1 is not bound"; explain "$1"; return; fi
  if [[ -n "$(gpus_of "$node")" ]]; then fail "$1 (CPU-only) landed on GPU node $node"; explain "$1"
  else ok "$1 on CPU/storage node $node"; fi
}

expect_gpu_node() {  # pod min_gpus
  local node
  node=$(node_of "$1")
  if [[ -z "$node" ]]; then fail "$1 is not bound"; explain "$1"; return; fi
  local n
  n=$(gpus_of "$node")
  if [[ -z "$n" || "$n" -lt "$2" ]]; then fail "$1 needs $2 GPUs but landed on $node ($n)"; explain "$1"
  else ok "$1 on $node ($(label_of "$node" nvidia.com/gpu.product))"; fi
}

e2e() {
  need kubectl
  kc -n "$ns" rollout status deploy/llm-placement --timeout 2m
  kc apply -f "$here/deploy/examples/namespace.yaml"
  kc delete -k "$here/deploy/kind/e2e/phase2" --ignore-not-found --wait >/dev/null

  echo "== phase 1: one workload per stage + the five-stage pipeline"
  kc apply -k "$here/deploy/kind/e2e/phase1"
  wait_bound 'job-name in (tokenize-corpus,sft-7b)' 2 180 || true
  wait_bound 'app=chat-8b' 2 180 || true
  sleep 5
  expect_cpu_node "$(pods_of job-name=tokenize-corpus | head -1)"
  expect_cpu_node pipe-data-prep
  expect_cpu_node pipe-quantize
  expect_gpu_node pretrain-7b 8
  expect_gpu_node pipe-pretrain 8
  expect_gpu_node "$(pods_of job-name=sft-7b | head -1)" 4
  expect_gpu_node pipe-align 2
  expect_gpu_node pipe-serve 1
  for p in $(pods_of app=chat-8b); do expect_gpu_node "$p" 1; done
  # The 70B quantisation needs a CPU node with RAM for ~140 GB of weights; a laptop's kind node
  # may not have it. Either it runs on a CPU node or it waits with llm-placement's reason.
  local q
  q=$(pods_of job-name=quantize-70b | head -1)
  if [[ -n "$(node_of "$q")" ]]; then expect_cpu_node "$q"
  elif kc -n "$examples_ns" get events --field-selector "involvedObject.name=$q,reason=FailedScheduling" \
         -o jsonpath='{.items[*].message}' | grep -q .; then ok "$q waits, with a reason in its events"
  else fail "$q neither placed nor explained"; fi

  echo "== phase 2: the 8 x 8-GPU pretraining gang, alone on the H100 nodes"
  kc delete -k "$here/deploy/kind/e2e/phase1" --wait --timeout 3m >/dev/null
  kc apply -k "$here/deploy/kind/e2e/phase2"
  if ! wait_bound 'scheduling.x-k8s.io/pod-group=pretrain-70b' 8 300; then
    fail "the gang is not fully bound after 300 s"
    explain "$(pods_of scheduling.x-k8s.io/pod-group=pretrain-70b | head -1)"
  else
    local nodes spines products
    nodes=$(kc -n "$examples_ns" get pods -l scheduling.x-k8s.io/pod-group=pretrain-70b \
      -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort)
    if [[ $(uniq <<<"$nodes" | wc -l) -eq 8 ]]; then ok "gang: 8 members on 8 distinct nodes"
    else fail "gang members share nodes: $(tr '\n' ' ' <<<"$nodes")"; fi
    spines=$(for n in $nodes; do label_of "$n" fabric.topograph.run/tier-1; echo; done | sort -u | grep -c .)
    if [[ "$spines" -eq 1 ]]; then ok "gang: one tier-1 (spine) domain, as required"
    else fail "gang spans $spines tier-1 domains"; fi
    products=$(for n in $nodes; do label_of "$n" nvidia.com/gpu.product; echo; done | sort -u | tr '\n' ' ')
    if [[ "$products" == "NVIDIA-H100-80GB-HBM3 " ]]; then ok "gang: all on H100 nodes"
    else fail "gang GPU products: $products"; fi
  fi
  kc delete -k "$here/deploy/kind/e2e/phase2" --wait=false >/dev/null

  if ((failures)); then echo "kind e2e: $failures check(s) failed" >&2; exit 1; fi
  echo "kind e2e: all placement checks passed"
}

down() {
  need kind
  kind delete cluster --name "$cluster"
}

case "${1:-}" in
  up) up ;;
  e2e) e2e ;;
  down) down ;;
  *) echo "usage: $0 up|e2e|down" >&2; exit 2 ;;
esac
