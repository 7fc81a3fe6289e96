"""Docker hosts over mutual TLS (README "More Docker hosts"): a real dockerd listening on a TCP
port of the loopback with --tlsverify, certificates made here by a CA of the test's own.

- The admin (the model's clean) refuses a tcp:// engine without the three TLS files, files that
  are not there, and TLS files on a unix:// or ssh:// engine.
- A host registered with the client certificate answers, and a job placed on it runs there and
  completes; the same engine without a client certificate, or with one of another CA, refuses.
"""

from __future__ import annotations

import datetime
import ipaddress
import subprocess
from pathlib import Path

import docker
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from django.core.exceptions import ValidationError

from jobs.models import DockerHost, Phase, ResourcePool, TrainingJob
from jobs.runtime import engine, engine_clients, schedule
from tests.bounded_calls import followed_through_a_bounded_client
from tests.helpers import BUSYBOX, wait_for
from tests.processes import free_port
from tests.second_engine import SecondEngine

pytestmark = pytest.mark.django_db


# -- a CA, a server certificate for 127.0.0.1 and client certificates ----------------------------------------
def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _cert(subject: str, key, issuer=None, issuer_key=None, *, ca=False, server=False):
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer.subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    elif not ca:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
    return builder.sign(issuer_key or key, hashes.SHA256())


def _write(folder: Path, name: str, cert, key) -> tuple[str, str]:
    cert_path, key_path = folder / f"{name}.pem", folder / f"{name}-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("tls")
    ca_key = _key()
    ca = _cert("console test CA", ca_key, ca=True)
    files = {"ca": _write(folder, "ca", ca, ca_key)[0]}
    server_key = _key()
    files["server"], files["server_key"] = _write(
        folder, "server", _cert("127.0.0.1", server_key, ca, ca_key, server=True), server_key
    )
    client_key = _key()
    files["client"], files["client_key"] = _write(
        folder, "client", _cert("console", client_key, ca, ca_key), client_key
    )
    rogue_ca_key, rogue_key = _key(), _key()
    rogue_ca = _cert("another CA", rogue_ca_key, ca=True)
    files["rogue"], files["rogue_key"] = _write(
        folder, "rogue", _cert("console", rogue_key, rogue_ca, rogue_ca_key), rogue_key
    )
    return files


@pytest.fixture
def tls_engine(certificates):
    """A dockerd with a TLS-verified TCP listener on the loopback (and its private socket)."""
    port = free_port()
    d = SecondEngine(
        [
            "--host", f"tcp://127.0.0.1:{port}", "--tlsverify", f"--tlscacert={certificates['ca']}",
            f"--tlscert={certificates['server']}", f"--tlskey={certificates['server_key']}",
        ]
    )  # fmt: skip
    d.start()
    yield d, f"tcp://127.0.0.1:{port}"
    d.cleanup()


def tls_host(url: str, files: dict[str, str], **fields) -> DockerHost:
    return DockerHost(
        name=fields.pop("name", "tls-host"),
        base_url=url,
        tls_ca_cert=files["ca"],
        tls_client_cert=fields.pop("cert", files["client"]),
        tls_client_key=fields.pop("key", files["client_key"]),
        **fields,
    )


# -- validation (no engine) ------------------------------------------------------------------------------------
def test_a_tcp_engine_needs_the_three_tls_files(certificates):
    plain = DockerHost(name="plain", base_url="tcp://10.0.0.7:2375")
    with pytest.raises(ValidationError) as raised:
        plain.full_clean()
    errors = raised.value.message_dict
    assert set(errors) == {"tls_ca_cert", "tls_client_cert", "tls_client_key"}
    assert "never talks to an engine's API over plain TCP" in errors["tls_ca_cert"][0]

    missing = tls_host("tcp://10.0.0.7:2376", certificates, key="/nowhere/key.pem")
    with pytest.raises(ValidationError) as raised:
        missing.full_clean()
    assert raised.value.message_dict == {
        "tls_client_key": ["TLS client key: no file at '/nowhere/key.pem' on this machine (an absolute path)."]
    }
    tls_host("tcp://10.0.0.7:2376", certificates).full_clean()  # all three there: accepted


