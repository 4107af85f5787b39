"""The verbs over TLS with kube-scheduler's client certificate (docs/security.md), on a live server
exactly as ``serve`` configures it: a verb call without a certificate is answered 403, one with a
certificate of another CA fails the handshake; the probes' paths need none."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.base.catalog import GpuCatalog
from app.config.settings import ConfigError, Settings, load_settings
from kubeharness.pki import VerbsPKI, make_verbs_pki
from testkit.live_verbs import live_verbs

BIND = b'{"PodName":"p","PodNamespace":"ns","PodUID":"u","Node":"n"}'


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> VerbsPKI:
    return make_verbs_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def port(pki: VerbsPKI, catalog: GpuCatalog) -> Iterator[int]:
    settings = Settings(cluster_source="none", metrics_port=0, tls_cert_file=str(pki.serving.cert),
                        tls_key_file=str(pki.serving.key), tls_client_ca_file=str(pki.ca.cert))
    with live_verbs(settings, catalog) as port:
        yield port


def _client(pki: VerbsPKI, cert: tuple[Path, Path] | None) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(pki.ca.cert))
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    return httpx.Client(verify=ctx, timeout=5)


def test_kube_schedulers_certificate_reaches_every_verb(pki: VerbsPKI, port: int) -> None:
    with _client(pki, (pki.scheduler.cert, pki.scheduler.key)) as c:
        for verb in ("filter", "prioritize", "bind", "preempt"):
            r = c.post(f"https://127.0.0.1:{port}/scheduler/{verb}", content=BIND)
            assert r.status_code == 200, (verb, r.text)
        # The bind itself is refused by the service (no API server here), not by TLS.
        assert "no API server connection" in c.post(f"https://127.0.0.1:{port}/scheduler/bind",
                                                    content=BIND).json()["Error"]


@pytest.mark.parametrize("path", ["/scheduler/filter", "/scheduler/bind", "/scheduler/nope",
                                  "/%73cheduler/bind", "/scheduler/%62ind", "//scheduler/bind",
                                  "/explain/../scheduler/bind", "/healthz/../scheduler/bind"])
def test_no_client_certificate_is_refused_403(pki: VerbsPKI, port: int, path: str) -> None:
    with _client(pki, None) as c:
        r = c.post(f"https://127.0.0.1:{port}{path}", content=BIND)
    assert r.status_code == 403, r.text
    assert "kube-scheduler's certificate" in r.text


def test_another_cas_certificate_fails_the_handshake(pki: VerbsPKI, port: int) -> None:
    with _client(pki, (pki.stranger.cert, pki.stranger.key)) as c, pytest.raises(httpx.HTTPError):
        # TLS 1.3 reports the client certificate's rejection on the first read.
        c.post(f"https://127.0.0.1:{port}/scheduler/bind", content=BIND)


def test_plain_http_is_not_answered(port: int) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"http://127.0.0.1:{port}/scheduler/bind", content=BIND, timeout=5)


def test_probes_need_no_certificate(pki: VerbsPKI, port: int) -> None:
    with _client(pki, None) as c:
        assert c.get(f"https://127.0.0.1:{port}/healthz").status_code == 200
        assert c.get(f"https://127.0.0.1:{port}/readyz").status_code == 200


@pytest.mark.parametrize(("settings", "words"), [
    ({"tls_cert_file": "CERT"}, "tls_cert_file and tls_key_file go together"),
    ({"tls_client_ca_file": "CERT"}, "tls_client_ca_file needs tls_cert_file"),
    ({"tls_cert_file": "CERT", "tls_key_file": "/nonexistent/key.pem"}, "tls_key_file: /nonexistent/key.pem"),
])
def test_tls_settings_are_checked_at_start(pki: VerbsPKI, settings: dict[str, str], words: str) -> None:
    values = {k: str(pki.serving.cert) if v == "CERT" else v for k, v in settings.items()}
    with pytest.raises(ConfigError, match=words):
        load_settings(None, cluster_source="none", **values)
