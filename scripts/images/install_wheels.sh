#!/bin/sh
# Baked into the base image as fornax-install-wheels and run by each service's build stage:
# makes the /opt/fornax venv from the /wheels wheelhouse alone (no index, no network).
set -eu
pip_install() {
  /opt/fornax/bin/pip install --no-index --no-cache-dir --disable-pip-version-check "$@"
}
python3 -m venv /opt/fornax
pip_install --find-links=/wheels -r /wheels/requirements.txt
# The project wheel without its declared dependencies: the service list above is complete.
pip_install --no-deps -r /wheels/project.txt
/opt/fornax/bin/pip uninstall --quiet --yes pip setuptools
