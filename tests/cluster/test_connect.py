"""Reaching clusters: `dask scheduler`/`dask worker` processes, TLS, unreachable addresses, configuration."""

import datetime
import ipaddress
import socket
import subprocess
import sys
import time
from pathlib import Path

import dask
import numpy as np
import pytest

import workbench as wb

SEED = 2


def local_and_remote(kit, client):
    m = kit.mlp()
    data = kit.blobs()
    local = wb.Session(m["graph"], seed=SEED, cluster=False)
    local.fit(m["train"], data, batch_size=12, steps=5)
    remote = wb.Session(m["graph"], seed=SEED, cluster=client)
    hist = remote.fit(m["train"], data, batch_size=12, steps=5, replicas=2)
    return local.variables, remote.variables, hist


# -- a scheduler and workers started with the dask commands -------------------------------------


@pytest.fixture(scope="module")
def cli_cluster(tmp_path_factory, dask_cli):
    processes = dask_cli(tmp_path_factory.mktemp("cli"))
    try:
        address = processes.scheduler()
        for i in range(2):
            processes.worker(address, f"w{i}")
        client = processes.connect(address, workers=2)
        try:
            yield address, client
        finally:
            client.close()
    finally:
        processes.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_dask_cli_cluster_trains_like_local(kit, cli_cluster):
    address, client = cli_cluster
    assert sorted(w["name"] for w in wb.cluster.info(client)["workers"]) == ["w0", "w1"]
    with wb.Session(kit.mlp()["graph"], cluster=address) as sess:  # an address: the session's own client
        assert sess.client is not client and sess.client.scheduler.address == address
    assert sess.client is None
    expected, got, hist = local_and_remote(kit, client)
    kit.assert_same_variables(expected, got, rtol=1e-9)
    assert all(len(r["workers"]) == 2 for r in hist.records)


def _user_sync(r):
    r.apply({v: wb.all_reduce(g * r.weight) for v, g in r.gradients.items()})


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("strategy", ["allreduce", _user_sync], ids=["built_in", "user_written"])
def test_a_sync_strategy_function_on_the_dask_cli_cluster_trains_like_local(kit, cli_cluster, strategy):
    """The built-in ``"allreduce"`` strategy function and one written by the user, on workers started
    with ``dask worker``: the variables of local training (float64, 1e-9), the run on both workers."""
    _, client = cli_cluster
    m = kit.mlp(optimizer=wb.optimizers.Momentum(0.05))
    data = kit.blobs()
    local = wb.Session(m["graph"], seed=SEED, cluster=False)
    local.fit(m["train"], data, batch_size=32, steps=6)
    function = wb.strategies.resolve(strategy) if isinstance(strategy, str) else strategy
    remote = wb.Session(m["graph"], seed=SEED, cluster=client)
    hist = remote.fit(m["train"], data, batch_size=32, steps=6, replicas=2, strategy=function)
    kit.assert_same_variables(local.variables, remote.variables, rtol=1e-9)
    assert all(r["replicas"] == 2 for r in hist.records)
    remote.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_configured_address_is_the_default(kit, cli_cluster):
    address, _ = cli_cluster
    m = kit.mlp()
    with dask.config.set({"workbench.cluster.address": address}):
        client = wb.cluster.connect(None)
        try:
            assert client.scheduler.address == address
        finally:
            client.close()
        default = wb.cluster.set_default()  # no argument: the configured address
    try:
        assert default.scheduler.address == address
        sess = wb.Session(m["graph"], seed=SEED)  # cluster=None: the default cluster
        assert sess.client is default
        hist = sess.fit(m["train"], kit.blobs(), batch_size=12, steps=3)
        assert hist["replicas"].tolist() == [2, 2, 2]
        sess.close()
        assert not default.status == "closed"  # a session never closes the default client
    finally:
        wb.cluster.close_default()
    assert wb.cluster.default_client() is None
    assert wb.Session(m["graph"]).client is None  # no default: local


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_set_default_with_an_address(kit, cli_cluster):
    address, _ = cli_cluster
    client = wb.cluster.set_default(address)
    try:
        assert wb.cluster.default_client() is client
        assert wb.Session(kit.mlp()["graph"]).client is client
    finally:
        wb.cluster.close_default()
    assert client.status == "closed"


# -- TLS ---------------------------------------------------------------------------------------


