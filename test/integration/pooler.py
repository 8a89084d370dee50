"""A PgBouncer of the test's own, in transaction pooling mode, in front of the
cluster the libpq environment names (pg_virtualenv's). Used by pgbouncer.py.

Three pooler databases lead to the same server database:
  <PGDATABASE>  default_pool_size server connections (the clients' pool)
  pair          2 server connections
  single        1 server connection: every client shares one backend
  session       1 server connection in session pooling (reset with DISCARD ALL
                between clients, PgBouncer's default server_reset_query)
"""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import psycopg2


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    def __init__(self, pool_size=3, max_client_conn=60):
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.port = None
        self.dir = None
        self.proc = None

    def _config(self):
        env = os.environ
        host = env.get("PGHOST", "127.0.0.1")
        server = (f"host={host} port={env.get('PGPORT', '5432')} "
                  f"dbname={env.get('PGDATABASE', 'postgres')}")
        user = env.get("PGUSER", "postgres")
        # The userlist holds the plain password: PgBouncer needs it to log in to the
        # server with SCRAM (pg_virtualenv's pg_hba.conf), and checks the clients'
        # SCRAM logins against it.
        with open(os.path.join(self.dir, "userlist.txt"), "w") as f:
            f.write(f'"{user}" "{env.get("PGPASSWORD", "")}"\n')
        with open(os.path.join(self.dir, "pgbouncer.ini"), "w") as f:
            f.write(f"""[databases]
{env.get('PGDATABASE', 'postgres')} = {server}
pair = {server} pool_size=2
single = {server} pool_size=1
session = {server} pool_size=1 pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
pidfile = {self.dir}/pgbouncer.pid
auth_type = scram-sha-256
auth_file = {self.dir}/userlist.txt
admin_users = {user}
pool_mode = transaction
default_pool_size = {self.pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = {self.max_client_conn}
ignore_startup_parameters = extra_float_digits,options
""")

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="pg_throttle_pgbouncer.")
        self.port = free_port()
        self._config()
        cmd = ["pgbouncer"]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root; -u drops to another user after start,
            # who must still read the config (written here, 0600).
            user = "postgres"
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                user, pw = "nobody", pwd.getpwnam("nobody")
            for name in os.listdir(self.dir) + [""]:
                os.chown(os.path.join(self.dir, name), pw.pw_uid, pw.pw_gid)
            cmd += ["-u", user]
        cmd.append(os.path.join(self.dir, "pgbouncer.ini"))
        self.log = open(os.path.join(self.dir, "pgbouncer.log"), "w")
        # A process group of its own, so that stop() ends it and nothing else.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + 15
        while True:
            try:
                self.connect().close()
                return self
            except psycopg2.OperationalError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PgBouncer did not start:\n{self.log_tail()}")
                time.sleep(0.05)

    def connect(self, dbname=None, autocommit=True):
        """A client connection through the pooler (psycopg2, autocommit by default:
        in transaction pooling each statement may be served by another backend)."""
        conn = psycopg2.connect("", host="127.0.0.1", port=self.port,
                                dbname=dbname or os.environ.get("PGDATABASE", "postgres"))
        conn.autocommit = autocommit
        return conn

    def admin(self, command):
        """Runs a command of PgBouncer's admin console; returns its rows as dicts."""
        conn = psycopg2.connect("", host="127.0.0.1", port=self.port, dbname="pgbouncer")
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(command)
                if cur.description is None:
                    return []
                names = [d[0] for d in cur.description]
                return [dict(zip(names, row)) for row in cur.fetchall()]
        finally:
            conn.close()

    def log_tail(self, lines=20):
        try:
            with open(os.path.join(self.dir, "pgbouncer.log")) as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if self.proc is not None:
            self.log.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        self.proc = self.dir = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
