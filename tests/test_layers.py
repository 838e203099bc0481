"""The modules import in layer order: each only from the layers below its own (so there
is no import cycle, and nothing low calls up into ``DataStore``).

Imports under ``if TYPE_CHECKING:`` are left out (they never run).  A new module goes
into the layer of what it needs; docs/architecture.md maps the same layers.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Lowest first.  ``cleaner``, ``cli`` and ``local`` stand for their whole packages.
LAYERS: list[set[str]] = [
    {"errors", "failpoints", "forking", "hashing", "keys", "wire"},
    {
        "names",
        "ids",
        "deadline",
        "health",
        "dsn",
        "latency",
        "codec",
        "clock",
        "jsonform",
        "results",
        "columns",
        "translate",
        "local",  # the development cluster: never imported by the library
    },
    {"entity", "schema", "index", "batch", "expiry", "locate", "owned"},
    {"connection", "counts"},  # a server's pool; counted indexes' keys and SQL
    {
        "catalogdb",
        "topology",
        "tables",
        "writes",
        "edgetables",
    },  # SQL builders; the catalog's base, snapshot
    {"shardmap", "indexstates", "checkpoints", "heartbeats", "dictionaries"},  # catalog parts
    {"catalog"},  # the catalog: created, loaded, its parts as one object
    {"scatter", "stale", "deferrals"},  # one batch per server; the catalog's deferrals
    {"cluster", "movesync"},  # routing; a move's row-level diff
    {"follow"},  # a call's deadline, following the map
    {"reader", "unique", "feed"},
    {"query", "protocol", "subscriptions", "fit"},  # fit: reader's newest entities
    {"counting"},  # DataStore.count's reads
    {"store"},  # DataStore, the facade
    {"dumpfiles"},  # what a dump's parts share
    {"dumptables"},  # a dump's module tables (edges, feeds)
    {"aio", "connect", "dump", "grants", "move", "hooks", "edges"},
    {"feeds"},  # timelines on edges
    {"demo", "__init__", "cleaner", "metrics", "tracing"},
    {"cli"},
]


def _sources() -> dict[str, list[Path]]:
    """Each layered name, and its files."""
    out: dict[str, list[Path]] = {p.stem: [p] for p in (REPO / "schemaless").glob("*.py")}
    for package in ("cleaner", "cli"):
        out[package] = sorted((REPO / package).glob("*.py"))
    out["local"] = sorted((REPO / "schemaless" / "local").glob("*.py"))
    return out


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The layered names a file imports at run time."""
    package = path.parent.name
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom):
                found.update(_targets(child, package, modules))
            elif isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("schemaless."):
                        found.update(_named(alias.name.split(".")[1:2], modules, alias.name))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def _targets(node: ast.ImportFrom, package: str, modules: set[str]) -> set[str]:
    if node.level == 1 and package in ("cleaner", "cli", "local"):
        return set()  # within the package
    if node.level >= 1:
        parts = (node.module or "").split(".") if node.module else []
        if node.level == 2 or package == "schemaless":
            if parts:
                return _named(parts[:1], modules, node.module or "")
            return {a.name if a.name in modules else "__init__" for a in node.names}
        return set()
    name = node.module or ""
    if name == "schemaless":
        return {a.name if a.name in modules else "__init__" for a in node.names}
    if name.startswith("schemaless."):
        return _named(name.split(".")[1:2], modules, name)
    return set()


def _named(parts: list[str], modules: set[str], full: str) -> set[str]:
    if not parts:
        return set()
    assert parts[0] in modules, f"import of {full}: not a module the layers know"
    return {parts[0]}


def test_every_module_has_a_layer_once() -> None:
    listed = [name for layer in LAYERS for name in layer]
    assert len(listed) == len(set(listed)), "a module in two layers"
    missing = set(_sources()) - set(listed)
    assert not missing, f"give these modules a layer in tests/test_layers.py: {sorted(missing)}"


def test_modules_import_only_from_the_layers_below() -> None:
    sources = _sources()
    layer = {name: n for n, names in enumerate(LAYERS) for name in names}
    wrong = []
    for name, paths in sorted(sources.items()):
        for path in paths:
            for target in sorted(_imports(path, set(sources))):
                if target != name and layer[target] >= layer[name]:
                    wrong.append(f"{path.relative_to(REPO)} imports {target}")
    assert not wrong, "imports up or across a layer:\n" + "\n".join(wrong)


def test_functions_fit_on_a_screen() -> None:
    long = []
    for paths in _sources().values():
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    where = f"{path.relative_to(REPO)}:{node.name}"
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    if lines > 60:
                        long.append(f"{where} ({lines} lines)")
    assert not long, "functions over 60 lines: " + ", ".join(long)


def test_the_map_in_docs_names_every_module() -> None:
    """docs/architecture.md opens with a map: every module of schemaless/ in it, and
    those of cleaner/ and cli/ in their package's paragraph."""
    text = (REPO / "docs" / "architecture.md").read_text()
    assert "\n## Map\n" in text
    map_ = text.split("\n## Map\n", 1)[1].split("\n## ", 1)[0]
    paragraphs = {p.split(" ", 1)[0]: p for p in map_.split("\n\n")}
    where = {"schemaless": map_, "cleaner": paragraphs["`cleaner/`"], "cli": paragraphs["`cli/`"]}
    missing = [
        f"{package}/{path.name}"
        for package, text_ in where.items()
        for path in sorted((REPO / package).glob("*.py"))
        if f"`{path.name}`" not in text_
    ]
    assert not missing, f"modules missing from the map in docs/architecture.md: {missing}"
