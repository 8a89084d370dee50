"""The package installs offline (pip --no-build-isolation, the system's
setuptools) into a virtual environment, and imports from there."""
import os
import shutil
import subprocess
import sys


PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_into_a_venv(tmp_path):
    # A copy: pip builds in the tree it is given (build/, *.egg-info).
    source = tmp_path / "pg-throttle"
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
    venv = tmp_path / "venv"
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    made = subprocess.run([python, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True, text=True)
    # The test command installs python3-venv wherever it runs this suite.
    assert made.returncode == 0, f"python3 -m venv: {made.stderr.strip()}"
    bin_python = str(venv / "bin" / "python")
    installed = subprocess.run([bin_python, "-m", "pip", "install", "--no-build-isolation", "--no-index",
                                "--disable-pip-version-check", "--quiet", str(source)],
                               capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shown = subprocess.run(
        [bin_python, "-c", "import os, importlib.metadata as m, pg_throttle; "
         "print(pg_throttle.__version__, m.version('pg-throttle'), pg_throttle.__file__, "
         "os.path.exists(os.path.join(os.path.dirname(pg_throttle.__file__), 'py.typed')), "
         "sorted(m.requires('pg-throttle')))"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    version, dist_version, path, typed, requires = shown.stdout.split(" ", 4)
    assert (version, dist_version, typed) == ("0.4.0", "0.4.0", "True")
    assert path.startswith(str(venv))
    assert "psycopg" in requires and ">=3.1" in requires