def make_certificates(directory: Path) -> dict:
    """A CA and one certificate it signed for 127.0.0.1, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def certificate(subject, key, issuer, issuer_key, ca):
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = certificate("workbench test CA", ca_key, "workbench test CA", ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = certificate("127.0.0.1", key, "workbench test CA", ca_key, ca=False)
    paths = {"ca": directory / "ca.pem", "cert": directory / "node.pem", "key": directory / "node.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return {k: str(v) for k, v in paths.items()}


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, dask_cli):
    from distributed import Security

    directory = tmp_path_factory.mktemp("tls")
    certs = make_certificates(directory)
    tls = ("--tls-ca-file", certs["ca"], "--tls-cert", certs["cert"], "--tls-key", certs["key"])
    security = Security(
        tls_ca_file=certs["ca"], tls_client_cert=certs["cert"], tls_client_key=certs["key"], require_encryption=True
    )
    processes = dask_cli(directory)
    try:
        address = processes.scheduler(*tls)
        for i in range(2):
            processes.worker(address, f"tls{i}", *tls)
        client = processes.connect(address, workers=2, security=security)
        try:
            yield address, security, client
        finally:
            client.close()
    finally:
        processes.stop()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tls_cluster_with_certificates_trains(kit, tls_cluster):
    address, security, client = tls_cluster
    assert address.startswith("tls://")
    assert all(w["address"].startswith("tls://") for w in wb.cluster.info(client)["workers"])
    expected, got, hist = local_and_remote(kit, client)
    kit.assert_same_variables(expected, got, rtol=1e-9)
    assert all(r["bytes_received"] > 0 for r in hist.records)  # the default all-reduce, worker to worker over TLS


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_tls_cluster_without_certificates_is_a_cluster_error(tls_cluster):
    address, _, _ = tls_cluster
    started = time.perf_counter()
    with pytest.raises(wb.ClusterError, match=r"127\.0\.0\.1"):
        wb.cluster.connect(address, timeout=3)
    assert time.perf_counter() - started < 3 + 10


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_plain_tcp_to_a_tls_scheduler_is_a_cluster_error(tls_cluster):
    address, _, _ = tls_cluster
    started = time.perf_counter()
    with pytest.raises(wb.ClusterError, match="cannot reach the Dask scheduler"):
        wb.cluster.connect(address.replace("tls://", "tcp://"), timeout=2)
    assert time.perf_counter() - started < 2 + 10


# -- addresses that do not work --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [1, "2s"])
def test_unreachable_address_fails_within_the_timeout(timeout, dask_cli):
    address = f"tcp://127.0.0.1:{dask_cli.free_port()}"  # nothing listens there
    seconds = dask.utils.parse_timedelta(timeout)
    started = time.perf_counter()
    with pytest.raises(wb.ClusterError, match=rf"cannot reach the Dask scheduler at {address} within {seconds:g} s"):
        wb.cluster.connect(address, timeout=timeout)
    assert time.perf_counter() - started < seconds + 10


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_configured_timeout_is_used(dask_cli):
    address = f"tcp://127.0.0.1:{dask_cli.free_port()}"
    started = time.perf_counter()
    with dask.config.set({"workbench.cluster.timeout": "1s"}):
        with pytest.raises(wb.ClusterError, match="within 1 s"):
            wb.Session(wb.Graph(), cluster=address)
    assert time.perf_counter() - started < 1 + 10


@pytest.mark.parametrize("address", ["127.0.0.1:8786", "localhost", "scheduler.example.org:8786"])
def test_address_without_protocol(address):
    with pytest.raises(wb.ClusterError, match=rf"needs a protocol, e.g. 'tcp://{address}'"):
        wb.cluster.connect(address)


@pytest.mark.parametrize("cluster", [42, 3.5, ["tcp://127.0.0.1:8786"]])
def test_not_a_cluster(cluster):
    with pytest.raises(wb.ClusterError, match="cannot use .* as a cluster"):
        wb.cluster.connect(cluster)


def test_configured_address_without_protocol_is_a_cluster_error():
    with dask.config.set({"workbench.cluster.address": "127.0.0.1:1"}):
        with pytest.raises(wb.ClusterError, match="needs a protocol"):
            wb.cluster.connect(None)


def test_replicas_without_a_cluster_are_simulated_in_one_process(kit):
    m = kit.mlp()
    hist = wb.Session(m["graph"], cluster=False).fit(m["train"], kit.blobs(), batch_size=8, steps=1, replicas=2)
    assert hist.records[0]["replicas"] == 2 and hist.records[0]["collectives"] > 0


def test_values_are_numpy_after_a_local_fit(kit):
    m = kit.mlp()
    sess = wb.Session(m["graph"], cluster=False)
    sess.fit(m["train"], kit.blobs(), batch_size=8, steps=1)
    assert all(isinstance(v, np.ndarray) for v in sess.variables.values())


# -- security= on Session and %flow_cluster ----------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_session_takes_security_for_a_tls_address(kit, tls_cluster):
    """Fixes: a tls:// cluster needed a hand-made Client."""
    address, security, _ = tls_cluster
    m = kit.mlp()
    with wb.Session(m["graph"], seed=SEED, cluster=address, security=security) as sess:
        assert sess.client.scheduler.address == address
        hist = sess.fit(m["train"], kit.blobs(), batch_size=12, steps=2)
        assert hist["replicas"].tolist() == [2, 2]
    assert sess.client is None


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_tls_address_uses_the_configured_certificates(kit, tls_cluster):
    address, security, _ = tls_cluster
    keys = {
        "distributed.comm.tls.ca-file": security.tls_ca_file,
        "distributed.comm.tls.client.cert": security.tls_client_cert,
        "distributed.comm.tls.client.key": security.tls_client_key,
        "distributed.comm.require-encryption": True,
    }
    with dask.config.set(keys):
        with wb.Session(kit.mlp()["graph"], cluster=address) as sess:
            assert len(wb.cluster.info(sess.client)["workers"]) == 2
    with pytest.raises(wb.ClusterError, match=r"needs TLS certificates: pass security=distributed.Security"):
        wb.cluster.connect(address, timeout=3)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_flow_cluster_takes_security_by_name(tls_cluster):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    address, security, _ = tls_cluster
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "workbench")
    ip.user_ns["certs"] = security
    try:
        view = ip.run_line_magic("flow_cluster", f"{address} --security certs")
        assert wb.cluster.default_client().scheduler.address == address
        assert len(view.info["workers"]) == 2 and view.message == f"new sessions run on {address}"
    finally:
        wb.cluster.close_default()
        ip.user_ns.pop("certs", None)
    with pytest.raises(UsageError, match="expected a distributed.Security, 'nowhere' is nothing"):
        ip.run_line_magic("flow_cluster", f"{address} -s nowhere")


