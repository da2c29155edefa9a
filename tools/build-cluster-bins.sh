#!/usr/bin/env bash
# Build the real control-plane binaries from Go modules (Go module proxy only) into a
# version-keyed cache outside the repo. Each component is built only on a cache miss.
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl  <- k8s.io/kubernetes (wrapper module)
#   etcd                                                             <- go.etcd.io/etcd/server/v3 (wrapper module)
#   kwok                                                             <- sigs.k8s.io/kwok/cmd/kwok
#   helm                                                             <- helm.sh/helm/v3/cmd/helm
#   kueue (manager + its CRDs and webhook manifests)                 <- sigs.k8s.io/kueue/cmd/kueue
#   kube-score (static review of rendered objects, tests/unit)       <- github.com/zegl/kube-score/cmd/kube-score
#   gangcrds: the PodGroup CRDs of scheduler-plugins (shipped in sigs.k8s.io/scheduler-plugins) and of
#     Volcano (generated from volcano.sh/apis by controller-gen, as Volcano's own Makefile does: the
#     volcano.sh/volcano module that carries the YAML is not served by the proxy)
#   kedacrds: KEDA's CRDs as its module ships them (github.com/kedacore/keda/v2, config/crd/bases): the
#     ScaledObject in docs/autoscaling.md is applied against them; KEDA itself is not built
# Usage: tools/build-cluster-bins.sh [component...]   (default: all); prints the bin dir on success.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
KWOK_VERSION=${KWOK_VERSION:-v0.8.0}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
KUBE_SCORE_VERSION=${KUBE_SCORE_VERSION:-v1.20.0}
# The scheduler-plugins version Kueue v0.17.0's go.mod requires: the proxy serves it (release tags such
# as v0.35.0 are refused here).
SCHED_PLUGINS_VERSION=${SCHED_PLUGINS_VERSION:-v0.34.1-devel}
VOLCANO_APIS_VERSION=${VOLCANO_APIS_VERSION:-v1.14.0}
CONTROLLER_TOOLS_VERSION=${CONTROLLER_TOOLS_VERSION:-v0.20.0}
KEDA_VERSION=${KEDA_VERSION:-v2.21.0}
CACHE=${ASYNCRL_CACHE:-$HOME/.cache/asyncrl}
export GOFLAGS=-mod=mod CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}

die() { echo "build-cluster-bins: $*" >&2; exit 1; }
command -v go >/dev/null || die "go is not installed (need Go >= 1.26)"
mkdir -p "$CACHE" 2>/dev/null || die "cannot create cache dir $CACHE"
need_room() {  # only on a cache miss: a warm cache needs no room to build
  local avail_kb
  avail_kb=$(df -Pk "$CACHE" | awk 'NR==2{print $4}')
  [ "${avail_kb:-0}" -gt 6000000 ] || die "less than 6 GB free under $CACHE (disk full?): Go build cache needs room"
}

log_dir="$CACHE/logs"; mkdir -p "$log_dir"
run_logged() {  # name cmd... : run quietly, on failure show the last lines and one clear cause
  local name=$1; shift
  if ! "$@" >"$log_dir/$name.log" 2>&1; then
    tail -n 15 "$log_dir/$name.log" >&2
    if grep -qiE 'dial tcp|no such host|proxy.golang.org.*(timeout|refused)|connection refused' "$log_dir/$name.log"; then
      die "$name: Go module proxy unreachable ($(go env GOPROXY)); full log $log_dir/$name.log"
    fi
    if grep -qi 'no space left' "$log_dir/$name.log"; then die "$name: disk full; full log $log_dir/$name.log"; fi
    die "$name failed; full log $log_dir/$name.log"
  fi
}

