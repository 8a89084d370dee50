"""A throwaway Citus cluster of three nodes on loopback for the scale-out suite:
a coordinator and two workers, each preloading citus and pg_throttle."""
import os
import shutil
import subprocess
import tempfile

from cluster import BIN, OwnServer

MAX_LEASE_S = 6


def citus_missing():
    """Why the suite cannot run here, or None when Citus is installed."""
    libdir, sharedir = subprocess.run([f"{BIN}/pg_config", "--pkglibdir", "--sharedir"],
                                      capture_output=True, text=True).stdout.split()
    for path in (os.path.join(libdir, "citus.so"),
                 os.path.join(sharedir, "extension", "citus.control")):
        if not os.path.exists(path):
            return f"Citus is not installed for this server (no {path})"
    return None


class Node(OwnServer):
    def __init__(self, directory, name, port, extra_conf=""):
        super().__init__(os.path.join(directory, name), port, f"""
shared_preload_libraries = 'citus,pg_throttle'
pg_throttle.max_lease = {MAX_LEASE_S}
max_prepared_transactions = 100
wal_level = logical
max_connections = 100
fsync = off
citus.shard_replication_factor = 1
{extra_conf}""", host="127.0.0.1")
        self.name = name


class CitusCluster:
    """A coordinator and two workers; stop() removes everything."""

    def __init__(self, base_port, extra_conf=""):
        """extra_conf: postgresql.conf lines for every node, after (so over) the suite's."""
        self.directory = tempfile.mkdtemp(prefix="pg_throttle_citus.")
        os.chmod(self.directory, 0o755)
        self.coordinator = Node(self.directory, "coordinator", base_port, extra_conf)
        self.workers = [Node(self.directory, f"worker{i}", base_port + i, extra_conf) for i in (1, 2)]
        self.nodes = [self.coordinator, *self.workers]

    def start(self):
        for node in self.nodes:
            node.init()
        for node in self.nodes:
            conn = node.connect()
            with conn.cursor() as cur:
                cur.execute("CREATE EXTENSION citus")
            conn.close()
        conn = self.coordinator.connect()
        with conn.cursor() as cur:
            cur.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)",
                        (self.coordinator.port,))
            for worker in self.workers:
                cur.execute("SELECT citus_add_node('127.0.0.1', %s)", (worker.port,))
            cur.execute("CREATE EXTENSION pg_throttle")
        conn.close()

    def stop(self):
        for node in self.nodes:
            try:
                node.ctl("stop", "-m", "immediate")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.directory, ignore_errors=True)

    def worker_of_port(self, port):
        return next(w for w in self.workers if w.port == port)
