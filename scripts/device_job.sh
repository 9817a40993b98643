#!/usr/bin/env bash
# A long job on a GPU machine that is reached by commands limited in time (ten minutes a command, say):
# start it in the background in one call, then wait for it over later calls, collecting what it
# finished after every call, so that a machine lost between calls loses no finished result.
#
#   MODE=start JOB='<commands>' bash scripts/device_job.sh   # copy the tree to $WORK, install, start JOB
#   bash scripts/device_job.sh                                # wait for the job started earlier
#
# JOB runs in $WORK (a copy of the tree made at start, default /root/job) with /tmp/site on PYTHONPATH
# (the wheels of .whl/install.sh) and mentor installed in editable mode; it writes logs to $WORK/res.
# Every call waits up to $WAIT seconds (default 540), then prints the tail of each log and packs into
# $OUT/results.tgz every file under book/ and $WORK/res that changed since the job started, finished or not.
# res/done holds the exit status of JOB's last command. A call that finds no job on the machine (a fresh
# machine: the earlier one was given back) says so and exits with status 3 at once, instead of waiting for a
# job that is not there.
set -u
WORK=${WORK:-/root/job}
WAIT=${WAIT:-540}
OUT=${OUT:-/tmp/device-job-out}
mkdir -p "$OUT"

if [ "${MODE:-wait}" = start ]; then
  [ -n "${JOB:-}" ] || { echo "MODE=start needs JOB='<commands to run>'" >&2; exit 2; }
  rm -rf "$WORK"; mkdir -p "$WORK/res"
  tar --exclude=./.git -cf - . | (cd "$WORK" && tar -xf -)
  cd "$WORK" || exit 2
  touch res/started
  if [ -f .whl/install.sh ]; then bash .whl/install.sh > res/install.log 2>&1; fi
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >> res/install.log 2>&1
  if [ -d .whl-old ]; then  # torchmetrics 1.6.1 for chapter 13, as make old-torchmetrics would install it
    mkdir -p .venv/torchmetrics-1.6.1
    python3 -m pip install -q --no-index --no-deps --target .venv/torchmetrics-1.6.1 .whl-old/*.whl >> res/install.log 2>&1
    touch .venv/torchmetrics-1.6.1/.installed
  fi
  setsid nohup bash -c "cd '$WORK'; export PYTHONPATH=/tmp/site:\${PYTHONPATH:-}; ${JOB}; echo \$? > res/done" \
    > res/job.log 2>&1 < /dev/null &
  echo "started in $WORK"
fi

if [ ! -f "$WORK/res/started" ]; then
  echo "no job on this machine ($WORK/res/started is missing): the machine is a fresh one; start the job again" >&2
  exit 3
fi
cd "$WORK" || exit 2
begin=$(date +%s)
while [ ! -f res/done ] && [ $(( $(date +%s) - begin )) -lt "$WAIT" ]; do sleep 5; done
if [ -f res/done ]; then echo "job done, status $(cat res/done)"; else echo "job still running"; fi
for log in res/*.log; do echo "== $log"; tail -n 20 "$log"; done
find book res -newer res/started -type f -print0 2>/dev/null | tar --null -czf "$OUT/results.tgz" -T -
echo "packed $(tar -tzf "$OUT/results.tgz" | wc -l) changed files into $OUT/results.tgz"
