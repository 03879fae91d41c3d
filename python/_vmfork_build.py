"""A PEP 517 build backend for the vmfork package, standard library only.

Why not setuptools: pip builds in an isolated environment and would fetch
setuptools from PyPI first, which vmfork's hosts cannot reach (and
`--no-build-isolation` is one more thing to know). A pure-Python package
with no extension and no dependency needs only a zip with its metadata, so
`pip install ./python` works offline with nothing but Python itself."""

import base64
import hashlib
import os
import tarfile
import tomllib
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = "vmfork"


def _project():
    with open(os.path.join(HERE, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]


def _metadata(p):
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
        f"Summary: {p.get('description', '')}",
        f"Requires-Python: {p.get('requires-python', '>=3')}",
    ]
    readme = os.path.join(HERE, p.get("readme", "README.md"))
    body = ""
    if os.path.exists(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _files():
    root = os.path.join(HERE, PKG)
    for name in sorted(os.listdir(root)):
        if name.endswith(".py") or name == "py.typed":
            yield f"{PKG}/{name}", os.path.join(root, name)


def _digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    wheel = f"{dist}-py3-none-any.whl"
    info = f"{dist}.dist-info"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w", zipfile.ZIP_DEFLATED) as z:
        def add(arc, data):
            z.writestr(arc, data)
            record.append(f"{arc},{_digest(data)},{len(data)}")

        for arc, path in _files():
            with open(path, "rb") as f:
                add(arc, f.read())
        add(f"{info}/METADATA", _metadata(p).encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: _vmfork_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        record.append(f"{info}/RECORD,,")
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return wheel


def build_sdist(sdist_directory, config_settings=None):
    p = _project()
    dist = f"{p['name']}-{p['version']}"
    with tarfile.open(os.path.join(sdist_directory, f"{dist}.tar.gz"), "w:gz") as t:
        for name in ("pyproject.toml", "README.md", "_vmfork_build.py"):
            t.add(os.path.join(HERE, name), f"{dist}/{name}")
        for arc, path in _files():
            t.add(path, f"{dist}/{arc}")
    return f"{dist}.tar.gz"
