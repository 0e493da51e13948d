"""NATS with TLS: deploy/nats/nats-server-tls.conf (nats-server.conf's accounts and users, plus deploy/nats/tls.conf)
on a real nats-server, with a throwaway CA and server certificate made by the openssl command line. A client that
trusts the CA connects over TLS; a plain client, or one that does not trust the CA, is refused."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from secured_nats import DEPLOY, SecuredNats

from oneplus.devstack import find_nats_server, free_port, spawn, wait_port

OPENSSL = shutil.which("openssl")
pytestmark = pytest.mark.skipif(OPENSSL is None, reason="the openssl command line makes the test certificates")


def make_certs(workdir: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost, signed by it (EC P-256, one day)."""
    ca_key, ca, key, csr, cert = (workdir / n for n in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem"))
    ext = workdir / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def run(*args: str) -> None:
        subprocess.run([str(OPENSSL), *args], check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "1", "-subj", "/CN=oneplus test CA")
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    sign = ["x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial"]
    run(*sign, "-out", str(cert), "-days", "1", "-extfile", str(ext))
    return {"ca": ca, "cert": cert, "key": key}


class TlsNats(SecuredNats):
    def __init__(self, workdir: Path, certs: dict[str, Path]) -> None:
        super().__init__(workdir)
        self.certs = certs

    def env(self) -> dict[str, str]:
        tls = {"NATS_TLS_CERT": str(self.certs["cert"]), "NATS_TLS_KEY": str(self.certs["key"])}
        return {**super().env(), **tls, "NATS_TLS_CA": str(self.certs["ca"])}

    def start(self) -> TlsNats:
        argv = [find_nats_server(), "-c", str(DEPLOY / "nats-server-tls.conf"), "-a", "127.0.0.1", "-p", str(self.port)]
        self.proc = spawn([*argv, "-m", str(free_port())], self.workdir / "nats-server.log", self.env())
        wait_port(self.port, proc=self.proc)
        return self

    def tls_url(self, user: str) -> str:
        return self.url(user).replace("nats://", "tls://")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsNats]:
    workdir = tmp_path_factory.mktemp("nats-tls")
    s = TlsNats(workdir, make_certs(workdir)).start()
    try:
        yield s
    finally:
        s.stop()


async def test_a_client_that_trusts_the_ca_connects_over_tls(server: TlsNats) -> None:
    ctx = ssl.create_default_context(cafile=str(server.certs["ca"]))
    nc = await nats.connect(server.tls_url("admin"), tls=ctx, allow_reconnect=False, connect_timeout=5)
    try:
        assert nc.is_connected
        sub = await nc.subscribe("oneplus.test.tls")
        await nc.publish("oneplus.test.tls", b"over tls")
        assert (await sub.next_msg(timeout=5)).data == b"over tls"
        assert (await nc.jetstream().account_info()) is not None  # the accounts of nats-server.conf are there
    finally:
        await nc.close()


async def test_the_services_connect_with_a_tls_url_and_ssl_cert_file(
    server: TlsNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a service does with NATS_URL=tls://... and SSL_CERT_FILE=<ca>: the default context trusts the CA."""
    monkeypatch.setenv("SSL_CERT_FILE", str(server.certs["ca"]))
    nc = await nats.connect(server.tls_url("intake"), allow_reconnect=False, connect_timeout=5)
    try:
        assert nc.is_connected
    finally:
        await nc.close()


async def test_a_plain_client_is_refused(server: TlsNats) -> None:
    with pytest.raises(Exception):  # noqa: B017  (nats-py raises what the failed handshake gives)
        await nats.connect(server.url("admin"), allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)
    # a raw socket that speaks plain NATS gets no further than the INFO that says TLS is required
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        info = await reader.readline()
        assert b'"tls_required":true' in info
        writer.write(b'CONNECT {"verbose":true}\r\nPING\r\n')
        await writer.drain()
        answer = await reader.read(4096)
        assert b"PONG" not in answer
    finally:
        writer.close()


async def test_a_client_that_does_not_trust_the_ca_is_refused(server: TlsNats, tmp_path: Path) -> None:
    other = make_certs(tmp_path)  # another CA
    ctx = ssl.create_default_context(cafile=str(other["ca"]))
    with pytest.raises(Exception) as err:
        await nats.connect(
            server.tls_url("admin"), tls=ctx, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3
        )
    assert "CERTIFICATE_VERIFY_FAILED" in repr(err.value) or isinstance(err.value, ssl.SSLError), repr(err.value)


async def test_a_wrong_password_over_tls_is_still_refused(server: TlsNats) -> None:
    ctx = ssl.create_default_context(cafile=str(server.certs["ca"]))
    url = server.tls_url("admin").replace(server.passwords["admin"], "wrong")
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(url, tls=ctx, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3)
