"""The Docker deployment (docker/), checked without a Docker engine.

The compose file is parsed (PyYAML) and its services, ports, healthchecks, ordering and
credentials are checked against the Dockerfile, pyproject's console scripts and the
commands that docs/scale-out.md shows.  The entrypoint and the MariaDB init script are
run with stand-ins for the programs they call.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

REPO = Path(__file__).resolve().parent.parent
DOCKER = REPO / "docker"
DBS = ("db1", "db2", "db3")
INIT_COMMAND = "schemaless init --server db1:3306 --server db2:3306 --server db3:3306 --shards 64"
CREDENTIALS = re.compile(r"PASSWORD|USER")
REFERENCE = re.compile(r"\$\{([A-Z][A-Z0-9_]*)(?::?[-?][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(doc, dict)
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = compose["services"]
    return out


def console_scripts() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    scripts: dict[str, str] = project["project"]["scripts"]
    return scripts


def env_example() -> dict[str, str]:
    out = {}
    for line in (DOCKER / ".env.example").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> source, for short-syntax volumes."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *_ = str(volume).split(":")
        out[target] = source
    return out


def dockerfile_instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` with continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (DOCKER / "Dockerfile").read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def dockerignored(path: str) -> bool:
    """Whether docker/Dockerfile.dockerignore keeps ``path`` out of the build context
    (last matching rule wins; a rule on a parent directory covers its content)."""
    rules = [
        line.strip()
        for line in (DOCKER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for rule in rules:
        negate = rule.startswith("!")
        pattern = rule.lstrip("!").strip("/")
        patterns = {pattern, pattern.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(c, p) for c in candidates for p in patterns):
            excluded = not negate
    return excluded


# -- the compose file -------------------------------------------------------------------


def test_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {*DBS, "init", "cleaner"}


def test_databases_have_healthchecks_ports_and_durable_settings(
    services: dict[str, dict[str, Any]],
) -> None:
    host_ports, volumes, server_ids = set(), set(), set()
    for name in DBS:
        db = services[name]
        assert db["image"] == "mariadb:10.11"
        assert db["restart"] == "unless-stopped"
        test = db["healthcheck"]["test"]
        assert test[0] == "CMD"
        assert test[1:] == ["healthcheck.sh", "--connect", "--innodb_initialized"] or (
            "mariadb-admin" in test and "ping" in test
        )
        (port,) = db["ports"]
        host, host_port, container_port = str(port).split(":")
        assert host == "127.0.0.1" and container_port == "3306"
        host_ports.add(int(host_port))
        where = mounts(db)
        volumes.add(where["/var/lib/mysql"])
        (server_id,) = [a for a in db["command"] if a.startswith("--server-id=")]
        server_ids.add(server_id)
        config = DOCKER / where["/etc/mysql/conf.d/schemaless.cnf"]
        settings = {
            k.strip(): v.strip()
            for k, _, v in (
                line.partition("=")
                for line in config.read_text().splitlines()
                if "=" in line and not line.lstrip().startswith("#")
            )
        }
        assert settings["innodb_flush_log_at_trx_commit"] == "1"
        assert settings["sync_binlog"] == "1"
        assert settings["character-set-server"] == "utf8mb4"
        assert settings["collation-server"] == "utf8mb4_nopad_bin"
        assert settings["binlog-format"] == "ROW"
        # the owned layout's triggers, created by a user without SUPER, binlog on
        assert settings["log_bin_trust_function_creators"] == "1"
        assert oct(config.stat().st_mode & 0o777) == "0o644"  # mariadbd skips writable ones
        initdb = DOCKER / where["/docker-entrypoint-initdb.d"]
        scripts = sorted(initdb.glob("*.sh"))
        assert scripts and all(not os.access(s, os.X_OK) for s in scripts)  # sourced
    assert len(host_ports) == len(volumes) == len(server_ids) == len(DBS)


def test_credentials_come_from_the_env_file(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    example = env_example()
    assert {"MARIADB_ROOT_PASSWORD", "SCHEMALESS_USER", "SCHEMALESS_PASSWORD"} <= set(example)
    assert ".env" in (DOCKER / ".gitignore").read_text().split()
    for name, service in services.items():
        env = service.get("environment", {})
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        for key, value in env.items():
            if CREDENTIALS.search(key):
                match = REFERENCE.fullmatch(str(value))
                assert match, f"{name}: {key} is written inline"
                assert match.group(1) in example, f"{name}: {key} not in .env.example"
        if name not in DBS:
            assert "MARIADB_ROOT_PASSWORD" not in env
    text = (DOCKER / "compose.yaml").read_text()
    for key, value in example.items():
        if "PASSWORD" in key:
            assert value not in text  # no example password copied into the compose file


def test_init_runs_once_after_the_databases_are_healthy(
    services: dict[str, dict[str, Any]],
) -> None:
    init = services["init"]
    assert " ".join(init["command"]) == INIT_COMMAND
    assert init["depends_on"] == {db: {"condition": "service_healthy"} for db in DBS}
    assert init["restart"] == "no"


def test_cleaner_runs_after_init_with_the_same_url(services: dict[str, dict[str, Any]]) -> None:
    init, cleaner = services["init"], services["cleaner"]
    assert cleaner["depends_on"] == {"init": {"condition": "service_completed_successfully"}}
    assert cleaner["restart"] == "unless-stopped"
    assert cleaner["command"][0] == "cleaner"
    first_server = init["command"][init["command"].index("--server") + 1]
    assert cleaner["environment"]["SCHEMALESS_URL"] == first_server == "db1:3306"
    for key in ("SCHEMALESS_URL", "SCHEMALESS_USER", "SCHEMALESS_PASSWORD", "SCHEMALESS_PREFIX"):
        assert cleaner["environment"][key] == init["environment"][key]
    port = cleaner["command"][cleaner["command"].index("--metrics-port") + 1]
    assert any(port in part for part in cleaner["healthcheck"]["test"])


def test_the_app_services_build_the_image(services: dict[str, dict[str, Any]]) -> None:
    scripts = console_scripts()
    assert {"schemaless", "cleaner"} <= set(scripts)
    for name in ("init", "cleaner"):
        service = services[name]
        assert (DOCKER / service["build"]["context"]).resolve() == REPO
        assert (REPO / service["build"]["dockerfile"]).resolve() == DOCKER / "Dockerfile"
        assert service["image"] == services["init"]["image"]
        assert service["command"][0] in scripts
        assert service["init"] is True


# -- the image --------------------------------------------------------------------------


def test_dockerfile_builds_the_package_as_a_non_root_user() -> None:
    steps = dockerfile_instructions()
    args = dict(a.split("=", 1) for kind, a in steps if kind == "ARG" and "=" in a)  # ARG defaults
    bases = [a.split()[0] for kind, a in steps if kind == "FROM"]
    assert [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], b) for b in bases] == [
        "python:3.11-slim"
    ] * 2
    stages: list[list[tuple[str, str]]] = []
    for kind, a in steps:
        if kind == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((kind, a))
    build, final = stages
    build_runs = " ".join(a for kind, a in build if kind == "RUN")
    assert "apt-get install" in build_runs
    assert {"gcc", "pkg-config"} <= set(build_runs.split())
    assert {"libmariadb-dev", "default-libmysqlclient-dev"} & set(build_runs.split())
    assert re.search(r'pip (wheel|install)\b[^&]*\s"?\.(\[metrics\])?"?(\s|$)', build_runs)
    final_runs = " ".join(a for kind, a in final if kind == "RUN")
    assert "pip install" in final_runs and "schemaless --version" in final_runs
    users = [a for kind, a in final if kind == "USER"]
    assert users and users[-1] not in ("root", "0")
    (entrypoint,) = [a for kind, a in final if kind == "ENTRYPOINT"]
    copied = {
        a.split()[-1]: a.split()[-2]
        for kind, a in final
        if kind == "COPY" and not a.startswith("--from")
    }
    target = next(t for t in copied if Path(t).name in entrypoint)
    assert copied[target] == "docker/entrypoint.sh"


def test_the_build_context_holds_what_the_package_needs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", project["project"]["readme"]}
    needed |= set(project["project"].get("license-files", []))
    needed |= set(project["tool"]["setuptools"]["package-dir"].values())
    runs = " ".join(a for kind, a in dockerfile_instructions() if kind == "RUN")
    name = re.escape(project["project"]["name"])  # the distribution, not the import name
    assert re.search(rf'pip install\b[^&]*\s"?{name}(\[metrics\])?"?(\s|$)', runs), runs
    assert "[metrics]" in runs  # the Cleaner's --metrics-port needs prometheus_client
    sources = set()
    for kind, a in dockerfile_instructions():
        if kind == "COPY" and not a.startswith("--from"):
            sources.update(a.split()[:-1])
    assert needed <= sources
    for source in sources:
        assert (REPO / source).exists(), source
        assert not dockerignored(source), f"{source} is excluded from the build context"
    for private in (".venv", ".pytest-cluster", ".schemaless-local", ".git", "docker/.env"):
        assert dockerignored(private)
    assert dockerignored("schemaless/__pycache__/store.cpython-311.pyc")


def fake_bin(tmp_path: Path) -> dict[str, str]:
    """A PATH where ``schemaless`` and ``cleaner`` print their argv and password."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("schemaless", "cleaner"):
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $* [${{SCHEMALESS_PASSWORD:-}}]"\n')
        script.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["schemaless", "init", "--shards", "64"], "schemaless init --shards 64 []"),
        (["cleaner", "--once"], "cleaner --once []"),
        (["index", "list"], "schemaless index list []"),
        ([], "schemaless  []"),
    ],
)
def test_entrypoint_runs_the_console_scripts(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    done = subprocess.run(
        ["sh", str(DOCKER / "entrypoint.sh"), *args],
        env=fake_bin(tmp_path),
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == expected.strip()


def test_entrypoint_reads_the_password_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    env = {**fake_bin(tmp_path), "SCHEMALESS_PASSWORD_FILE": str(secret)}
    run = ["sh", str(DOCKER / "entrypoint.sh"), "cleaner"]
    done = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "cleaner  [s3cret]"
    both = subprocess.run(
        run, env={**env, "SCHEMALESS_PASSWORD": "x"}, capture_output=True, text=True
    )
    assert both.returncode == 2 and "not both" in both.stderr


def run_grants(prefix: str | None) -> subprocess.CompletedProcess[str]:
    """The initdb script with stand-ins for the MariaDB entrypoint's functions."""
    stubs = (
        "docker_sql_escape_string_literal() { printf '%s' \"$1\" | sed \"s/'/\\\\\\\\'/g\"; }\n"
        "mysql_note() { :; }\n"
        'mysql_error() { echo "ERROR $*" >&2; exit 1; }\n'
        'docker_process_sql() { echo "ARGS $*"; cat; }\n'
        f'. "{DOCKER / "initdb" / "10-schemaless-grants.sh"}"\n'
    )
    env = {"PATH": "/usr/bin:/bin", "MARIADB_USER": "app'user"}
    if prefix is not None:
        env["SCHEMALESS_PREFIX"] = prefix
    return subprocess.run(["bash", "-c", stubs], env=env, capture_output=True, text=True)


def test_the_database_user_is_granted_only_the_datastore() -> None:
    default = run_grants(None)
    assert default.returncode == 0, default.stderr
    assert "GRANT ALL PRIVILEGES ON `schemaless\\_%`.* TO 'app\\'user'@'%';" in default.stdout
    custom = run_grants("feed_2")
    assert "`feed\\_2\\_%`.*" in custom.stdout
    for bad in ("Feed", "a`b", "x;y", "9lives"):
        refused = run_grants(bad)
        assert refused.returncode != 0 and "SCHEMALESS_PREFIX" in refused.stderr


# -- the documentation ------------------------------------------------------------------


def docker_section() -> str:
    text = (REPO / "docs" / "scale-out.md").read_text()
    match = re.search(r"^## Docker deployment\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, "docs/scale-out.md has no '## Docker deployment' section"
    return match.group(1)


def compose_commands(section: str) -> list[list[str]]:
    """The ``docker compose ...`` lines of the section's code blocks, as argv."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", section, re.M | re.S)
    out = []
    for block in blocks:
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("docker compose"):
                out.append(shlex.split(line))
    return out


_GLOBAL_WITH_VALUE = {"-f", "--file", "--env-file", "--project-directory", "-p"}
_WITH_VALUE = {"-e", "--env", "-u", "--user", "-w", "--workdir", "--name", "--entrypoint"}
_SERVICE_LISTS = {"up", "logs", "stop", "start", "restart", "ps", "pull", "build", "rm"}
_SERVICE_FIRST = {"run", "exec"}
_TOOLS = {"mariadb", "mariadb-admin", "mariadb-backup", "mariadb-dump", "sh", "bash"}


def services_named(argv: list[str]) -> tuple[str, list[str], list[str]]:
    """``(subcommand, services, command run in the service)`` of one compose argv."""
    args = argv[2:]
    while args and args[0].startswith("-"):
        args = args[2:] if args[0] in _GLOBAL_WITH_VALUE else args[1:]
    sub, rest = args[0], args[1:]
    names: list[str] = []
    inner: list[str] = []
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("-"):
            i += 2 if arg in _WITH_VALUE else 1
            continue
        if sub in _SERVICE_FIRST:
            names.append(arg)
            inner = rest[i + 1 :]
            break
        if sub in _SERVICE_LISTS:
            names.append(arg)
        i += 1
    return sub, names, inner


def test_the_documented_commands_match_the_compose_file(
    services: dict[str, dict[str, Any]],
) -> None:
    section = docker_section()
    assert INIT_COMMAND in section
    assert "docker/.env.example" in section and "compose.yaml" in section
    commands = compose_commands(section)
    assert len(commands) >= 6, commands
    scripts = console_scripts()
    subcommands = set()
    for argv in commands:
        sub, names, inner = services_named(argv)
        subcommands.add(sub)
        for name in names:
            assert name in services, f"{shlex.join(argv)}: no service {name!r}"
        if inner:
            assert inner[0] in scripts or inner[0] in _TOOLS, shlex.join(argv)
    assert {"up", "run", "logs"} <= subcommands
