#!/usr/bin/env bash
# Fetch, here, the wheels that scripts/device_job.sh installs on the GPU machine, which reaches no package index:
#   .whl/      nbclient, ipykernel and myst-nb's glue (fetched by the gpu-wheels helper at ../shared/tools, with the
#              install.sh that installs them), and lightning, pytorch-lightning,
#              lightning-utilities and accelerate at the versions of constraints.txt (chapter 16; the image has
#              others)
#   .whl-old/  torchmetrics 1.6.1, the article's release (chapter 13)
# Both folders are listed in .git/info/exclude, so that they stay out of commits; copy both to the GPU machine with
# the working tree.
#
#   bash scripts/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tools=../shared/tools/gpu-wheels
[ -x "$tools" ] || { echo "$tools is missing: it fetches the notebook runner's wheels" >&2; exit 2; }
"$tools" .whl
pin() {  # the version constraints.txt fixes for package $1
  local v
  v=$(grep -i "^$1==" constraints.txt | cut -d= -f3)
  [ -n "$v" ] || { echo "constraints.txt pins no $1" >&2; exit 2; }
  echo "$1==$v"
}
for package in lightning pytorch-lightning lightning-utilities accelerate; do
  spec=$(pin "$package")  # set -e stops here when constraints.txt pins no such package
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform any -d .whl "$spec" 2>&1 | grep -v "is ignored" || true
done
mkdir -p .whl-old
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl-old torchmetrics==1.6.1 2>&1 \
  | grep -v "is ignored" || true
for folder in /.whl/ /.whl-old/; do
  grep -qxF "$folder" .git/info/exclude 2>/dev/null || echo "$folder" >> .git/info/exclude
done
ls .whl/*.whl | wc -l | xargs echo "wheels in .whl:"
ls .whl-old/*.whl | xargs -n1 basename | xargs echo ".whl-old:"
