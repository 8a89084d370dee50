"""Connections to the cluster the suite runs against (libpq environment)."""
import psycopg2


def connect(autocommit=True, **kwargs):
    conn = psycopg2.connect("", **kwargs)
    conn.autocommit = autocommit
    return conn


def sql_error(conn, statement, params=None):
    """Runs `statement`; returns (sqlstate, message, hint), or None when it succeeds."""
    try:
        with conn.cursor() as cur:
            cur.execute(statement, params)
        return None
    except psycopg2.Error as e:
        diag = e.diag
        return (e.pgcode, diag.message_primary, diag.message_hint)
