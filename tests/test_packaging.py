"""What `pip install .` ships: every package and every data file the code reads beside itself."""

from pathlib import Path

from imgtool.config import read_toml

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_and_data_file_is_in_pyproject():
    data, _ = read_toml(ROOT / "pyproject.toml")
    listed = set(data["tool"]["setuptools"]["packages"])
    package_data = data["tool"]["setuptools"]["package-data"]
    pkg_dirs = sorted(p.parent for p in (ROOT / "imgtool").rglob("__init__.py") if "__pycache__" not in p.parts)
    for d in pkg_dirs:
        name = ".".join(d.relative_to(ROOT).parts)
        assert name in listed, f"{name} is missing from [tool.setuptools] packages"
        shipped = set(package_data.get(name, ()))
        for f in sorted(f for f in d.iterdir() if f.is_file() and f.suffix not in (".py", ".pyc")):
            assert f.name in shipped, f"{name}/{f.name} is missing from [tool.setuptools.package-data]"
