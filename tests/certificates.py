"""A small certificate authority for the TLS tests: a CA, a server and a client certificate."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def make_certificate(
    folder: Path, name: str, issuer: Issuer | None, dns_names: tuple[str, ...] = ("localhost",)
) -> Issuer:
    """``<name>.pem`` and ``<name>.key`` valid for ``dns_names`` (and 127.0.0.1 when they include
    localhost); a CA when no issuer is given."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_cert, issuer_key = issuer if issuer else (None, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_cert.subject if issuer_cert else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(dns) for dns in dns_names]
                + ([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))] if "localhost" in dns_names else [])
            ),
            critical=False,
        )
        .sign(issuer_key, hashes.SHA256())
    )
    (folder / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return certificate, key


def make_pki(folder: Path) -> Path:
    """ca.pem, server.pem/.key and client.pem/.key in ``folder``, the last two signed by the CA."""
    ca = make_certificate(folder, "ca", None)
    make_certificate(folder, "server", ca)
    make_certificate(folder, "client", ca)
    return folder
