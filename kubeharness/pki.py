"""Certificates and keys for a throwaway loopback control plane, made with the ``openssl`` CLI.

Why the CLI and not a Python crypto package: openssl is on every Debian/Ubuntu machine, and the project
does not otherwise depend on a crypto library, so the harness adds no dependency. Keys are EC P-256
(fast to generate; the apiserver accepts them for serving and client certs) except the service-account
key, which is RSA because that is what every guide and the notes used.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

# The apiserver's serving cert must carry the in-cluster names and the first service IP as well as
# loopback; clients here only ever use 127.0.0.1, the rest keeps the apiserver's own checks quiet.
SERVING_SANS = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "IP:10.96.0.1",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


class PKIError(RuntimeError):
    """openssl is missing or one of its commands failed."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    """Everything the control plane and its clients need, as files under one folder."""

    ca: KeyPair
    apiserver: KeyPair
    admin: KeyPair
    scheduler: KeyPair
    extender: KeyPair
    sa_key: Path
    sa_pub: Path


def _openssl(*args: str, cwd: Path) -> None:
    exe = shutil.which("openssl")
    if exe is None:
        raise PKIError("the openssl command is required to make the test control plane's certificates")
    res = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise PKIError(f"openssl {' '.join(args)} failed ({res.returncode}): {res.stderr.strip()}")


def _ec_key(path: Path, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path), cwd=cwd)


def _leaf(name: str, subject: str, ca: KeyPair, extensions: list[str], d: Path) -> KeyPair:
    key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    _ec_key(key, d)
    _openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(csr), cwd=d)
    ext.write_text("\n".join(["basicConstraints=critical,CA:FALSE", *extensions]) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca.cert),
        "-CAkey",
        str(ca.key),
        # A random serial avoids the shared ca.srl file (and any clash between leaves).
        "-set_serial",
        str(secrets.randbits(63)),
        "-days",
        "3",
        "-sha256",
        "-extfile",
        str(ext),
        "-out",
        str(crt),
        cwd=d,
    )
    csr.unlink()
    ext.unlink()
    return KeyPair(crt, key)


def client_cert(
    name: str, common_name: str, ca: KeyPair, d: Path, organization: str | None = None
) -> KeyPair:
    """A client certificate: the apiserver maps CN to the user name and O to groups."""
    subject = (f"/O={organization}" if organization else "") + f"/CN={common_name}"
    return _leaf(
        name,
        subject,
        ca,
        ["keyUsage=critical,digitalSignature,keyEncipherment", "extendedKeyUsage=clientAuth"],
        d,
    )


def make_pki(d: Path, extender_user: str) -> PKI:
    """Create a CA, the apiserver serving cert, admin/scheduler/extender client certs and SA keys."""
    d.mkdir(parents=True, exist_ok=True)
    ca = KeyPair(d / "ca.crt", d / "ca.key")
    _ec_key(ca.key, d)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(ca.key),
        "-subj",
        "/CN=llm-placement-test-ca",
        "-days",
        "3",
        "-sha256",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        str(ca.cert),
        cwd=d,
    )
    apiserver = _leaf(
        "apiserver",
        "/CN=kube-apiserver",
        ca,
        [
            "keyUsage=critical,digitalSignature,keyEncipherment",
            "extendedKeyUsage=serverAuth",
            "subjectAltName=" + ",".join(SERVING_SANS),
        ],
        d,
    )
    admin = client_cert("admin", "kubernetes-admin", ca, d, organization="system:masters")
    # The bootstrap RBAC policy already grants system:kube-scheduler everything the scheduler needs.
    scheduler = client_cert("scheduler", "system:kube-scheduler", ca, d)
    # No group: the extender gets exactly the ClusterRole the chart grants, nothing more.
    extender = client_cert("extender", extender_user, ca, d)
    sa_key, sa_pub = d / "sa.key", d / "sa.pub"
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(sa_key), cwd=d)
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub), cwd=d)
    return PKI(ca, apiserver, admin, scheduler, extender, sa_key, sa_pub)


def kubeconfig(path: Path, server: str, ca: Path, client: KeyPair, user: str) -> Path:
    """Write an ordinary kubeconfig that points at ``server`` with a client certificate."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [
            {"name": user, "user": {"client-certificate": str(client.cert), "client-key": str(client.key)}}
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


# The name the chart's default-scheduler stanza verifies the extender by (tlsConfig.serverName).
SERVICE_DNS = "llm-placement.llm-placement.svc"


@dataclass(frozen=True)
class VerbsPKI:
    """TLS for the extender's verbs, as the chart makes it: a CA of its own, the extender's serving
    certificate (loopback names) and kube-scheduler's client certificate; plus a client certificate
    of another CA, which must be refused."""

    ca: KeyPair
    serving: KeyPair
    scheduler: KeyPair
    stranger: KeyPair


def _ca(name: str, d: Path) -> KeyPair:
    ca = KeyPair(d / f"{name}.crt", d / f"{name}.key")
    _ec_key(ca.key, d)
    _openssl("req", "-x509", "-new", "-key", str(ca.key), "-subj", f"/CN={name}", "-days", "3", "-sha256",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature", "-out", str(ca.cert), cwd=d)
    return ca


def make_verbs_pki(d: Path) -> VerbsPKI:
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("verbs-ca", d)
    serving = _leaf("verbs-serving", "/CN=llm-placement", ca,
                    ["keyUsage=critical,digitalSignature,keyEncipherment", "extendedKeyUsage=serverAuth",
                     f"subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:{SERVICE_DNS}"], d)
    scheduler = client_cert("verbs-scheduler", "kube-scheduler", ca, d)
    other = _ca("other-ca", d)
    stranger = client_cert("stranger", "kube-scheduler", other, d)
    return VerbsPKI(ca, serving, scheduler, stranger)
