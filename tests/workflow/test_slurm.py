"""config/smoke.yaml on a real single-node SLURM cluster, through workflow/profiles/slurm.

The module starts its own SLURM from Debian's packages (install them with
`bash .ci/setup-slurm.sh`, the apt step of .ci/run): munged with a fresh key, slurmctld
and slurmd in the foreground, slurm.conf, state and logs in a temporary folder, random
ports, accounting off, and one node that advertises what `slurmd -C` finds (the real CPU
count and memory). Nothing is written outside the temporary folders. The client commands
find the config through wrappers put first on PATH (`SLURM_CONF=... exec /usr/bin/sbatch`):
the plugin's job steps drop every SLURM_* variable, SLURM_CONF too, before calling srun.

The test then runs the smoke DAG with `snakemake --profile workflow/profiles/slurm` and
checks that every job went through sbatch (the SLURM job ids in Snakemake's log, the
plugin's per-job logs, squeue) and that the artifacts are byte-identical to a plain local
`snakemake --cores 2` run (the session's ``snakemake_run``, which test_workflow.py reads too).
Three to six minutes on two cores; needs root.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from test_workflow import all_result_files, copy_repo

pytestmark = pytest.mark.integration

PROFILE = "workflow/profiles/slurm"
GPU_PROFILE = "workflow/profiles/slurm-gpu"
SMOKE = ["--configfile", "config/smoke.yaml"]
SETUP_HINT = "run `bash .ci/setup-slurm.sh` (the apt step of .ci/run) as root"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "sinfo", "scancel", "sacct", "sacctmgr", "sshare")
SNAKEMAKE_TIMEOUT = 900  # the SLURM run takes about 4 minutes on two busy cores
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+?)\)\.")
FINISHED = re.compile(r"Finished jobid: (\d+) \(Rule: (\w+)\)")
RULES = {"corpus", "model", "embed", "moments", "lmd_fit", "lmd_layers", "lmd_figures"}  # at least these


def base_env() -> dict[str, str]:
    """The venv's bin first on PATH, offline, and no SLURM settings from outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_snakemake(args, cwd, env, timeout=SNAKEMAKE_TIMEOUT) -> str:
    """snakemake ARGS in CWD; returns stdout + stderr, fails the test on error or timeout.

    The jobs import lmdecomp from CWD/src (PYTHONPATH, which sbatch --export=ALL passes
    on), not from the editable install, as the local run's do (tests/conftest.py).
    """
    cmd = ["snakemake", *args]
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(cwd) / "src"), env.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"{' '.join(cmd)} still running after {timeout} s:\n{out[-6000:]}", pytrace=False)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{out[-8000:]}", pytrace=False)
    return out


