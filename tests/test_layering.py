"""The house rules of imports, held by parsing every module with ast."""

import ast
import functools
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "imgtool"
IO_MODULES = {"requests", "urllib3", "docker", "click", "tqdm", "socket", "subprocess", "http", "urllib", "shutil",
              "tempfile", "zstandard", "fcntl", "threading", "concurrent"}


def parse(path: Path) -> ast.Module:
    """The module's tree, parsed once per text (the checks below walk every module, many of them several times)."""
    return _parse(path.read_text(), str(path))


@functools.lru_cache(maxsize=None)
def _parse(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename=filename)


def imports_of(path: Path):
    tree = parse(path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name.split(".")[0], a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0], node.module
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            yield ".", "." * node.level + (node.module or "")


def modules():
    return sorted(p for p in PKG.rglob("*.py"))


def test_model_imports_no_io():
    found = {top for top, _ in imports_of(PKG / "model.py")}
    assert not (found & IO_MODULES), found & IO_MODULES
    local = {full for top, full in imports_of(PKG / "model.py") if top == "."}
    assert local <= {".errors"}, local


def test_only_the_commands_package_imports_click():
    users = {p.relative_to(PKG).as_posix() for p in modules() if any(t == "click" for t, _ in imports_of(p))}
    assert users and all(u.startswith("commands/") for u in users), users


def test_only_daemon_imports_docker():
    # registry.py reads what `docker login` stored through registry_http.docker_credentials (docker.auth's
    # resolution, with a timeout for helpers; tests/test_registry_http.py compares the two)
    users = {}
    for p in modules():
        found = {full for top, full in imports_of(p) if top == "docker"}
        if found:
            users[p.relative_to(PKG).as_posix()] = found
    assert set(users) <= {"runtimes/docker.py"}, users


def test_the_stdlib_docker_client_is_reached_only_through_daemon_py():
    # daemon_http.py is the Docker room's second transport (Python 3.7/3.8), not a second room
    def names(p):  # every module and every `from . import x` name p imports
        for node in ast.walk(parse(p)):
            if isinstance(node, ast.ImportFrom):
                yield from [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                yield from (a.name for a in node.names)

    users = {p.relative_to(PKG).as_posix() for p in modules() if any(n.endswith("docker_http") for n in names(p))}
    assert users == {"runtimes/docker.py"}, users
    assert not {top for top, _ in imports_of(PKG / "runtimes" / "docker_http.py")} & {"docker", "requests", "urllib3", "."}


def test_the_stdlib_registry_client_is_reached_only_through_registry_py():
    # registry_http.py is the registry room's second transport (Python 3.7/3.8), not a second room;
    # registry.py imports requests only inside the transport it chose, so it loads where requests cannot
    users = {p.relative_to(PKG).as_posix() for p in modules()
             if any(n.endswith("registry_http") for n in _names(p))}
    assert users == {"registry.py"}, users
    assert not {top for top, _ in imports_of(PKG / "registry_http.py")} & {"docker", "requests", "urllib3", "."}
    tree = parse(PKG / "registry.py")
    top_level = {a.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for a in node.names}
    top_level |= {node.module.split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom) and node.module}
    assert not top_level & {"docker", "requests", "urllib3"}, top_level


def test_only_the_registry_room_speaks_requests():
    # The registry room hides its transport: a blob is a registry.BlobStream, a transport failure a
    # RegistryError, so resolve.py and puller.py never catch (or import) requests' or urllib3's types.
    # daemon.py catches what docker-py's own transport raises (requests), inside the Docker room. The model hubs'
    # room hides its transport the same way, in one module (hubs/http.py): a file is a BlobStream there too.
    users = {}
    for p in modules():
        found = {top for top, _ in imports_of(p) if top in ("requests", "urllib3")}
        if found:
            users[p.relative_to(PKG).as_posix()] = found
    assert set(users) <= {"registry.py", "transport.py", "runtimes/docker.py", "hubs/http.py"}, users
    assert "requests" in users.get("registry.py", set()), users  # the rule holds where the transport is


def _names(p):
    """Every module and every `from . import x` name p imports."""
    for node in ast.walk(parse(p)):
        if isinstance(node, ast.ImportFrom):
            yield from [node.module or ""] + [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names)


def test_only_gz_py_gzips_and_gunzips():
    # one room picks ISA-L or zlib and writes reproducible members: a second importer would bypass both
    users = {p.relative_to(PKG).as_posix() for p in modules()
             if any(t in ("zlib", "gzip", "isal") for t, _ in imports_of(p))}
    assert users == {"gz.py"}, users


