"""The release: ``python -m build`` gives an sdist and a platform wheel (with the
Cleaner's C path, ``schemaless.cleaner._rows``) that ``twine check`` accepts; the wheel,
installed into a fresh virtual environment outside the checkout,
runs the CLI and a put/get against the test servers.

Fast and offline: the build uses this venv's setuptools (``--no-isolation``); the
fresh venv has no pip of its own (this venv's pip installs into it with ``--python``)
and gets the dependencies (mysqlclient, msgpack, zstandard, click) from a directory of
links to this venv's copies, named in a ``.pth`` file, so none of them is compiled or
downloaded; ``pip install --no-index`` still checks the wheel's declared requirements
against them.  Nothing of the checkout is importable there (no editable finder, no
``pythonpath``, the working directory is a temporary one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import uuid
import zipfile
from pathlib import Path

from conftest import REPO
from test_cli import cluster_env, drop_prefix

import schemaless
from schemaless.local import LocalCluster

DEPENDENCIES = ("MySQLdb", "mysqlclient-", "msgpack", "zstandard", "click")


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _fresh_venv(tmp: Path) -> Path:
    """A venv without pip whose only extra path is a directory of the dependencies."""
    _run(sys.executable, "-m", "venv", "--without-pip", tmp / "venv", cwd=tmp)
    python = tmp / "venv" / "bin" / "python"
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp
        ).strip()
    )
    deps = tmp / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_path("purelib"))
    for entry in ours.iterdir():
        if entry.name.startswith(DEPENDENCIES):
            (deps / entry.name).symlink_to(entry)
    (site / "deps.pth").write_text(f"{deps}\n")
    return python


def test_built_wheel_works_outside_the_checkout(
    local_cluster: LocalCluster, tmp_path: Path
) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, REPO, cwd=tmp_path)
    version = schemaless.__version__
    # a platform wheel: it carries the Cleaner's C path (schemaless.cleaner._rows)
    wheels = list(dist.glob(f"schemaless_mysql-{version}-cp3*-linux_*.whl"))
    sdist = dist / f"schemaless_mysql-{version}.tar.gz"
    assert len(wheels) == 1 and sdist.exists(), sorted(p.name for p in dist.iterdir())
    wheel = wheels[0]
    with tarfile.open(sdist) as tar:
        sources = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"cleaner/_rows.c", "cleaner/_rows.pyi"} <= sources
    assert "PASSED" in _run(
        sys.executable, "-m", "twine", "check", "--strict", wheel, sdist, cwd=tmp_path
    )
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {
        "schemaless",
        f"schemaless_mysql-{version}.dist-info",
    }
    assert {"schemaless/py.typed", "schemaless/aio.py", "schemaless/cli/main.py"} <= set(names)
    assert "schemaless/cleaner/daemon.py" in names
    assert "schemaless/cleaner/_rows.pyi" in names
    assert any(n.startswith("schemaless/cleaner/_rows.") and n.endswith(".so") for n in names)

    python = _fresh_venv(tmp_path)
    _run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        python,
        "install",
        "-q",
        "--no-index",
        wheel,
        cwd=tmp_path,
    )
    bin_dir = python.parent
    prefix = "w_" + uuid.uuid4().hex[:10]
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    env.update({k: v for k, v in cluster_env(local_cluster, prefix).items() if v is not None})
    try:
        assert version in _run(bin_dir / "schemaless", "--version", cwd=tmp_path, env=env)
        assert "--index" in _run(bin_dir / "cleaner", "--help", cwd=tmp_path, env=env)
        _run(bin_dir / "schemaless", "init", "--shards", "4", cwd=tmp_path, env=env)
        key = uuid.uuid4().hex
        put = subprocess.run(
            [bin_dir / "schemaless", "put"],
            input=json.dumps({"id": key, "title": "from the wheel"}),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert put.returncode == 0, put.stderr
        got = json.loads(_run(bin_dir / "schemaless", "get", key, "--json", cwd=tmp_path, env=env))
        assert got["title"] == "from the wheel"
        script = (
            "import schemaless, sys; from schemaless import DataStore, new_id\n"
            "from schemaless.aio import DataStore as AsyncDataStore\n"
            f"ds = DataStore({local_cluster.addresses!r}, prefix={prefix!r}, "
            f"option_file={str(local_cluster.option_file)!r})\n"
            "k = new_id(); ds.put({'id': k, 'n': 1}); assert ds.get(k)['n'] == 1\n"
            "from schemaless.cleaner import batch; assert batch._rows is not None\n"
            "print(schemaless.__file__, schemaless.__version__)\n"
        )
        where, seen = _run(python, "-c", script, cwd=tmp_path, env=env).split()
        assert Path(where).is_relative_to(tmp_path / "venv") and seen == version
    finally:
        drop_prefix(local_cluster, prefix)