@pytest.mark.parametrize(
    "url, field, message",
    [
        ("http://10.0.0.7:2375", "base_url", "The engine's URL must be unix:///path/to/docker.sock"),
        ("unix://var/run/docker.sock", "base_url", "A unix socket URL names an absolute path"),
        ("ssh://deploy@gpu-8", "tls_ca_cert", "TLS CA certificate is for tcp:// engines only"),
    ],
)
def test_other_urls_are_checked(certificates, url, field, message):
    host = tls_host(url, certificates) if field != "base_url" else DockerHost(name="h", base_url=url)
    with pytest.raises(ValidationError) as raised:
        host.full_clean()
    assert raised.value.message_dict[field][0].startswith(message)


def test_an_ssh_engine_uses_the_system_ssh_client_kwargs_only_no_sshd_here():
    """No sshd on this machine kind: the options handed to the SDK are what is checked."""
    assert engine_clients._transport(DockerHost(base_url="ssh://deploy@gpu-8")) == {"use_ssh_client": True}
    assert engine_clients._transport(DockerHost(base_url="unix:///var/run/docker.sock")) == {}


# -- a real engine over TLS -------------------------------------------------------------------------------------
def test_a_tls_engine_answers_only_with_the_client_certificate(tls_engine, certificates):
    _, url = tls_engine
    good = tls_host(url, certificates)
    good.full_clean()
    engine.ping(good)  # answers (raises otherwise)
    rogue = tls_host(url, certificates, name="rogue", cert=certificates["rogue"], key=certificates["rogue_key"])
    with pytest.raises(engine.EngineError):
        engine.ping(rogue)
    # Without any client certificate the engine refuses the connection (what `docker -H tcp://` gets).
    with pytest.raises(docker.errors.DockerException):
        docker.DockerClient(base_url=url.replace("tcp://", "https://"), timeout=5, tls=True).ping()


def test_a_job_runs_on_an_engine_reached_over_tls(demo, worker, tls_engine, certificates, docker_client):
    d, url = tls_engine
    image = subprocess.run(["docker", "save", BUSYBOX], capture_output=True, check=True).stdout
    docker.DockerClient(base_url=d.socket, timeout=60).images.load(image)
    pool = ResourcePool.objects.create(name="tls-pool", check_root_gb=0.5, check_cache_gb=0.5)
    host = tls_host(url, certificates, pool=pool)
    host.full_clean()
    host.save()
    DockerHost.objects.exclude(id=host.id).update(enabled=False)  # the TLS engine is the only place to run
    job = TrainingJob(
        workspace=demo.workspace,
        created_by=demo.owner,
        name="over-tls",
        image=BUSYBOX,
        command="echo over-tls",
        pool=pool,
    )
    job.full_clean()
    job.save()
    schedule.submit(job)

    def ended():
        job.refresh_from_db()
        return job.phase in (Phase.COMPLETED, Phase.FAILED, Phase.TERMINATED)

    wait_for(ended, timeout=90, message="the job on the TLS engine to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason
    run = job.attempts.get().task_runs.get()
    assert run.host_id == host.id


def test_a_followed_log_over_tls_outlives_its_clients_bound(tls_engine, certificates):
    """A follower's client is bounded now (follow.FOLLOWER_CALL_TIMEOUT_S); over TLS too its
    followed log turns its socket's timeout off."""
    d, url = tls_engine
    image = subprocess.run(["docker", "save", BUSYBOX], capture_output=True, check=True).stdout
    on_the_engine = docker.DockerClient(base_url=d.socket, timeout=60)
    on_the_engine.images.load(image)
    followed_through_a_bounded_client(tls_host(url, certificates), on_the_engine)