def test_only_progress_imports_tqdm():
    users = {p.relative_to(PKG).as_posix() for p in modules() if any(t == "tqdm" for t, _ in imports_of(p))}
    assert users <= {"progress.py"}, users


def test_later_stages_never_import_earlier_ones():
    # data flows one way: the offline side (bundle reading, loading) never reaches the registry side
    for p in (PKG / "bundle").glob("*.py"):
        names = {full for _, full in imports_of(p)}
        assert not any(n.endswith(("registry", "puller", "resolve", "mirrors")) for n in names), (p, names)
    assert not any(full.endswith(("registry", "puller", "resolve", "mirrors")) for _, full in imports_of(PKG / "runtimes" / "docker.py"))


def test_the_bundle_package_takes_a_daemon_never_imports_the_docker_adapter():
    # bundle/landing.py is handed a daemon.Daemon by the CLI; the Docker room stays one module
    for p in (PKG / "bundle").glob("*.py"):
        names = {full for _, full in imports_of(p)}
        assert not any(n.endswith(("runtimes.docker", "docker")) for n in names), (p, names)


def test_delta_chain_logic_is_pure():
    found = {top for top, _ in imports_of(PKG / "delta.py")}
    assert not (found & IO_MODULES), found & IO_MODULES
    local = {full for top, full in imports_of(PKG / "delta.py") if top == "."}
    assert local <= {".errors", ".model"}, local


def test_release_tags_are_pure():
    found = {top for top, _ in imports_of(PKG / "releases.py")}
    assert found <= {"re", "dataclasses", "typing"}, found


def test_run_presets_never_reach_the_registry_side():
    # `imgtool run` serves an offline host: it reads tags through releases.py, never through tags.py
    for p in (PKG / "presets").glob("*.py"):
        names = {full for _, full in imports_of(p)}
        assert not any(n.endswith(("registry", "puller", "resolve", "mirrors", "tags", "fetch")) for n in names), (p, names)


def test_no_module_uses_another_modules_private_names():
    # `from .x import _name`: a private name used across rooms is an interface nobody declared
    for p in modules():
        tree = parse(p)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                assert not private, (p.relative_to(PKG).as_posix(), node.module, private)


def test_only_the_adapters_of_outside_programs_run_programs():
    # ssh-keygen is an outside system: one adapter runs it, the rest receive its findings; the registry
    # room's stdlib transport runs docker-credential-* helpers (docker.auth does so on 3.9+)
    # the runtime rooms run ctr and podman through program.py only (it knows no tool's words)
    users = {p.relative_to(PKG).as_posix() for p in modules() if any(t == "subprocess" for t, _ in imports_of(p))}
    assert users == {"sshsig.py", "registry_http.py", "program.py"}, users
    for room in ("program.py", "runtimes/containerd.py", "runtimes/podman.py", "runtimes/base.py"):  # the pyz runs them on 3.7
        third_party = {top for top, _ in imports_of(PKG / room)} & {"requests", "urllib3", "docker", "click", "tqdm",
                                                                    "zstandard", "cryptography"}
        assert not third_party, (room, third_party)
    third_party = {top for top, _ in imports_of(PKG / "sshsig.py")} & {"requests", "urllib3", "docker", "click", "tqdm",
                                                                     "zstandard", "cryptography"}
    assert not third_party, third_party  # imgtool.pyz checks signatures on Kylin's bare python3 3.7
    assert {full for top, full in imports_of(PKG / "sshsig.py") if top == "."} <= {".errors", ".fsutil"}


def test_the_signature_policy_is_pure():
    found = {top for top, _ in imports_of(PKG / "trust.py")}
    assert not (found & IO_MODULES), found & IO_MODULES
    assert {full for top, full in imports_of(PKG / "trust.py") if top == "."} <= {".errors"}


