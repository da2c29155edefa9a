"""Keys, certificates and the admin kubeconfig for the test control plane, made with the openssl CLI.

Called by `cluster` before it starts kube-apiserver. One throwaway CA signs the apiserver's serving
certificate (so kubeconfigs and the `kube-root-ca.crt` ConfigMap verify TLS for real) and the admin
client certificate (`CN=asyncrl-admin, O=system:masters`). A separate RSA key pair signs service-account
tokens (apiserver `--service-account-signing-key-file`, controller-manager
`--service-account-private-key-file`).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pathlib
import shutil
import subprocess

# SANs of the serving certificate: loopback for the tests, the in-cluster names for completeness,
# and the first IP of the service range (the `kubernetes` Service's ClusterIP).
SERVING_SANS = (
    "IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,"
    "DNS:kubernetes.default.svc.cluster.local,IP:10.0.0.1"
)
ADMIN_USER = "asyncrl-admin"


@dataclasses.dataclass(frozen=True)
class Pki:
    """Paths of everything `make_pki` writes."""

    ca_cert: pathlib.Path
    ca_key: pathlib.Path
    serving_cert: pathlib.Path
    serving_key: pathlib.Path
    admin_cert: pathlib.Path
    admin_key: pathlib.Path
    sa_key: pathlib.Path
    sa_pub: pathlib.Path


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not installed; the test cluster needs it to make its certificates")
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {done.stderr.strip()}")


def _ec_key(path: pathlib.Path) -> None:
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        path.name,
        cwd=path.parent,
    )


def _sign(pki_dir: pathlib.Path, name: str, subject: str, extensions: str) -> None:
    """Issue `<name>.crt` for `<name>.key`, signed by ca.crt/ca.key, with the given x509v3 extensions."""
    _ec_key(pki_dir / f"{name}.key")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=pki_dir)
    (pki_dir / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "7",
        "-sha256",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=pki_dir,
    )


def make_pki(pki_dir: pathlib.Path) -> Pki:
    """Write a CA, the apiserver serving cert, the admin client cert and the service-account key pair."""
    pki_dir.mkdir(parents=True, exist_ok=True)
    _ec_key(pki_dir / "ca.key")
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=asyncrl-test-ca",
        "-days",
        "7",
        "-sha256",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        "ca.crt",
        cwd=pki_dir,
    )
    _sign(
        pki_dir,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={SERVING_SANS}\n",
    )
    _sign(
        pki_dir,
        "admin",
        f"/O=system:masters/CN={ADMIN_USER}",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=clientAuth\n",
    )
    _openssl(
        "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=pki_dir
    )
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki_dir)
    return Pki(
        ca_cert=pki_dir / "ca.crt",
        ca_key=pki_dir / "ca.key",
        serving_cert=pki_dir / "apiserver.crt",
        serving_key=pki_dir / "apiserver.key",
        admin_cert=pki_dir / "admin.crt",
        admin_key=pki_dir / "admin.key",
        sa_key=pki_dir / "sa.key",
        sa_pub=pki_dir / "sa.pub",
    )


def _b64(path: pathlib.Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def write_kubeconfig(path: pathlib.Path, server: str, pki: Pki, cluster_name: str = "asyncrl-test") -> None:
    """Write a self-contained admin kubeconfig (certificates embedded, so the file can be copied)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": server, "certificate-authority-data": _b64(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": ADMIN_USER,
                "user": {
                    "client-certificate-data": _b64(pki.admin_cert),
                    "client-key-data": _b64(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": ADMIN_USER}}],
        "current-context": cluster_name,
    }
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML: every kubeconfig reader takes it
    path.chmod(0o600)