def find_program(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/bin"]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(missing)"


class SlurmCluster:
    """munged + slurmctld + slurmd on this machine, configured and logging under ROOT."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.extra_dirs: list[Path] = []
        self.bin = root / "bin"
        self.conf = root / "slurm.conf"
        self.node: dict[str, str] = {}

    # -- start ---------------------------------------------------------------------
    def start(self) -> None:
        programs = {name: find_program(name) for name in (*DAEMONS, *CLIENTS)}
        missing = sorted(name for name, path in programs.items() if path is None)
        if missing:
            pytest.fail(f"SLURM is not installed (missing {', '.join(missing)}): {SETUP_HINT}", pytrace=False)
        if os.geteuid() != 0:
            pytest.fail("the SLURM test starts munged, slurmctld and slurmd and must run as root", pytrace=False)
        self.programs = programs

        # slurmd -C prints this node as slurm.conf wants it: NodeName=... CPUs=... RealMemory=...
        probe = subprocess.run([programs["slurmd"], "-C"], capture_output=True, text=True, timeout=30)
        first = probe.stdout.splitlines()[0] if probe.stdout else ""
        self.node = dict(item.split("=", 1) for item in first.split() if "=" in item)
        if probe.returncode != 0 or "NodeName" not in self.node or "RealMemory" not in self.node:
            pytest.fail(f"`slurmd -C` did not describe this node:\n{probe.stdout}{probe.stderr}", pytrace=False)

        for sub in ("state", "spool", "bin", "munge"):
            (self.root / sub).mkdir(mode=0o700, exist_ok=True)
        self._start_munged()
        self._write_config()
        self._write_wrappers()
        self._spawn("slurmctld", [programs["slurmctld"], "-D", "-f", str(self.conf)])
        self._spawn("slurmd", [programs["slurmd"], "-D", "-f", str(self.conf), "-N", self.node["NodeName"]])
        self._wait_for_idle_node()

    def _start_munged(self) -> None:
        key = self.root / "munge" / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        socket_dir = self.root / "munge"
        if len(str(socket_dir / "munge.sock")) > 100:  # a unix socket path holds 108 bytes
            socket_dir = Path(tempfile.mkdtemp(prefix="lmd-munge-"))
            self.extra_dirs.append(socket_dir)
        self.munge_socket = socket_dir / "munge.sock"
        self._spawn("munged", [
            self.programs["munged"], "--foreground", "--force",  # --force: the temp dirs are not world-searchable
            f"--key-file={key}", f"--socket={self.munge_socket}",
            f"--pid-file={self.root / 'munge' / 'munged.pid'}", f"--seed-file={self.root / 'munge' / 'seed'}",
            f"--log-file={self.root / 'munged.log'}",
        ])
        self._wait(lambda: self.munge_socket.exists(), 15, "munged did not create its socket")

    def _write_config(self) -> None:
        r = self.root
        node = " ".join(f"{k}={v}" for k, v in self.node.items() if k != "UpTime")
        self.conf.write_text(f"""\
# Written by tests/workflow/test_slurm.py: one node, no accounting, everything under {r}
ClusterName=lmdtest
SlurmctldHost={self.node['NodeName']}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'slurmctld.log'}
SlurmdLogFile={r / 'slurmd.log'}
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
# squeue keeps finished jobs this long: the plugin's squeue status needs it >= 3 x its check
# interval, and the test asks squeue about every job of the run after the run ends
MinJobAge=3600
KillWait=5
{node} NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")

    def _write_wrappers(self) -> None:
        for name in CLIENTS:
            wrapper = self.bin / name
            wrapper.write_text(f'#!/bin/sh\nSLURM_CONF={self.conf} exec {self.programs[name]} "$@"\n')
            wrapper.chmod(0o755)

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = open(self.root / f"{name}.out", "wb")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env={**base_env(), "SLURM_CONF": str(self.conf)}, start_new_session=True)
        out.close()
        self.procs.append((name, proc))

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [name for name, proc in self.procs if proc.poll() is not None]
            if dead:
                pytest.fail(f"{', '.join(dead)} exited while starting SLURM:\n{self.diagnostics()}", pytrace=False)
            if ready():
                return
            time.sleep(0.2)
        pytest.fail(f"{what} within {timeout} s:\n{self.diagnostics()}", pytrace=False)

    def _wait_for_idle_node(self) -> None:
        def idle():
            proc = self.cli("sinfo", "--noheader", "--Node", "--format=%T", check=False)
            return proc.returncode == 0 and proc.stdout.split() == ["idle"]
        self._wait(idle, 60, "the node did not come up idle")

    # -- use -----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """base_env() with the SLURM wrappers first on PATH (sbatch --export=ALL hands it to the jobs)."""
        env = base_env()
        env["PATH"] = str(self.bin) + os.pathsep + env["PATH"]
        env["SLURM_CONF"] = str(self.conf)
        return env

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True,
                              env=self.env(), timeout=60)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def jobs(self) -> dict[str, tuple[str, str]]:
        """SLURM job id -> (state, comment) for every job slurmctld still knows (MinJobAge)."""
        out = self.cli("squeue", "--states=all", "--noheader", "--format=%i|%T|%k").stdout
        rows = [line.split("|", 2) for line in out.splitlines() if line.strip()]
        return {job_id: (state, comment) for job_id, state, comment in rows}

    def diagnostics(self) -> str:
        names = ["munged.log", "munged.out", "slurmctld.log", "slurmctld.out", "slurmd.log", "slurmd.out"]
        return "\n".join(f"--- {name}\n{tail(self.root / name)}" for name in names)

    # -- stop ----------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel what is left, then stop slurmd, slurmctld and munged (by the pids started here)."""
        if any(name == "slurmctld" and proc.poll() is None for name, proc in self.procs):
            try:
                self.cli("scancel", "--user", str(os.geteuid()), check=False)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline:
                    states = {state for state, _ in self.jobs().values()}
                    if not states & {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}:
                        break
                    time.sleep(0.5)
            except Exception:  # stopping must go on
                pass
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        self.procs.clear()
        for folder in self.extra_dirs:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def fit_memory_to_node(profile: Path, node_mb: int) -> list[str]:
    """Lower any mem_mb in the copied profile that this node could never grant (sbatch would refuse)."""
    data = yaml.safe_load(profile.read_text())
    lowered = []
    for rule, resources in data.get("set-resources", {}).items():
        if int(resources.get("mem_mb", 0)) > node_mb:
            lowered.append(f"{rule}: {resources['mem_mb']} -> {node_mb}")
            resources["mem_mb"] = node_mb
    if lowered:
        profile.write_text(yaml.safe_dump(data, sort_keys=False))
    return lowered


def job_stats(log: str) -> dict[str, int]:
    """Snakemake's 'Job stats' table: rule -> number of jobs."""
    table = log.split("Job stats:", 1)[1]
    counts = {}
    for line in table.splitlines()[3:]:
        name, _, count = line.strip().partition(" ")
        if name == "total" or not name:
            break
        counts[name] = int(count)
    return counts


