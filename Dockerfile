# The harness image: the pinned vLLM image, untouched, with the harness beside it in a virtual environment of
# its own. The venv sees the image's packages (--system-site-packages) and installs only what they lack, so
# the engine's Python and every package vLLM pinned stay as released. It has no pip (or setuptools) of its
# own, which would shadow the versions vLLM requires; the image's pip installs into it. Only `harness` joins
# the PATH (not the venv's python3, which would start the engine under the harness's packages).
# Built in-cluster by polyaxonfiles/build-image.yaml (kaniko), or: docker build -t vllm-serving-harness .
FROM vllm/vllm-openai:v0.11.2@sha256:2c908d5a84ed251b6a17d179f42d06df1aff353007779ac5eecd8a0ea3fe9331

ENV HARNESS_IMAGE_REFERENCE=vllm/vllm-openai:v0.11.2@sha256:2c908d5a84ed251b6a17d179f42d06df1aff353007779ac5eecd8a0ea3fe9331 \
    HARNESS_HOME=/opt/vllm-serving-harness

COPY . ${HARNESS_HOME}/src
RUN python3 -m pip freeze > /tmp/engine-before.txt \
 && python3 -m venv --system-site-packages --without-pip ${HARNESS_HOME}/venv \
 && ${HARNESS_HOME}/venv/bin/python -m pip install --no-cache-dir ${HARNESS_HOME}/src \
 && ln -s ${HARNESS_HOME}/venv/bin/harness /usr/local/bin/harness \
 && python3 -m pip freeze | diff /tmp/engine-before.txt - \
 && ${HARNESS_HOME}/venv/bin/python -m pip check \
 && rm /tmp/engine-before.txt

# prompts/ is here too; `--inventory prompts/<name>` also resolves from any other directory.
WORKDIR ${HARNESS_HOME}/src
ENTRYPOINT []
