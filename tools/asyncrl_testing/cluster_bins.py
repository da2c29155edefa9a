"""Where the test control plane's binaries and kwok stages live.

Called by `cluster` (to start the components) and by tests that run `kubectl` or `helm`.
The cache layout and version keys match tools/build-cluster-bins.sh: `$ASYNCRL_CACHE` (default
~/.cache/asyncrl) holds `k8s-<v>/`, `etcd-<v>/`, `kwok-<v>/`, `helm-<v>/`, each built only on a miss,
and `kube-score-<v>/` (the static review of tests/unit/test_review.py; no cluster needs it).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess

K8S_VERSION = os.environ.get("K8S_VERSION", "v1.37.2")
ETCD_VERSION = os.environ.get("ETCD_VERSION", "v3.6.16")
KWOK_VERSION = os.environ.get("KWOK_VERSION", "v0.8.0")
HELM_VERSION = os.environ.get("HELM_VERSION", "v3.21.4")
KUBE_SCORE_VERSION = os.environ.get("KUBE_SCORE_VERSION", "v1.20.0")

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD_COMMAND = f"{REPO_ROOT / 'tools' / 'build-cluster-bins.sh'}"

# kwok's default stages (what kwokctl installs): nodes become Ready and keep a lease, pods become
# Ready, finish, and are removed when deleted.
KWOK_STAGE_FILES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-ready.yaml",
    "pod/fast/pod-complete.yaml",
    "pod/fast/pod-delete.yaml",
)


class MissingBinaries(RuntimeError):
    """A binary the test cluster needs is not in the cache; the message names the build command."""


def cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("ASYNCRL_CACHE", pathlib.Path.home() / ".cache" / "asyncrl"))


@dataclasses.dataclass(frozen=True)
class Binaries:
    """Absolute paths of every executable the cluster harness runs."""

    etcd: pathlib.Path
    kube_apiserver: pathlib.Path
    kube_controller_manager: pathlib.Path
    kube_scheduler: pathlib.Path
    kubectl: pathlib.Path
    kwok: pathlib.Path
    helm: pathlib.Path


def expected_paths() -> dict[str, tuple[pathlib.Path, str]]:
    """Binaries field -> (where the build script puts it, the build script's component name)."""
    cache = cache_dir()
    k8s = cache / f"k8s-{K8S_VERSION}"
    return {
        "etcd": (cache / f"etcd-{ETCD_VERSION}" / "etcd", "etcd"),
        "kube_apiserver": (k8s / "kube-apiserver", "k8s"),
        "kube_controller_manager": (k8s / "kube-controller-manager", "k8s"),
        "kube_scheduler": (k8s / "kube-scheduler", "k8s"),
        "kubectl": (k8s / "kubectl", "k8s"),
        "kwok": (cache / f"kwok-{KWOK_VERSION}" / "kwok", "kwok"),
        "helm": (cache / f"helm-{HELM_VERSION}" / "helm", "helm"),
    }


def find_binaries() -> Binaries:
    """Return the cached binaries, or raise MissingBinaries listing every one that is absent."""
    paths = expected_paths()
    missing = {(str(path), component) for path, component in paths.values() if not os.access(path, os.X_OK)}
    if missing:
        components = " ".join(sorted({component for _, component in missing}))
        listing = ", ".join(sorted(path for path, _ in missing))
        raise MissingBinaries(
            f"test cluster binaries missing: {listing}. Build them with: {BUILD_COMMAND} {components}"
        )
    return Binaries(**{field: path for field, (path, _) in paths.items()})


def kube_score() -> pathlib.Path:
    """The kube-score binary (component ``kubescore``), or MissingBinaries naming the build command."""
    path = cache_dir() / f"kube-score-{KUBE_SCORE_VERSION}" / "kube-score"
    if not os.access(path, os.X_OK):
        raise MissingBinaries(f"kube-score missing at {path}. Build it with: {BUILD_COMMAND} kubescore")
    return path


def kwok_stage_dir() -> pathlib.Path:
    """The kwok module's kustomize/stage directory, downloading the module through the Go proxy if needed."""
    try:
        modcache = subprocess.run(
            ["go", "env", "GOMODCACHE"], check=True, capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise MissingBinaries(
            f"`go env GOMODCACHE` failed ({exc}); kwok's stages come from its module"
        ) from exc
    stage = pathlib.Path(modcache) / f"sigs.k8s.io/kwok@{KWOK_VERSION}" / "kustomize" / "stage"
    if not stage.is_dir():
        done = subprocess.run(
            ["go", "mod", "download", f"sigs.k8s.io/kwok@{KWOK_VERSION}"],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0 or not stage.is_dir():
            raise MissingBinaries(
                f"kwok stages not found at {stage}; `go mod download sigs.k8s.io/kwok@{KWOK_VERSION}` "
                f"said: {done.stderr.strip()[-500:]}"
            )
    return stage


def write_kwok_stages(dest: pathlib.Path) -> pathlib.Path:
    """Concatenate kwok's default stages into one multi-document YAML file for `kwok --config`."""
    stage = kwok_stage_dir()
    docs = [(stage / name).read_text() for name in KWOK_STAGE_FILES]
    dest.write_text("\n---\n".join(doc.strip() for doc in docs) + "\n")
    return dest
