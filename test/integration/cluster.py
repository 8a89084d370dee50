"""Control of the cluster a suite runs against (pg_virtualenv's cluster <version>/regress):
restarts, crashes (a backend or the postmaster killed with SIGKILL), its log; and servers a
suite runs itself (OwnServer)."""
import glob
import os
import signal
import subprocess
import time

import psycopg2

from pgconn import connect, one

# The server's binaries: pg_virtualenv's version, else the pg_config on PATH.
BIN = subprocess.run([os.environ.get("PG_CONFIG", "pg_config"), "--bindir"], capture_output=True, text=True,
                     check=True).stdout.strip()
PG_VERSION = os.environ.get("PGVERSION") or os.path.basename(os.path.dirname(BIN))


def as_postgres(*command):
    """Runs `command` as the postgres user (for servers a suite builds itself)."""
    return subprocess.run(["runuser", "-u", "postgres", "--", *command], check=True,
                          capture_output=True, text=True)


class OwnServer:
    """A throwaway server a suite runs itself in `directory` (initdb and pg_ctl as the postgres
    user), with `conf` appended to its postgresql.conf. It listens on `host` when one is given,
    else only on a Unix socket in `directory` (so servers in different directories may share a
    port number)."""

    def __init__(self, directory, port, conf="", host=None):
        self.directory = directory
        self.data = os.path.join(directory, "data")
        self.port = port
        self.conf = conf
        self.host = host

    def init(self):
        """initdb, configure and start."""
        self.make_directory()
        as_postgres(f"{BIN}/initdb", "-D", self.data, "-A", "trust", "-U", "postgres",
                    "--no-sync")
        self.configure()
        self.ctl("start")

    def make_directory(self):
        os.makedirs(self.directory)
        subprocess.run(["chown", "-R", "postgres:postgres", self.directory], check=True)

    def configure(self):
        """Appends the server's settings (later lines win over a copied primary's)."""
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write(f"""
listen_addresses = '{self.host or ''}'
port = {self.port}
unix_socket_directories = '{self.directory}'
{self.conf}
""")

    def ctl(self, action, *extra):
        as_postgres(f"{BIN}/pg_ctl", "-D", self.data, "-l", os.path.join(self.directory, "log"),
                    "-w", action, *extra)

    def address(self):
        """libpq keywords that reach the server."""
        return {"host": self.host or self.directory, "port": self.port}

    def connect(self, dbname="postgres", user="postgres", autocommit=True):
        conn = psycopg2.connect(dbname=dbname, user=user, **self.address())
        conn.autocommit = autocommit
        return conn

    def log(self):
        try:
            with open(os.path.join(self.directory, "log")) as f:
                return f.read()
        except OSError:
            return ""


def pg_ctlcluster(action, *extra):
    subprocess.run(["pg_ctlcluster", PG_VERSION, "regress", action, *extra], check=True,
                   capture_output=True, text=True)


def server_log():
    return subprocess.run(["bash", "-c", "cat /tmp/pg_virtualenv.*/log/*.log 2>/dev/null"],
                          capture_output=True, text=True).stdout


def reconnect(**kwargs):
    """A connection once the server accepts them again (None after 30 s)."""
    for _ in range(300):
        try:
            return connect(**kwargs)
        except Exception:  # noqa: BLE001 - the server is restarting
            time.sleep(0.1)
    return None


def execute(conn, sql, params=None):
    with conn.cursor() as cur:
        cur.execute(sql, params)


def gone(pid):
    """Whether process `pid` has exited (a zombie counts)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def kill_backend(conn):
    """SIGKILL the backend of `conn`: PostgreSQL then reinitialises shared
    memory. Returns once the postmaster has reaped it (and so begun the
    reinitialisation, refusing connections until it is done): a connection
    made before that would reach the old server and be cut by the reset."""
    pid = one(conn, "SELECT pg_backend_pid()")[0]
    os.kill(pid, signal.SIGKILL)
    conn.close()
    for _ in range(100):
        if not os.path.exists("/proc/%d" % pid):
            break
        time.sleep(0.1)


def kill_postmaster(data_dir, socket_dir="/var/run/postgresql"):
    """SIGKILL the postmaster of `data_dir` and wait for its backends to notice
    and exit. Where nobody reaps orphans (PID 1 of a container), the dead
    postmaster stays a zombie and its lock files name a "live" PID: they are
    removed when they name it."""
    with open(os.path.join(data_dir, "postmaster.pid")) as f:
        postmaster = int(f.readline())
    children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                              text=True).stdout.split()
    os.kill(postmaster, signal.SIGKILL)
    for _ in range(100):
        if all(gone(int(pid)) for pid in children + [str(postmaster)]):
            break
        time.sleep(0.1)
    for lock in glob.glob(os.path.join(socket_dir, ".s.PGSQL.*.lock")) + [
            os.path.join(data_dir, "postmaster.pid")]:
        try:
            with open(lock) as f:
                if f.readline().strip() == str(postmaster):
                    os.unlink(lock)
        except FileNotFoundError:
            pass
