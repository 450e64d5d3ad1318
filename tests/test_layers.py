"""The module graph: every import of every module (function-level ones included) is parsed; the
graph has no cycle, and imports point one way through the layers."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tuner", "db", "reports", "kernel_templates")

# layer of a module (longest matching prefix); an import must go to a lower layer or stay inside
# its own folder
LAYERS = [
    ("tuner.vocabulary", 0),
    ("tuner._files", 0),
    ("tuner._version", 0),
    ("kernel_templates", 0),
    ("tuner.family", 1),
    ("tuner.families", 2),
    ("db", 3),
    ("tuner.kernel", 4),
    ("tuner.measure", 5),
    ("tuner.serve", 6),
    ("tuner.tune", 7),
    ("tuner.track", 8),
    ("reports", 9),
    ("tuner.cli", 10),
    ("tuner", 11),          # the package's public API re-exports
]


def _modules() -> dict:
    mods = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
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
    assert "tuner.measure.bench" in g and "tuner.kernel.launch" in g["tuner.measure.bench"]
    # a function-level import is an edge too
    assert "tuner.measure.bench" in g["tuner.tune.worker"]


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
        if mod.startswith("db"):
            assert {d for d in deps if d.startswith("tuner")} <= {"tuner.vocabulary"}, (mod, deps)
        if mod.startswith("tuner.families"):
            assert all(d.startswith(("tuner.family", "tuner.vocabulary", "tuner.families", "kernel_templates"))
                       for d in deps), (mod, deps)


def test_every_direct_cuda_call_lives_in_the_kernel_layer():
    """cuda.core / cuda.bindings are imported by tuner.kernel only (and the timing's NVML)."""
    offenders = []
    for mod, path in _modules().items():
        if mod.startswith("tuner.kernel"):
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