# The house's layers, from the model up to the commands: a module imports only from its own layer or lower ones
# (`if TYPE_CHECKING:` imports count: a type is a dependency too). A package named alone is all of its modules
# that no layer names by itself. Data flows one way: descriptions of images and bundles, the rooms of outside
# systems, the bundle read and written, the steps of a copy, the verbs, the commands.
LAYERS = (
    ("foundation", {"errors", "text", "fsutil", "model", "schema", "releases", "deadline", "worker", "program", "gz", "memory",
                    "progress", "tarstream", "filecopy"}),
    ("signatures", {"trust", "sshsig"}),  # the policy and ssh-keygen's adapter: below every bundle module
    ("descriptions", {"delta", "config", "spec", "dirlock", "bundle.format", "bundle.ustar", "presets.preset", "weights",
                      "placement", "nodeconfig", "model_diff", "modelcar"}),
    ("outside systems", {"registry_http", "registry_auth", "registry_answers", "transport", "registry", "mirrors", "store", "runtimes",
                         "connections", "placer", "placed", "hubs"}),
    ("bundle model", {"bundle.layout", "bundle.regions", "bundle.catalog", "bundle.hostcheck", "selfbundle"}),
    # what a copy does on the way
    ("steps", {"resolve", "puller_sources", "puller", "transcode", "heldblobs", "tags", "pipeline", "model_pull", "model_dir"}),
    ("bundle writing", {"bundle.texts", "bundle.loadsh", "bundle.writer"}),  # a destination
    ("bundle reading", {"bundle"}),  # a source: reader, archive, verify, signature, inplace, landing
    ("presets", {"presets"}),
    ("ends", {"ends"}),  # the pipeline's sources and destinations: registry, bundle, Docker, runtime
    ("verbs", {"fetch", "export", "push", "serve", "load", "inventory", "doctor", "diff", "install", "inspection",
               "mirror_report"}),
    ("spec verbs", {"lock"}),  # `fetch -f SPEC`: fetch's options from a spec
    # `imgtool copy`: every pair; the pairs a verb runs go through that verb's core function (its checks, its words)
    ("pairs", {"copying"}),
    ("commands", {"cli", "__main__", "commands"}),
)
ALONE = {"verbs"}  # a verb imports no other verb: what two share belongs a layer down


def _package_imports(path: Path):
    """What a module imports from imgtool, as dotted names relative to the package ("bundle.writer")."""
    rel = path.relative_to(PKG)
    here = list(rel.parts[:-1])
    for node in ast.walk(parse(path)):
        if not (isinstance(node, ast.ImportFrom) and node.level > 0):
            continue
        base = here[:len(here) - (node.level - 1)]
        full = base + (node.module.split(".") if node.module else [])
        submodules = [a.name for a in node.names if PKG.joinpath(*full, a.name + ".py").exists()]
        yield from (".".join(full + [m]) for m in submodules)  # `from . import trust`, `from .bundle import writer`
        if node.module and len(submodules) < len(node.names):
            yield ".".join(full)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def _layer_of(name: str):
    """The index of the layer holding module `name` (its own entry first, else its package's); None if none."""
    for i, (_, members) in enumerate(LAYERS):
        if name in members:
            return i
    for i, (_, members) in enumerate(LAYERS):
        if name.split(".")[0] in members:
            return i
    return None


def import_graph():
    """{module: the modules of imgtool it imports}, every module of the package (`imgtool.__init__` is "__init__")."""
    graph = {}
    for p in modules():
        name = _module_name(p)
        graph[name] = {d for d in _package_imports(p) if d and d != name}
    return graph


def back_edges(graph):
    """The imports against LAYERS: (module, what it imports, why)."""
    out = []
    for name, deps in sorted(graph.items()):
        if name == "__init__":
            continue
        mine = _layer_of(name)
        for dep in sorted(deps):
            theirs = _layer_of(dep)
            if theirs is None or mine is None:
                out.append((name, dep, "in no layer"))
            elif theirs > mine:
                out.append((name, dep, f"{LAYERS[mine][0]} imports {LAYERS[theirs][0]}"))
            elif theirs == mine and LAYERS[mine][0] in ALONE:
                out.append((name, dep, f"one of the {LAYERS[mine][0]} imports another"))
    return out