# -- peers that are not schedulers: an answer within the timeout --------------------------------


class Peer:
    """A TCP server on 127.0.0.1 that does one thing to every connection: nothing, or send ``reply``."""

    def __init__(self, reply: bytes | None = None, close: bool = False):
        import threading

        self.reply, self.close_after, self.connections = reply, close, []
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.address = f"tcp://127.0.0.1:{self.socket.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return  # closed
            self.connections.append(conn)
            if self.reply is not None:
                conn.sendall(self.reply)
            if self.close_after:
                conn.close()

    def stop(self):
        self.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept() of the serving thread
        self.socket.close()
        for conn in self.connections:
            conn.close()
        self.thread.join(timeout=5)


HTTP_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\n\r\nBad Request"


@pytest.mark.slow
@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "reply, close, message",
    [
        (None, False, r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:\d+ within 3 s: no answer"),
        (
            HTTP_400,
            True,
            r"answered, but not as a Dask scheduler \(MemoryError.*the dashboard \(by default on port 8787",
        ),
        (b"\xff" * 64 + b"garbage", False, r"answered, but not as a Dask scheduler"),
    ],
    ids=["accepts-and-stays-silent", "http-reply", "garbage"],
)
def test_a_peer_that_is_not_a_scheduler_is_a_cluster_error_within_the_timeout(reply, close, message):
    """Fixes: a silent peer took 122 s with a 10 s timeout; an HTTP reply let a bare MemoryError out."""
    peer = Peer(reply, close)
    try:
        started = time.perf_counter()
        with pytest.raises(wb.ClusterError, match=message):
            wb.cluster.connect(peer.address, timeout=3)
        assert time.perf_counter() - started < 3 + 5
        assert peer.connections  # it did accept
    finally:
        peer.stop()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_silent_http_server_is_a_cluster_error_within_the_timeout(tmp_path):
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        port = int(line.split(" port ")[1].split()[0])
        started = time.perf_counter()
        with pytest.raises(wb.ClusterError, match="within 2 s: no answer"):
            with dask.config.set({"workbench.cluster.timeout": "2s"}):
                wb.Session(wb.Graph(), cluster=f"tcp://127.0.0.1:{port}")
        assert time.perf_counter() - started < 2 + 5
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_worker_address_is_not_a_scheduler(cli_cluster):
    _, client = cli_cluster
    worker = wb.cluster.info(client)["workers"][0]["address"]
    with pytest.raises(wb.ClusterError, match=f"{worker} is a Dask Worker, not a scheduler"):
        wb.cluster.connect(worker, timeout=5)


