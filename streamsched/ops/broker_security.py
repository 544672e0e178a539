"""Security of the local broker: SCRAM users, the StandardAuthorizer, a project-made TLS CA.

``streamsched broker start --security sasl`` runs every node with:

* a client listener ``SASL_PLAINTEXT`` (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN), which is also the
  inter-broker listener (SCRAM-SHA-512 as the super user ``admin``);
* SCRAM credentials created when the storage is formatted (``kafka-storage format
  --add-scram``, KIP-900), so a user exists before the first broker starts;
* the KRaft ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a principal can
  do exactly what its ACLs allow; ``User:admin`` is the only super user;
* a ``CONTROLLER`` listener with SASL PLAIN (static JAAS user ``admin``): SCRAM cannot guard it
  (its credentials live in the metadata the controllers serve), and an unauthenticated controller
  listener would be a super-user back door;
* with ``tls=True``: a CA generated here with ``openssl``, a broker certificate for ``127.0.0.1``
  and ``localhost``, a ``SASL_SSL`` listener and an ``SSL`` listener that requires a client
  certificate (its principal is the certificate's CN, ``User:<CN>``).

Everything secret lives under ``<data-dir>/security`` with mode 0600: the users' passwords
(``users.json``), keys, and one TOML connection file per user for ``--config``.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamsched.errors import BrokerError, ConfigError
from streamsched.kafka.clients import Connection
from streamsched.kafka.security import Secret
from streamsched.model.names import validate_name

ADMIN = "admin"
SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_MECHANISMS = (*SCRAM, "PLAIN")
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"


def private_file(path: Path, text: str) -> Path:
    """Write ``text`` to a file only its owner can read (created so, never widened)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