def cycles(graph):
    """The import cycles of `graph` (each a sorted list of modules), by Tarjan's strongly connected components."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_sits_in_a_layer_and_imports_only_its_own_or_lower_ones():
    graph = import_graph()
    assert not back_edges(graph), back_edges(graph)


def test_no_import_cycle():
    assert cycles(import_graph()) == []


def test_the_order_check_catches_a_back_edge_and_a_cycle():
    # what the two tests above would say of the back-edges issue 37 moved away (each added to today's graph)
    graph = import_graph()
    for module, dep in (("transcode", "export"), ("heldblobs", "bundle.writer"), ("bundle.writer", "bundle.reader"),
                        ("bundle.hostcheck", "bundle.texts"), ("runtimes.podman", "presets.run"), ("inspection", "fetch"),
                        ("trust", "bundle.format"), ("model", "registry")):
        graph_with = dict(graph, **{module: graph[module] | {dep}})
        assert [(m, d) for m, d, _ in back_edges(graph_with)] == [(module, dep)], (module, dep)
    # runtime.py opened the rooms, which import its values: the cycle runtimes/choice.py ended
    looped = dict(graph, **{"runtimes.base": graph["runtimes.base"] | {"runtimes.choice"}})
    assert cycles(looped) == [["runtimes.base", "runtimes.choice", "runtimes.containerd", "runtimes.docker",
                               "runtimes.podman"]]


# Who reads the environment: config.py, one function per variable, each read once by cli.py and handed to
# the room that needs it. Anything else is listed here with the variables it may read, and why.
ENV_READERS = {
    "config.py": None,  # any variable: imgtool's own ($IMGTOOL_*) and the ones it honours ($DOCKER_HOST, ...)
    # the stdlib twin of requests (Python 3.7/3.8) reads requests' own CA variables where requests does, so
    # both transports honour them alike; registry_http.py is stdlib only and may not import config.py
    "registry_http.py": {"REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"},
}


def environment_reads(path: Path):
    """(line, variable) of every read of the environment in a module: `os.environ[...]`, `.get(...)`, `in`,
    `os.getenv(...)`, `from os import environ`; the variable is "*" when the whole environment is used."""
    tree = parse(path)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    os_names = {"environ", "environb", "getenv", "getenvb"}

    def named(node):  # the literal variable name read through `node` (os.environ, or os.getenv), else "*"
        up = parents.get(node)
        if isinstance(up, ast.Call) and up.func is node:  # os.getenv("X")
            call = up
        elif isinstance(up, ast.Attribute) and up.attr in ("get", "setdefault", "pop"):  # os.environ.get("X")
            call = parents.get(up)
        elif isinstance(up, ast.Subscript):  # os.environ["X"]
            key = up.slice
            return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else "*"
        elif isinstance(up, ast.Compare) and node in up.comparators:  # "X" in os.environ
            return up.left.value if isinstance(up.left, ast.Constant) and isinstance(up.left.value, str) else "*"
        else:
            return "*"
        if isinstance(call, ast.Call) and call.args and isinstance(call.args[0], ast.Constant):
            return call.args[0].value if isinstance(call.args[0].value, str) else "*"
        return "*"

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in os_names and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            yield node.lineno, named(node)
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and {a.name for a in node.names} & os_names:
            yield node.lineno, "*"  # `from os import environ`: every later use is hidden behind a bare name


def test_only_config_reads_the_environment():
    found = {}
    for p in modules():
        rel = p.relative_to(PKG).as_posix()
        allowed = ENV_READERS.get(rel, set())
        for line, variable in environment_reads(p):
            if variable.startswith("IMGTOOL_TEST_") or (allowed is not None and variable not in allowed):
                found.setdefault(rel, []).append(f"line {line}: {variable}")
    # a test-only variable is a knob in the product: the value becomes a parameter the tests pass
    assert not found, f"read the environment outside config.py (add a function there, or list it in ENV_READERS): {found}"


def test_the_environment_check_sees_every_form_of_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('import os\nfrom os import getenv\na = os.environ.get("A")\nb = os.environ["B"]\nc = "C" in os.environ\n'
                     'd = os.getenv("D", "")\ne = dict(os.environ)\nf = os.environ.get(name)\n')
    assert sorted(environment_reads(probe)) == [(2, "*"), (3, "A"), (4, "B"), (5, "C"), (6, "D"), (7, "*"), (8, "*")]


def test_design_md_lists_every_module_in_its_layer():
    """docs/design.md's table of layers names each module of LAYERS in the layer's row (a module moved or added
    without the page saying so fails here)."""
    import re

    rows = {}
    for line in (PKG.parent / "docs" / "design.md").read_text().splitlines():
        m = re.match(r"\| (\d+) \| [^|]+ \| (.+) \|$", line)
        if m:
            rows[int(m.group(1))] = m.group(2)
    assert sorted(rows) == list(range(len(LAYERS))), sorted(rows)
    missing = []
    for i, (name, members) in enumerate(LAYERS):
        words = set(re.findall(r"[\w.]+", rows[i].replace("/", "")))
        for member in members:
            short = member.split(".")[-1]
            if member not in words and short not in words and member.replace(".", "") not in words:
                missing.append(f"layer {i} ({name}): {member}")
    assert not missing, missing


def test_no_function_is_as_tangled_as_radons_d():
    """Every function and method of imgtool stays below radon's rank D (cyclomatic complexity 21): past it a
    function holds more than one idea (issue 47 split the four that had grown there)."""
    from radon.complexity import cc_rank, cc_visit

    tangled = [f"{p.relative_to(PKG)}:{block.lineno} {block.fullname} ({block.complexity})"
               for p in modules() for block in cc_visit(p.read_text()) if cc_rank(block.complexity) >= "D"]
    assert not tangled, tangled