# -- the embedded cluster listens on loopback only ---------------------------------------------


def _listening(pids) -> set:
    import psutil

    found = set()
    for pid in pids:
        try:
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    found.add((pid, conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_embedded_cluster_listens_on_loopback_only():
    """Fixes: the local cluster's dashboard listened on 0.0.0.0 while its link said 127.0.0.1."""
    import urllib.request

    import psutil

    me = psutil.Process()
    before = _listening([me.pid])
    others = {p.pid for p in me.children(recursive=True)}  # processes other tests started
    with wb.Session(wb.Graph(), cluster="local") as sess:
        sess.client.wait_for_workers(1, timeout=60)
        children = [p.pid for p in me.children(recursive=True) if p.pid not in others]
        opened = (_listening([me.pid]) - before) | _listening(children)
        link = sess.client.dashboard_link
        with urllib.request.urlopen(link, timeout=20) as page:  # the link works
            assert page.status == 200
    assert children and len(opened) >= 2 + len(children)  # scheduler, dashboard, and each worker and nanny
    assert {ip for _, ip, _ in opened} == {"127.0.0.1"}, opened
    assert link.startswith("http://127.0.0.1:")


# -- dask-gateway, through the configuration ------------------------------------------------------


class FakeGatewayCluster:
    """What dask_gateway.GatewayCluster offers workbench: a client, and close() that shuts down only
    the clusters this client started."""

    def __init__(self, name: str, started: bool, log: list):
        self.name, self.shutdown_on_close, self.log = name, started, log

    def get_client(self, set_as_default=True):
        client = type("Client", (), {})()
        client.cluster, client.scheduler = self, type("Rpc", (), {"address": f"gateway://gw:80/{self.name}"})()
        client.close = lambda: self.log.append(("client closed", self.name))
        self.log.append(("client", self.name, set_as_default))
        return client

    def close(self):
        self.log.append(("shut down" if self.shutdown_on_close else "left running", self.name))


@pytest.fixture
def fake_gateway(monkeypatch):
    import sys
    import types

    log = []

    class Gateway:
        def connect(self, name):
            if name == "missing":
                raise ValueError(f"no cluster named {name!r}")
            return FakeGatewayCluster(name, started=False, log=log)

        def new_cluster(self):
            return FakeGatewayCluster("new-1", started=True, log=log)

    monkeypatch.setitem(sys.modules, "dask_gateway", types.SimpleNamespace(Gateway=Gateway))
    return log


def test_gateway_address_reaches_a_named_cluster_and_leaves_it_running(fake_gateway):
    with dask.config.set({"workbench.cluster.address": "gateway", "workbench.cluster.gateway-cluster": "team-a"}):
        client = wb.cluster.set_default()
    assert client.cluster.name == "team-a" and ("client", "team-a", False) in fake_gateway
    message = wb.cluster.close_default()
    assert message == "disconnected from gateway://gw:80/team-a; that cluster keeps running"
    assert ("left running", "team-a") in fake_gateway


def test_gateway_without_a_name_starts_a_cluster_and_shuts_it_down(fake_gateway):
    with dask.config.set({"workbench.cluster.address": "gateway"}):
        wb.cluster.set_default()
    assert "is shut down" in wb.cluster.close_default()
    assert fake_gateway[-1] == ("shut down", "new-1")


def test_gateway_errors_are_cluster_errors(fake_gateway, monkeypatch):
    with dask.config.set({"workbench.cluster.gateway-cluster": "missing"}):
        with pytest.raises(wb.ClusterError, match="cannot get cluster 'missing' from the dask-gateway: ValueError"):
            wb.cluster.connect("gateway")
    monkeypatch.setitem(__import__("sys").modules, "dask_gateway", None)
    with pytest.raises(wb.ClusterError, match="needs dask-gateway"):
        wb.cluster.connect("gateway")