@dataclass
class BrokerSecurity:
    """SASL users (and optionally TLS) of a :class:`~streamsched.ops.broker.LocalCluster`.

    ``oauth_unsecured`` also enables OAUTHBEARER with Kafka's *unsecured* JWT validator (any
    unsigned token is accepted): for tests of the client's token hook only, never a default.
    """

    directory: Path
    users: dict[str, Secret] = field(default_factory=dict)
    tls: bool = False
    oauth_unsecured: bool = False

    @classmethod
    def create(cls, directory: Path, users: Iterable[str] = (), *, tls: bool = False,
               oauth_unsecured: bool = False) -> BrokerSecurity:
        """Load the saved users of ``directory``, adding fresh random passwords for new names
        (a formatted cluster keeps its credentials; new names then need a fresh data dir)."""
        saved = cls.load(directory)
        known = dict(saved.users) if saved else {}
        for name in (ADMIN, *users):
            validate_name(name, "user")
            known.setdefault(name, Secret(secrets.token_urlsafe(18)))
        sec = cls(directory, known, tls=tls or bool(saved and saved.tls),
                  oauth_unsecured=oauth_unsecured or bool(saved and saved.oauth_unsecured))
        sec.save()
        if sec.tls:
            sec.ensure_ca()
        return sec

    @classmethod
    def load(cls, directory: Path) -> BrokerSecurity | None:
        path = directory / "users.json"
        if not path.exists():
            return None
        doc = json.loads(path.read_text())
        return cls(directory, {k: Secret(v) for k, v in doc["users"].items()}, tls=bool(doc.get("tls")),
                   oauth_unsecured=bool(doc.get("oauth_unsecured")))

    def save(self) -> None:
        doc = {"users": {k: v.reveal() for k, v in self.users.items()}, "tls": self.tls,
               "oauth_unsecured": self.oauth_unsecured}
        private_file(self.directory / "users.json", json.dumps(doc, indent=2))

    def password(self, user: str) -> Secret:
        try:
            return self.users[user]
        except KeyError:
            raise ConfigError(f"the local broker has no user {user!r} (users are created at format time: "
                              "`broker start --security sasl --user NAME` on a fresh data dir)") from None

    # --- broker side -------------------------------------------------------------------------------

    def format_args(self) -> list[str]:
        """``--add-scram`` arguments: every user, both SCRAM mechanisms."""
        args: list[str] = []
        for name, pw in self.users.items():
            for mech in SCRAM:
                args += ["--add-scram", f"{mech}=[name={name},password={pw.reveal()}]"]
        return args

    def listeners(self, port: int, controller_port: int, tls_port: int | None,
                  mtls_port: int | None) -> tuple[str, str]:
        """(listeners, advertised.listeners) of one node."""
        client = [f"SASL_PLAINTEXT://127.0.0.1:{port}"]
        if self.tls and tls_port and mtls_port:
            client += [f"SASL_SSL://127.0.0.1:{tls_port}", f"SSL://127.0.0.1:{mtls_port}"]
        return ",".join([*client, f"CONTROLLER://127.0.0.1:{controller_port}"]), ",".join(client)

    def properties(self) -> dict[str, str]:
        """server.properties entries (besides the listeners) of every node."""
        admin = self.users[ADMIN].reveal()
        mechanisms = [*CLIENT_MECHANISMS, *(["OAUTHBEARER"] if self.oauth_unsecured else [])]
        plain_users = " ".join(f'user_{n}="{p.reveal()}"' for n, p in self.users.items())
        props = {
            "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                                              "SASL_SSL:SASL_SSL,SSL:SSL",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.enabled.mechanisms": ",".join(mechanisms),
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{_PLAIN_MODULE} required username="{ADMIN}" password="{admin}" user_{ADMIN}="{admin}";',
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN}",
        }
        sasl_listeners = ["sasl_plaintext", *(["sasl_ssl"] if self.tls else [])]
        for listener in sasl_listeners:
            # Only the inter-broker listener logs in itself; the others just verify clients.
            login = f' username="{ADMIN}" password="{admin}"' if listener == "sasl_plaintext" else ""
            for mech in SCRAM:
                props[f"listener.name.{listener}.{mech.lower()}.sasl.jaas.config"] = \
                    f"{_SCRAM_MODULE} required{login};"
            props[f"listener.name.{listener}.plain.sasl.jaas.config"] = \
                f"{_PLAIN_MODULE} required {plain_users};"
            if self.oauth_unsecured:
                props[f"listener.name.{listener}.oauthbearer.sasl.jaas.config"] = \
                    f'{_OAUTH_MODULE} required unsecuredLoginStringClaim_sub="{ADMIN}";'
        if self.tls:
            props.update({
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(self.directory / "broker.p12"),
                "ssl.keystore.password": self._store_password(),
                "ssl.key.password": self._store_password(),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(self.ca_file),
                "listener.name.ssl.ssl.client.auth": "required",
                # A client certificate's principal is its CN: User:<CN>.
                "ssl.principal.mapping.rules": "RULE:^CN=([^,]+).*$/$1/,DEFAULT",
            })
        return props

    # --- TLS material ------------------------------------------------------------------------------

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    def _store_password(self) -> str:
        path = self.directory / "keystore.password"
        if not path.exists():
            private_file(path, secrets.token_urlsafe(18))
        return path.read_text()

    def ensure_ca(self) -> None:
        """A CA and a broker certificate (127.0.0.1, localhost) in a PKCS12 keystore, made once."""
        d = self.directory
        if (d / "broker.p12").exists():
            return
        if shutil.which("openssl") is None:
            raise BrokerError("openssl is not on PATH; it is needed to make the test CA for --tls")
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(d / "ca.key"), "-out", str(self.ca_file), "-days", "365",
                 "-subj", "/CN=streamsched local test CA",
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        os.chmod(d / "ca.key", 0o600)
        self._issue("broker", "localhost", "subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                                           "extendedKeyUsage=serverAuth\n")
        _openssl("pkcs12", "-export", "-in", str(d / "broker.pem"), "-inkey", str(d / "broker.key"),
                 "-certfile", str(self.ca_file), "-name", "broker", "-out", str(d / "broker.p12"),
                 "-passout", "env:STREAMSCHED_STORE_PASSWORD",
                 env={"STREAMSCHED_STORE_PASSWORD": self._store_password()})
        os.chmod(d / "broker.p12", 0o600)

    def client_certificate(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) PEM files of a client whose principal is ``User:<name>``."""
        validate_name(name, "user")
        if not self.tls:
            raise ConfigError("client certificates need a broker started with TLS")
        cert, key = self.directory / f"client-{name}.pem", self.directory / f"client-{name}.key"
        if not cert.exists():
            self._issue(f"client-{name}", name, "extendedKeyUsage=clientAuth\n")
        return cert, key

    def _issue(self, stem: str, cn: str, extensions: str) -> None:
        d = self.directory
        key, csr, cert, ext = (d / f"{stem}.key", d / f"{stem}.csr", d / f"{stem}.pem", d / f"{stem}.ext")
        ext.write_text(extensions)
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={cn}")
        os.chmod(key, 0o600)
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_file), "-CAkey", str(d / "ca.key"),
                 "-CAcreateserial", "-out", str(cert), "-days", "365", "-extfile", str(ext))
        csr.unlink()
        ext.unlink()

    # --- client side -------------------------------------------------------------------------------

    def connection(self, bootstrap: str, user: str = ADMIN, *, mechanism: str = "SCRAM-SHA-512",
                   tls: bool = False, options: dict[str, Any] | None = None) -> Connection:
        """A connection of ``user`` to a SASL listener (SASL_SSL with ``tls``, verified against
        the project CA)."""
        return Connection(bootstrap, dict(options or {}),
                          security_protocol="SASL_SSL" if tls else "SASL_PLAINTEXT",
                          sasl_mechanism=mechanism, sasl_username=user, sasl_password=self.password(user),
                          ssl_cafile=str(self.ca_file) if tls else None)

    def write_client_file(self, bootstrap: str, user: str) -> Path:
        """A private TOML connection file for ``--config`` (SCRAM-SHA-512 as ``user``)."""
        self.password(user)
        pw_file = private_file(self.directory / f"{user}.password", self.users[user].reveal())
        text = (f'bootstrap = "{bootstrap}"\nsecurity_protocol = "SASL_PLAINTEXT"\n\n'
                f'[sasl]\nmechanism = "SCRAM-SHA-512"\nusername = "{user}"\n'
                # Relative to this file: the pair stays usable wherever the directory is mounted.
                f'password_file = "{pw_file.name}"\n')
        return private_file(self.directory / f"{user}.toml", text)


def _openssl(*args: str, env: dict[str, str] | None = None) -> None:
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise BrokerError(f"openssl {args[0]} failed: {(proc.stderr or proc.stdout)[-800:]}")
