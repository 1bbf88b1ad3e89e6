"""The real model-hub clients (huggingface_hub, modelscope), run in the venv scripts/test.sh installs them into.

They cannot share imgtool's venv (pyproject.toml [tool.imgtool] says why), and each reads its endpoint and
offline switches from the environment when it is imported, so every call is a process of its own, with an
environment made here from nothing but what the test gives: no proxy, no token file, no cache of this machine.

    [path] = run_clients([("hf_snapshot_download", {"repo_id": "org/name", "cache_dir": d})], {"HF_ENDPOINT": hub.url}, home)
"""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

# Runs the calls given as JSON in argv[1], [[function, kwargs], ...], in one process; prints their results
# as one JSON list. The functions are the clients' own, imported from where their users import them.
_SNIPPET = """
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
functions = {"hf_snapshot_download": ("huggingface_hub", "snapshot_download"),
             "hf_hub_download": ("huggingface_hub", "hf_hub_download"),
             "ms_snapshot_download": ("modelscope.hub.snapshot_download", "snapshot_download"),
             "ms_file_download": ("modelscope.hub.file_download", "model_file_download")}
def call(name, kwargs):
    module, attr = functions[name]
    return str(getattr(importlib.import_module(module), attr)(**kwargs))
print(json.dumps([call(name, kwargs) for name, kwargs in json.loads(sys.argv[1])]))
"""


def client_python() -> str:
    """$VENV/hub-clients/bin/python beside the running interpreter's venv (scripts/test.sh makes it)."""
    python = Path(sys.prefix) / "hub-clients" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: scripts/test.sh installs the hub clients there ([tool.imgtool] hub-clients)")
    return str(python)


class ClientFailed(Exception):
    def __init__(self, returncode: int, stderr: str):
        super().__init__(f"exit {returncode}: {stderr[-3000:]}")
        self.returncode, self.stderr = returncode, stderr


def run_clients(calls: List[Tuple[str, Dict[str, Any]]], env: Dict[str, str], home: Path,
                timeout: float = 120) -> List[str]:
    """Run the clients' `calls` ((function, kwargs): hf_snapshot_download, hf_hub_download, ms_snapshot_download,
    ms_file_download) in one process of the clients' venv, HOME=`home`: the paths they return.
    Raises ClientFailed (with the client's stderr) when one fails."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "NO_PROXY": "*", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "PYTHONDONTWRITEBYTECODE": "1"}
    p = subprocess.run([client_python(), "-c", _SNIPPET, json.dumps(calls)], env={**base, **env},
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise ClientFailed(p.returncode, p.stderr)
    return json.loads(p.stdout.strip().splitlines()[-1])
