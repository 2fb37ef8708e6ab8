#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for the SLURM tests and for trying sweeps locally.
#
#   scripts/slurm_cluster.sh start    # install slurm-wlm + munge (apt) if missing, start, wait idle
#   scripts/slurm_cluster.sh status   # daemons and `sinfo`
#   scripts/slurm_cluster.sh stop     # cancel every job, stop slurmd, slurmctld and munged
#
# Runs as root (apt, munge key, daemons). Config, state, spool and logs live in $JAXRL_SLURM_DIR
# (default /tmp/jaxrl-slurm); the config is also linked as /etc/slurm/slurm.conf when that path is
# free, so plain `sinfo` / `sbatch` find it (otherwise export SLURM_CONF=$JAXRL_SLURM_DIR/slurm.conf).
# No cgroups (proctrack/linuxproc, task/none), so it also runs in a container. One partition,
# `local`, holding this host with all its CPUs (nproc). Both commands are idempotent.
# Exit status 3: the packages are missing and cannot be installed (no apt-get, not root, apt
# fails). Environment: JAXRL_SLURM_DIR, JAXRL_SLURM_TIMEOUT (seconds to wait for the node, default 60).
set -euo pipefail

DIR="${JAXRL_SLURM_DIR:-/tmp/jaxrl-slurm}"
TIMEOUT="${JAXRL_SLURM_TIMEOUT:-60}"
CONF="$DIR/slurm.conf"
ETC_CONF=/etc/slurm/slurm.conf
NODE="$(hostname -s)"
MUNGE_SOCKET=/run/munge/munge.socket.2
export SLURM_CONF="$CONF"

die() {
  echo "slurm_cluster: $*" >&2
  exit 1
}

cannot_install() { # exit status 3: the packages are missing and cannot be installed here
  echo "slurm_cluster: cannot install slurm-wlm and munge: $*" >&2
  exit 3
}

alive() { # alive <pid file>: the process it names is running
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
    return
  fi
  command -v apt-get >/dev/null || cannot_install "no apt-get"
  [[ $EUID -eq 0 ]] || cannot_install "not root"
  echo "slurm_cluster: installing slurm-wlm and munge (apt)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || cannot_install "apt-get update failed"
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null ||
    cannot_install "apt-get install slurm-wlm munge failed"
}

write_conf() {
  mkdir -p "$DIR/state" "$DIR/spool"
  local cpus
  cpus="$(nproc)"
  cat >"$CONF.new" <<EOF
# Written by scripts/slurm_cluster.sh: one node ($NODE), one partition, no cgroups.
ClusterName=jaxrl-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=2
MinJobAge=600
SlurmdTimeout=300
InactiveLimit=0
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.new" "$CONF"
  if [[ ! -e "$ETC_CONF" && ! -L "$ETC_CONF" ]] || [[ "$(readlink "$ETC_CONF" || true)" == "$CONF" ]]; then
    mkdir -p "$(dirname "$ETC_CONF")"
    ln -sfn "$CONF" "$ETC_CONF"
  fi
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    return
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /etc/munge /etc/munge/munge.key /run/munge /var/lib/munge /var/log/munge
  chmod 0700 /etc/munge
  chmod 0600 /etc/munge/munge.key
  chmod 0755 /run/munge
  runuser -u munge -- munged --force
  touch "$DIR/munged.ours" # stop stops munged only when this script started it
  for _ in $(seq 20); do
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.25
  done
  die "munged did not start (munge -n | unmunge fails); see /var/log/munge/munged.log"
}

node_state() {
  sinfo -h -n "$NODE" -o %T 2>/dev/null | head -n1 || true
}

cmd_start() {
  install_packages
  mkdir -p "$DIR"
  if alive "$DIR/slurmctld.pid" && alive "$DIR/slurmd.pid"; then
    local now
    now="$(node_state)"
    if [[ "$now" == idle || "$now" == mixed || "$now" == allocated ]]; then
      echo "slurm_cluster: already running ($NODE, $now)"
      return
    fi
  else
    cmd_stop >/dev/null 2>&1 || true
  fi
  write_conf
  start_munge
  alive "$DIR/slurmctld.pid" || slurmctld -c -f "$CONF" || die "slurmctld did not start; see $DIR/slurmctld.log"
  alive "$DIR/slurmd.pid" || slurmd -f "$CONF" || die "slurmd did not start; see $DIR/slurmd.log"
  local state=""
  for _ in $(seq $((TIMEOUT * 2))); do
    state="$(node_state)"
    [[ "$state" == idle ]] && break
    sleep 0.5
  done
  if [[ "$state" != idle ]]; then
    echo "slurm_cluster: node $NODE not idle after ${TIMEOUT}s (state: '${state:-none}')" >&2
    tail -n 5 "$DIR/slurmctld.log" "$DIR/slurmd.log" >&2 2>/dev/null || true
    exit 1
  fi
  echo "slurm_cluster: node $NODE idle, partition local, $(nproc) CPUs; SLURM_CONF=$CONF"
}

stop_pid() { # stop_pid <pid file> <name>: TERM, wait up to 10 s, then KILL
  local f="$1" pid
  alive "$f" || { rm -f "$f"; return 0; }
  pid="$(cat "$f")"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 40); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return 0; }
    sleep 0.25
  done
  echo "slurm_cluster: $2 ($pid) ignored TERM; killing it" >&2
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

cmd_stop() {
  if alive "$DIR/slurmctld.pid"; then
    scancel --full --quiet --partition=local 2>/dev/null || true
    for _ in $(seq 40); do # jobs end within KillWait (2 s) of scancel
      [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 0.25
    done
  fi
  stop_pid "$DIR/slurmd.pid" slurmd
  stop_pid "$DIR/slurmctld.pid" slurmctld
  if [[ -e "$DIR/munged.ours" ]]; then
    munged --stop >/dev/null 2>&1 || true
    rm -f "$DIR/munged.ours"
  fi
  [[ "$(readlink "$ETC_CONF" 2>/dev/null || true)" == "$CONF" ]] && rm -f "$ETC_CONF"
  echo "slurm_cluster: stopped"
}

cmd_status() {
  local s
  for d in slurmctld slurmd; do
    if alive "$DIR/$d.pid"; then s="running (pid $(cat "$DIR/$d.pid"))"; else s="stopped"; fi
    echo "$d: $s"
  done
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then echo "munged: running"; else echo "munged: stopped"; fi
  alive "$DIR/slurmctld.pid" && sinfo
  return 0
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) die "usage: $0 start|stop|status" ;;
esac