def test_smoke_dag_on_slurm_matches_the_local_run_byte_for_byte(slurm, snakemake_run, repo_root, tmp_path):
    work = copy_repo(repo_root, tmp_path)
    lowered = fit_memory_to_node(work / PROFILE / "config.yaml", int(slurm.node["RealMemory"]))
    if lowered:
        print(f"mem_mb lowered to this node's RealMemory: {', '.join(lowered)}")

    log = run_snakemake(["--profile", PROFILE, *SMOKE], work, slurm.env())

    # (a) every job but the target rule `all` went through sbatch ...
    expected = {rule: n for rule, n in job_stats(log).items() if rule != "all"}
    submitted = {int(job): (slurm_id, Path(path)) for job, slurm_id, path in SUBMITTED.findall(log)}
    rule_of = {int(job): rule for job, rule in FINISHED.findall(log)}
    assert set(expected) >= RULES
    ran = {}
    for job, rule in rule_of.items():
        ran[rule] = ran.get(rule, 0) + 1
        if rule != "all":
            assert job in submitted, f"Snakemake job {job} ({rule}) finished without a SLURM job id:\n{log[-4000:]}"
    assert {rule: n for rule, n in ran.items() if rule != "all"} == expected
    assert len(submitted) == sum(expected.values())
    assert len({slurm_id for slurm_id, _ in submitted.values()}) == len(submitted)

    # ... slurmctld ran each one to completion, labelled with its rule ...
    known = slurm.jobs()
    for job, (slurm_id, slurm_log) in submitted.items():
        rule = rule_of[job]
        assert slurm_id in known, f"SLURM job {slurm_id} ({rule}) unknown to squeue: {known}"
        state, comment = known[slurm_id]
        assert state == "COMPLETED" and comment.startswith(f"rule_{rule}"), (slurm_id, state, comment)
        # ... and the plugin's per-job log (kept by the profile) is that job's output.
        assert slurm_log.name == f"{slurm_id}.log" and slurm_log.is_file(), slurm_log
        assert f"rule {rule}:" in slurm_log.read_text(), slurm_log

    # (b) the artifacts are the bytes a local run writes.
    slurm_files = all_result_files(work)
    local_files = all_result_files(snakemake_run)  # the session's local run (tests/conftest.py)
    assert sorted(slurm_files) == sorted(local_files)
    different = [rel for rel in local_files if local_files[rel] != slurm_files[rel]]
    assert different == [], f"SLURM and local runs wrote different bytes to {different}"


GPU_RULES = ("model", "embed", "variant", "finetune")  # pretraining, embedding, fine-tuning


def test_gpu_profile_is_the_slurm_profile_plus_one_gpu_for_the_training_and_embedding_rules(repo_root):
    cpu = yaml.safe_load((repo_root / PROFILE / "config.yaml").read_text())
    gpu = yaml.safe_load((repo_root / GPU_PROFILE / "config.yaml").read_text())
    expected = copy.deepcopy(cpu)
    for rule in GPU_RULES:
        expected["set-resources"][rule]["gpu"] = 1
    assert gpu == expected, f"{GPU_PROFILE} must be {PROFILE} plus `gpu: 1` for {GPU_RULES}"
    assert cpu["executor"] == "slurm" and cpu["slurm-status-command"] == "squeue"
    for rule, resources in cpu["set-resources"].items():
        assert {"mem_mb", "runtime", "cpus_per_task"} <= set(resources), rule


@pytest.mark.parametrize("profile", ["workflow/profiles/default", PROFILE, GPU_PROFILE])
def test_profiles_parse_and_give_every_rule_its_resources(profile, repo_root, tmp_path):
    """A dry run through each profile (needs the SLURM plugin, not SLURM itself)."""
    work = copy_repo(repo_root, tmp_path)
    log = run_snakemake(["--profile", profile, *SMOKE, "--dry-run", "--cores", "2"], work, base_env(), timeout=300)
    blocks = {m.group(1): m.group(0) for m in re.finditer(r"rule (\w+):\n(?:    .*\n)+", log)}
    assert set(blocks) >= RULES, log[-3000:]
    if profile == "workflow/profiles/default":
        return
    listed = set(yaml.safe_load((work / profile / "config.yaml").read_text())["set-resources"])
    unlisted = set(blocks) - listed - {"all"}
    assert not unlisted, f"rules without set-resources in {profile}/config.yaml: {sorted(unlisted)}"
    for rule in listed & set(blocks):
        block = blocks[rule]
        assert re.search(r"resources: .*mem_mb=\d+", block) and "runtime=" in block, block
        assert "cpus_per_task=" in block, block
        assert ("gpu=1" in block) == (profile == GPU_PROFILE and rule in GPU_RULES), block
