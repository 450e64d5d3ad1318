"""The module graph: every import of every module (function-level ones included) is parsed; the
graph has no cycle, and imports point one way through the layers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: repository folder -> the import name it installs as (pyproject's package-dir)
PACKAGES = {"tuner": "nf4tune", "db": "nf4tune.db", "reports": "nf4tune.reports",
            "kernel_templates": "nf4tune.kernel_templates"}

# layer of a module (longest matching prefix); an import must go to a lower layer or stay inside
# its own folder
LAYERS = [
    ("nf4tune.vocabulary", 0),
    ("nf4tune._files", 0),
    ("nf4tune._version", 0),
    ("nf4tune.kernel_templates", 0),
    ("nf4tune.family", 1),
    ("nf4tune.families", 2),
    ("nf4tune.db", 3),
    ("nf4tune.kernel", 4),
    ("nf4tune.measure", 5),
    ("nf4tune.serve", 6),
    ("nf4tune.tune", 7),
    ("nf4tune.bench", 8),
    ("nf4tune.track", 8),
    ("nf4tune.reports", 9),
    ("nf4tune.cli", 10),
    ("nf4tune", 11),          # the package's public API re-exports
]


def _modules() -> dict:
    mods = {}
    for folder, name in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = name.split(".") + list(rel.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if "migrations" in parts:
                continue
            mods[".".join(parts)] = path
    return mods


def _resolve(mod: str, is_pkg: bool, node, known: set) -> list:
    """Project modules an import node refers to (a `from pkg import name` of a submodule is that
    submodule; of an attribute, the package itself)."""
    out = []
    if isinstance(node, ast.Import):
        for a in node.names:
            name = a.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
        return out
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    for a in node.names:
        sub = f"{target}.{a.name}"
        if sub in known:
            out.append(sub)
        else:
            name = target
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.append(name)
    return out


def _graph() -> dict:
    mods = _modules()
    known = set(mods)
    graph = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):           # every level: function-level imports too
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for dep in _resolve(mod, is_pkg, node, known):
                    if dep != mod:
                        graph[mod].add(dep)
    return graph


def _cycles(graph: dict) -> list:
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def _layer(mod: str) -> tuple:
    best = max((p for p, _ in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return dict(LAYERS)[best], best


def test_the_graph_is_parsed():
    g = _graph()
    assert "nf4tune.measure.bench" in g and "nf4tune.kernel.launch" in g["nf4tune.measure.bench"]
    # a function-level import is an edge too
    assert "nf4tune.measure.bench" in g["nf4tune.tune.worker"]


def test_no_import_cycles():
    cycles = _cycles(_graph())
    assert cycles == [], f"import cycles: {cycles}"


def test_imports_point_down_the_layers():
    bad = []
    for mod, deps in _graph().items():
        lm, pm = _layer(mod)
        for dep in deps:
            ld, pd = _layer(dep)
            if pd == pm:
                continue
            if ld >= lm:
                bad.append(f"{mod} (layer {pm}) imports {dep} (layer {pd})")
    assert bad == [], "\n".join(bad)


def test_the_store_and_the_families_know_nothing_above_them():
    g = _graph()
    for mod, deps in g.items():
        if mod.startswith("nf4tune.db"):
            assert {d for d in deps if not d.startswith("nf4tune.db")} <= {"nf4tune.vocabulary"}, (mod, deps)
        if mod.startswith("nf4tune.families"):
            assert all(d.startswith(("nf4tune.family", "nf4tune.vocabulary", "nf4tune.families",
                                     "nf4tune.kernel_templates")) for d in deps), (mod, deps)


def test_every_direct_cuda_call_lives_in_the_kernel_layer():
    """cuda.core / cuda.bindings are imported by nf4tune.kernel only (and the timing's NVML)."""
    offenders = []
    for mod, path in _modules().items():
        if mod == "nf4tune.kernel" or mod.startswith("nf4tune.kernel."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == "cuda" or n.startswith("cuda.") for n in names):
                offenders.append(mod)
    assert offenders == [], offenders


def _package_of(mod: str) -> str:
    """The top-level package of ``nf4tune`` a module belongs to (``nf4tune.db._engine`` -> ``nf4tune.db``)."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else mod


def test_no_two_way_ties_between_top_level_packages():
    """Drawn from the imports: between nf4tune's top-level packages (db, serve, tune, reports, ...) the ties
    point one way; the package root, which re-exports the public API, is left out."""
    ties = set()
    for mod, deps in _graph().items():
        if mod == "nf4tune":
            continue
        for dep in deps:
            a, b = _package_of(mod), _package_of(dep)
            if a != b and b != "nf4tune":
                ties.add((a, b))
    two_way = sorted({tuple(sorted(t)) for t in ties if (t[1], t[0]) in ties})
    assert two_way == [], f"packages importing each other: {two_way}"


def test_the_distribution_installs_one_import_name(tmp_path):
    """`pip install .` puts one top-level name into site-packages, nf4tune: the wheel's RECORD holds nothing
    else (its dist-info aside)."""
    import subprocess
    import sys
    import zipfile

    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                        str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (wheel,) = tmp_path.glob("nf4_tune-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        top = {line.split(",")[0].split("/")[0] for line in z.read(record).decode().splitlines() if line}
    assert {t for t in top if not t.endswith(".dist-info")} == {"nf4tune"}
    assert any(n.startswith("nf4tune/kernel_templates/") and n.endswith(".cu") for n in names)
    assert "nf4tune/serve/tuned_configs.json" in names and "nf4tune/db/migrations/script.py.mako" in names