build_k8s() {
  local bin="$CACHE/k8s-$K8S_VERSION"
  if [ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/kubectl" ]; then return; fi
  need_room
  local src="$CACHE/src/k8s-$K8S_VERSION" staging="v0.${K8S_VERSION#v1.}"
  mkdir -p "$src" "$bin.tmp"
  cd "$src"
  [ -f go.mod ] || go mod init local.invalid/k8sbins >/dev/null 2>&1
  run_logged k8s-download go mod download -json "k8s.io/kubernetes@$K8S_VERSION"
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
  go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
  # The replace block is generated from the real go.mod: every ./staging module -> its published v0.X.Y.
  for m in $(sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/.*|\1|p' "$gomod"); do
    go mod edit -replace="$m=$m@$staging"
  done
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local ldf="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
GO
  run_logged k8s-tidy go mod tidy
  run_logged k8s-build go build -p 2 -trimpath -ldflags "$ldf" -o "$bin.tmp/" k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
  rm -rf "$bin"; mv "$bin.tmp" "$bin"
}

build_etcd() {
  local bin="$CACHE/etcd-$ETCD_VERSION"
  [ -x "$bin/etcd" ] && return
  need_room
  local src="$CACHE/src/etcd-$ETCD_VERSION"; mkdir -p "$src" "$bin"; cd "$src"
  [ -f go.mod ] || go mod init local.invalid/etcdbin >/dev/null 2>&1
  go mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > tools.go
  run_logged etcd-tidy go mod tidy
  run_logged etcd-build go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_kwok() {
  local bin="$CACHE/kwok-$KWOK_VERSION"
  [ -x "$bin/kwok" ] && return
  need_room
  mkdir -p "$bin"
  GOBIN="$bin" run_logged kwok-install go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

build_helm() {
  local bin="$CACHE/helm-$HELM_VERSION"
  [ -x "$bin/helm" ] && return
  need_room
  mkdir -p "$bin"
  GOBIN="$bin" run_logged helm-install go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
}

build_kubescore() {
  local bin="$CACHE/kube-score-$KUBE_SCORE_VERSION"
  [ -x "$bin/kube-score" ] && return
  need_room
  mkdir -p "$bin"
  GOBIN="$bin" run_logged kubescore-install go install -trimpath \
    -ldflags "-s -w -X main.version=${KUBE_SCORE_VERSION#v}" "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION"
}

module_dir() {  # module@version -> its directory in the module cache (downloaded on a miss)
  go mod download -json "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))'
}

build_kueue() {
  local bin="$CACHE/kueue-$KUEUE_VERSION"
  [ -x "$bin/kueue" ] && [ -f "$bin/webhook/manifests.yaml" ] && return
  need_room
  rm -rf "$bin.tmp"; mkdir -p "$bin.tmp" "$CACHE/src/kueue"; cd "$CACHE/src/kueue"
  [ -f go.mod ] || go mod init local.invalid/kueuebin >/dev/null 2>&1
  GOBIN="$bin.tmp" run_logged kueue-install go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  local dir; dir=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION") || die "kueue: module sigs.k8s.io/kueue@$KUEUE_VERSION not downloadable"
  cp -r "$dir/config/components/crd/bases" "$bin.tmp/crd"
  mkdir -p "$bin.tmp/webhook"; cp "$dir/config/components/webhook/manifests.yaml" "$bin.tmp/webhook/"
  chmod -R u+w "$bin.tmp"; rm -rf "$bin"; mv "$bin.tmp" "$bin"
}

build_gangcrds() {
  local out="$CACHE/gang-crds-$SCHED_PLUGINS_VERSION-$VOLCANO_APIS_VERSION"
  [ -f "$out/scheduling.x-k8s.io_podgroups.yaml" ] && [ -f "$out/scheduling.volcano.sh_podgroups.yaml" ] && return
  need_room
  local src="$CACHE/src/gang-crds" gen="$CACHE/controller-gen-$CONTROLLER_TOOLS_VERSION"
  rm -rf "$out.tmp"; mkdir -p "$src" "$out.tmp"; cd "$src"
  [ -f go.mod ] || go mod init local.invalid/gangcrds >/dev/null 2>&1
  local dir; dir=$(module_dir "sigs.k8s.io/scheduler-plugins@$SCHED_PLUGINS_VERSION") \
    || die "gangcrds: module sigs.k8s.io/scheduler-plugins@$SCHED_PLUGINS_VERSION not downloadable"
  cp "$dir/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$out.tmp/"
  [ -x "$gen/controller-gen" ] || GOBIN="$gen" run_logged controller-gen-install \
    go install -trimpath -ldflags "-s -w" "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_TOOLS_VERSION"
  go mod edit -require="volcano.sh/apis@$VOLCANO_APIS_VERSION"
  printf '//go:build tools\n\npackage tools\n\nimport _ "volcano.sh/apis/pkg/apis/scheduling/v1beta1"\n' > tools.go
  run_logged gangcrds-tidy go mod tidy
  run_logged gangcrds-volcano "$gen/controller-gen" crd:crdVersions=v1,generateEmbeddedObjectMeta=true \
    paths=volcano.sh/apis/pkg/apis/scheduling/v1beta1 output:crd:artifacts:config="$out.tmp"
  rm -rf "$out"; mv "$out.tmp" "$out"
}

build_kedacrds() {
  local out="$CACHE/keda-crds-$KEDA_VERSION"
  [ -f "$out/keda.sh_scaledobjects.yaml" ] && return
  mkdir -p "$CACHE/src/keda-crds"; cd "$CACHE/src/keda-crds"
  [ -f go.mod ] || go mod init local.invalid/kedacrds >/dev/null 2>&1
  local dir; dir=$(module_dir "github.com/kedacore/keda/v2@$KEDA_VERSION") \
    || die "kedacrds: module github.com/kedacore/keda/v2@$KEDA_VERSION not downloadable"
  rm -rf "$out.tmp"; mkdir -p "$out.tmp"
  cp "$dir"/config/crd/bases/keda.sh_*.yaml "$out.tmp/"; chmod -R u+w "$out.tmp"
  rm -rf "$out"; mv "$out.tmp" "$out"
}

components=("$@"); [ ${#components[@]} -gt 0 ] || components=(etcd kwok helm kubescore k8s gangcrds kueue kedacrds)
for c in "${components[@]}"; do
  start=$(date +%s)
  ( "build_$c" ) || exit 1
  echo "build-cluster-bins: $c ready ($(( $(date +%s) - start ))s)" >&2
done
