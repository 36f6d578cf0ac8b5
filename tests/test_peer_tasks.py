"""SkyPilot task YAML and dstack `type: task` files run as their users wrote them: translated into
orch's task (said once), run on the local provider with the variables their commands read on every
node, and what orch cannot honour (a bucket mount, a port, a service) refused by name with orch's
nearest equivalent, one line with the file and line, exit 2, nothing created."""

from __future__ import annotations

import io
import json
import textwrap
from pathlib import Path

import pytest

from tests.clouds import local_billing, lost_midway, open_orch
from tests.conftest import run_orch


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def fields(log: str, marker: str) -> dict:
    """``marker k=v k=v ...`` from a command's log, as a mapping."""
    line = next(x for x in log.splitlines() if x.startswith(marker))
    return dict(part.split("=", 1) for part in line[len(marker):].split() if "=" in part)


def live_instances() -> list:
    return [i for i in open_orch().ledger.instances() if i.state not in ("destroyed", "failed", "lost")]


def nothing_created(orch_home: Path) -> None:
    assert local_billing(orch_home) == set()
    if (orch_home / "ledger.db").exists():
        assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []


# -- run as they are -------------------------------------------------------------------------------
@pytest.mark.long(weight=2)
def test_a_skypilot_task_file_runs_unchanged_on_two_local_nodes_with_its_variables(orch_home, tmp_path):
    # SkyPilot's distributed-jobs example shape: num_nodes, envs (one to be given at launch), the
    # head taken from SKYPILOT_NODE_IPS; no accelerators: a CPU machine.
    task = write(tmp_path / "sky.yaml", """
        name: sky-pair
        num_nodes: 2
        resources:
          cpus: 1+
        envs:
          GREETING: hello
          FROM_SHELL:
        setup: |
          echo "SETUP rank=$SKYPILOT_SETUP_NODE_RANK ips=$(echo $SKYPILOT_SETUP_NODE_IPS | tr ' ' ,) \\
          gpus=$SKYPILOT_SETUP_NUM_GPUS_PER_NODE"
        run: |
          MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
          CLUSTER=$(echo "$SKYPILOT_CLUSTER_INFO" | python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["cloud"], d["cluster_name"], d["region"], sep="/")')
          echo "SKY rank=$SKYPILOT_NODE_RANK nodes=$SKYPILOT_NUM_NODES gpus=$SKYPILOT_NUM_GPUS_PER_NODE \\
          ips=$(echo $SKYPILOT_NODE_IPS | tr ' ' ,) master=$MASTER_ADDR greeting=$GREETING shell_len=${#FROM_SHELL} \\
          orch_ips=$(echo $ORCH_NODE_IPS | tr ' ' ,) procs=$ORCH_PROCS_PER_NODE task=$SKYPILOT_TASK_ID cluster=$CLUSTER"
        """)
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", "--wait", "--json",
                    env={"FROM_SHELL": "from-my-shell"}, check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed" and job["nodes"] == 2, job["history"][-3:]
    said = proc.stderr
    assert said.count("is a SkyPilot task") == 1, said
    assert "num_nodes: 2 -> nodes" in said and "FROM_SHELL (no value: given at launch) -> secrets" in said, said
    folder = orch_home / "runs" / "sky-pair"
    seen = {rank: fields((folder / log).read_text(), "SKY ") for rank, log in ((0, "train.log"),
                                                                              (1, "train.node1.log"))}
    ips = seen[0]["orch_ips"].split(",")
    assert len(ips) == 2 and len(set(ips)) == 2
    for rank, f in seen.items():
        assert (f["rank"], f["nodes"], f["gpus"]) == (str(rank), "2", "0"), f
        assert f["ips"] == seen[0]["orch_ips"] and f["master"] == ips[0], "head first, one per line"
        assert (f["greeting"], f["shell_len"], f["procs"]) == ("hello", "13", "1"), f
        # SKYPILOT_TASK_ID: one id for the task on every node (orch's job id); the cluster: this attempt's group.
        assert (f["task"], f["cluster"]) == (job["id"], "local/sky-pair-a1/None"), f
        # setup sees the same rank, addresses and GPUs under SkyPilot's SETUP_ names.
        setup = fields((folder / ("train.log" if rank == 0 else "train.node1.log")).read_text(), "SETUP ")
        assert (setup["rank"], setup["ips"], setup["gpus"]) == (str(rank), seen[0]["orch_ips"], "0"), setup
    assert live_instances() == [] and local_billing(orch_home) == set()


@pytest.mark.long
def test_a_dstack_task_file_runs_unchanged_on_the_local_provider_with_its_variables(orch_home, tmp_path):
    proj = tmp_path / "proj"  # a project folder: tmp_path itself holds the tests' home, never a workdir
    proj.mkdir()
    task = write(proj / ".dstack.yml", """
        type: task
        name: ds-one
        python: "3.12"
        env:
          - MODE=fast
          - FROM_SHELL
        commands:
          - echo first
          - echo "DS rank=$DSTACK_NODE_RANK nodes=$DSTACK_NODES_NUM master=$DSTACK_MASTER_NODE_IP ips=$DSTACK_NODES_IPS per=$DSTACK_GPUS_PER_NODE all=$DSTACK_GPUS_NUM mode=$MODE shell_len=${#FROM_SHELL} procs=$ORCH_PROCS_PER_NODE gpus=$ORCH_GPUS_PER_NODE"
          - echo "RUN name=$DSTACK_RUN_NAME run_id=$DSTACK_RUN_ID job_id=$DSTACK_JOB_ID here=$([ "$DSTACK_WORKING_DIR" = "$PWD" ] && echo yes) repo_dir=$DSTACK_REPO_DIR repo_id=$DSTACK_REPO_ID hosts=$(tr ' ' _ < "$DSTACK_MPI_HOSTFILE" | tr '\\n' ,)"
          - cat data.txt
        repos: [.]
        """)
    (proj / "data.txt").write_text("from the workdir\n")
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", "--wait", "--json",
                    env={"FROM_SHELL": "from-my-shell"}, check=0)
    job = json.loads(proc.stdout)
    assert job["state"] == "completed", job["history"][-3:]
    assert proc.stderr.count("is a dstack task") == 1 and "commands: 4 line(s) -> run" in proc.stderr
    log = (orch_home / "runs" / "ds-one" / "train.log").read_text()
    assert "first" in log
    f = fields(log, "DS ")
    assert (f["rank"], f["nodes"], f["per"], f["all"]) == ("0", "1", "0", "0"), f
    assert f["master"] == f["ips"] and f["master"].count(".") == 3
    assert (f["mode"], f["shell_len"]) == ("fast", "13"), "a variable without a value comes from this environment"
    assert (f["procs"], f["gpus"]) == ("1", "0"), "a CPU machine: one process per node, no GPU"
    run = fields(log, "RUN ")
    assert run["name"] == "ds-one" and run["here"] == "yes", run
    assert len({run["run_id"], run["job_id"], run["repo_id"]}) == 3 and all(
        len(run[k]) == 36 and run[k].count("-") == 4 for k in ("run_id", "job_id", "repo_id")), "UUIDs, as dstack's"
    assert run["repo_dir"] and "from the workdir" in log, "repos: [.] uploads the folder; DSTACK_REPO_DIR names it"
    assert run["hosts"] == f"{f['master']},", "dstack's hostfile: a CPU node is its address alone, one a line"
    assert live_instances() == []


@pytest.mark.long
def test_skypilots_task_id_is_the_jobs_and_stays_across_a_relaunch(orch_home, tmp_path):
    """SkyPilot: "all recoveries of that job will have the same ID value" (a W&B run id, a per-run
    path); dstack: the run's UUID stays, each submission gets its own. The machine is destroyed from
    outside once the first launch has recorded its ids; the relaunch restores the folder and adds its own."""
    task = write(tmp_path / "sky.yaml", """
        name: sky-again
        num_nodes: 1
        checkpoint: ckpt
        checkpoint_minutes: 0.02
        outputs: [ids.txt]
        run: |
          echo "$SKYPILOT_TASK_ID $DSTACK_RUN_ID $DSTACK_JOB_ID" >> ckpt/ids.txt
          cp ckpt/ids.txt ids.txt
          [ "$(wc -l < ckpt/ids.txt)" -ge 2 ] || sleep 600
        """)
    out, err = lost_midway("sky-again", 1, 300, "run", "-f", task, "--provider", "local", "--cpu", "--wait", "--json")
    job = json.loads(out)
    assert job["state"] == "completed", (job["history"][-5:], err[-2000:])
    ids = [line.split() for line in (orch_home / "runs" / "sky-again" / "ids.txt").read_text().splitlines()]
    assert len(ids) == 2, ids
    assert ids[0][0] == ids[1][0] == job["id"], "SKYPILOT_TASK_ID: the job's, the same after the relaunch"
    assert ids[0][1] == ids[1][1] and ids[0][2] != ids[1][2], "dstack: one run id; a job id per submission"
    assert live_instances() == [] and local_billing(orch_home) == set()


# -- translated as the peers' references say ---------------------------------------------------
def load(path: Path, text: str):
    """The task as orch reads it (``task.load``, through ``peer_tasks``), and what orch says of it."""
    from orchestrator.tasks import peer_tasks, task

    write(path, text)
    t, lines = task.load(path)
    return t, lines, "\n".join(peer_tasks.said(path, lines))


@pytest.mark.parametrize("accelerators, gpu, gpus, vram", [
    ("A100:8", "A100", 8, None),
    ("H100", "H100", 1, None),
    ("{A100: 4}", "A100", 4, None),
    ("[L4:2]", "L4", 2, None),
    ("A100-80GB:8", "A100", 8, 80.0),
    ("RTX4090:1", "RTX 4090", 1, None),
])
def test_skypilot_accelerators_in_each_form_the_yaml_spec_allows(tmp_path, accelerators, gpu, gpus, vram):
    t, _, said = load(tmp_path / "t.yaml", f"""
        resources:
          accelerators: {accelerators}
          use_spot: true
          disk_size: 256
        run: nvidia-smi
        """)
    assert (t.resources.gpu, t.resources.gpus, t.resources.min_vram) == (gpu, gpus, vram)
    assert t.resources.spot and t.resources.disk == 256 and not t.resources.cpu
    assert "resources.accelerators" in said and said.count("is a SkyPilot task") == 1


@pytest.mark.parametrize("spec, gpu, gpus, vram, most, cpu", [
    ("24GB", None, 1, 24.0, 24.0, False),  # a plain memory is a Range of one value: exactly 24GB
    ("A100:2", "A100", 2, None, None, False),
    ("A100:40GB:2", "A100", 2, 40.0, 40.0, False),
    ("nvidia:H100:1..2", "H100", 1, None, None, False),
    ("24GB..80GB:2", None, 2, 24.0, 80.0, False),
    ("24GB..", None, 1, 24.0, None, False),
    ("..40GB", None, 1, None, 40.0, False),
    ("{name: L4, count: 2, memory: 24GB}", "L4", 2, 24.0, 24.0, False),
    ("2", None, 2, None, None, False),
    ("0", None, 1, None, None, True),
])
def test_dstack_gpu_specs_as_dstack_parses_them(tmp_path, spec, gpu, gpus, vram, most, cpu):
    t, _, _ = load(tmp_path / "t.dstack.yml", f"""
        type: task
        commands: [nvidia-smi]
        resources:
          gpu: {spec}
          disk: 100GB..
        """)
    assert (t.resources.gpu, t.resources.gpus, t.resources.min_vram, t.resources.cpu) == (gpu, gpus, vram, cpu)
    assert t.resources.max_vram == most and t.resources.disk == 100


def test_a_gpu_memory_range_upside_down_is_refused_on_its_line(orch_home, tmp_path):
    task = write(tmp_path / "t.dstack.yml", """
        type: task
        commands: [nvidia-smi]
        resources:
          gpu: 80GB..24GB
        """)
    err = run_orch("run", "-f", task, check=2).stderr
    assert f"{task}:4:" in err and "80GB..24GB" in err and err.count("\n") == 1, err
    mine = write(tmp_path / "t.yaml", """
        name: t
        resources: {gpu: A100, min_vram: 80, max_vram: 40}
        run: nvidia-smi
        """)
    err = run_orch("run", "-f", mine, check=2).stderr
    assert f"{mine}:2:" in err and "max_vram 40 is below min_vram 80" in err, err
    nothing_created(orch_home)


def test_dstack_commands_join_as_dstack_runs_them_and_env_takes_both_forms(tmp_path):
    t, _, said = load(tmp_path / "a.dstack.yml", """
        type: task
        name: Train_Distrib
        nodes: 2
        env:
          - A=1
          - TOKEN
        commands:
          - pip install x
          - python serve.py &
          - python train.py
        spot_policy: spot
        max_duration: 90m
        """)
    assert t.run == "pip install x && { python serve.py & } && python train.py"
    assert t.env == {"A": "1"} and t.secrets == ["TOKEN"] and t.nodes == 2 and t.resources.spot
    assert t.name == "train-distrib" and t.max_hours == 1.5 and t.resources.cpu
    assert "name: Train_Distrib -> train-distrib" in said
    t, _, _ = load(tmp_path / "b.dstack.yml", """
        type: task
        env: {A: 1, B: two}
        commands: [echo hi]
        """)
    assert t.env == {"A": 1, "B": "two"} and t.secrets == []


def test_dstacks_per_node_volume_names_are_orchs_per_node_volumes(tmp_path):
    """dstack's "Distributed tasks" volumes: ``name: data-${{ dstack.node_rank }}`` gives node R
    volume data-R, which is orch's ``per_node: true``."""
    from orchestrator.tasks.task import VolumeSpec

    t, _, said = load(tmp_path / "v.dstack.yml", """
        type: task
        nodes: 2
        commands: [ls /hf /data]
        volumes:
          - name: hfc-${{ dstack.node_rank }}
            path: /hf
          - shared-${{dstack.job_num}}:/data
        """)
    assert t.volumes == {"/hf": VolumeSpec(name="hfc", per_node=True), "/data": VolumeSpec(name="shared", per_node=True)}
    assert "node R mounts hfc-R" in said, said


def test_a_skypilot_volume_mount_keeps_what_orch_does_as_skypilot_would(tmp_path):
    t, _, said = load(tmp_path / "t.yaml", """
        num_nodes: 1
        file_mounts:
          /vol:
            name: data
            store: volume
            persistent: true
            mode: MOUNT
        run: ls /vol
        """)
    assert t.volumes == {"/vol": "data"} and "persistent: true, as orch keeps volume data" in said, said


def test_the_peers_default_disks_are_carried(tmp_path):
    """SkyPilot's ``_DEFAULT_DISK_SIZE_GB = 256`` (sky/resources.py); dstack's ``DEFAULT_DISK``, 100GB..
    (core/models/resources.py): a file that names no disk gets what its peer would have rented."""
    sky, _, said = load(tmp_path / "t.yaml", """
        num_nodes: 1
        resources: {accelerators: L4}
        run: nvidia-smi
        """)
    assert sky.resources.disk == 256 and "SkyPilot's default" in said
    ds, _, said = load(tmp_path / "t.dstack.yml", """
        type: task
        commands: [nvidia-smi]
        resources: {gpu: L4}
        """)
    assert ds.resources.disk == 100 and "dstack's default" in said
    given, _, _ = load(tmp_path / "u.dstack.yml", """
        type: task
        commands: [nvidia-smi]
        resources: {gpu: L4, disk: 500GB}
        """)
    assert given.resources.disk == 500


def test_a_dstack_file_without_repos_whose_commands_name_its_folders_files_says_the_workdir_is_empty(
        orch_home, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "train.py").write_text("print('hi')\n")
    (folder / "requirements.txt").write_text("\n")
    task = write(folder / ".dstack.yml", """
        type: task
        name: bare
        commands:
          - pip install -r requirements.txt
          - python train.py --epochs 1
        """)
    dry = run_orch("run", "-f", task, "--provider", "local", "--dry-run", check=0)
    assert "orch: warning:" in dry.stderr and "requirements.txt, train.py" in dry.stderr, dry.stderr
    assert "empty workdir" in dry.stderr and "repos: [.]" in dry.stderr, dry.stderr
    assert "workdir  none: the command starts in an empty folder" in dry.stdout, dry.stdout
    write(task, """
        type: task
        name: bare
        repos: [.]
        commands:
          - python train.py --epochs 1
        """)
    dry = run_orch("run", "-f", task, "--provider", "local", "--dry-run", check=0)
    assert "warning" not in dry.stderr, dry.stderr
    assert f"workdir  {folder}: 3 file(s)" in dry.stdout, dry.stdout
    nothing_created(orch_home)


@pytest.mark.parametrize("variable", ["DSTACK_GPUS_NUM", "SKYPILOT_NUM_GPUS_PER_NODE", "ORCH_GPUS_PER_NODE"])
def test_a_group_on_cpu_machines_counting_processes_by_gpus_is_warned_before_renting(orch_home, tmp_path, variable):
    """0 GPUs on a CPU machine: ``accelerate launch --num_processes=$DSTACK_GPUS_NUM`` starts a
    world of one on each node, which trains apart and reports success (issue 55's dstack twin)."""
    task = write(tmp_path / "t.yaml", f"""
        name: apart
        nodes: 2
        resources: {{cpu: true}}
        run: accelerate launch --num_processes=${variable} train.py
        """)
    dry = run_orch("run", "-f", task, "--provider", "local", "--dry-run", check=0)
    warning = [line for line in dry.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and f"{task}:4:" in warning[0] and variable in warning[0], dry.stderr
    assert "$ORCH_PROCS_PER_NODE" in warning[0], warning
    write(task, """
        name: apart
        nodes: 2
        resources: {cpu: true}
        run: accelerate launch --num_processes=$ORCH_PROCS_PER_NODE train.py
        """)
    assert "warning" not in run_orch("run", "-f", task, "--provider", "local", "--dry-run", check=0).stderr
    nothing_created(orch_home)


def test_a_file_in_orchs_own_dialect_passes_unchanged_and_says_nothing(tmp_path):
    t, _, said = load(tmp_path / "t.yaml", """
        name: mine
        resources: {gpu: RTX 4090}
        env: {A: "1"}
        run: python x.py
        """)
    assert said == "" and t.resources.gpu == "RTX 4090" and t.env == {"A": "1"}


def test_a_wrong_value_in_a_translated_key_names_the_line_the_user_wrote(orch_home, tmp_path):
    task = write(tmp_path / "t.yaml", """
        name: t
        num_nodes: 1
        envs:
          OK: fine
          BAD: [1, 2]
        run: echo hi
        """)
    err = run_orch("run", "-f", task, check=2).stderr
    assert f"{task}:5:" in err and "env.BAD" in err and err.count("\n") == 1, err
    nothing_created(orch_home)


# -- refused by name, with orch's nearest equivalent ---------------------------------------------
def volume_mount(key: str) -> str:
    """A SkyPilot file mounting volume ``data`` at /vol with one more key of its storage mapping (line 7)."""
    return f"""
        name: t
        num_nodes: 1
        file_mounts:
          /vol:
            name: data
            store: volume
            {key}
        run: ls /vol
        """


REFUSALS = {
    "bucket file_mounts": ("sky.yaml", """
        name: t
        num_nodes: 1
        file_mounts:
          /data: s3://my-bucket/data
        run: ls /data
        """, 4, ["file_mounts /data: a bucket (s3://my-bucket/data)", "volumes: {PATH: NAME}", "outputs:"]),
    "bucket storage": ("sky.yaml", """
        name: t
        envs: {A: 1}
        file_mounts:
          /ckpt:
            name: my-bucket
            store: s3
            mode: MOUNT
        run: ls /ckpt
        """, 4, ["a bucket (my-bucket)", "orch volume create"]),
    "skypilot ports": ("sky.yaml", """
        name: t
        resources:
          accelerators: L4
          ports: 8080
        run: python serve.py
        """, 4, ["ports 8080", "outputs:", "orch ssh NAME"]),
    "skypilot service": ("sky.yaml", """
        name: t
        num_nodes: 1
        service:
          readiness_probe: /v1/models
          replicas: 2
        run: python serve.py
        """, 3, ["a SkyServe service", "outputs:"]),
    "dstack ports": ("t.dstack.yml", """
        type: task
        commands: [jupyter lab]
        ports:
          - 8888
        """, 3, ["ports: [8888]", "orch ssh NAME"]),
    "dstack service": ("s.dstack.yml", """
        type: service
        commands: [python serve.py]
        port: 8000
        """, 1, ["a dstack service", "outputs:"]),
    "dstack dev-environment": ("d.dstack.yml", """
        type: dev-environment
        ide: vscode
        """, 1, ["a dstack dev environment", "orch up NAME"]),
    "a secret's value in the file": ("sky.yaml", """
        name: t
        secrets:
          HF_TOKEN: hf_abc
        run: echo hi
        """, 3, ["secrets.HF_TOKEN holds its value in the file", "export HF_TOKEN"]),
    "a volume's source": ("sky.yaml", volume_mount("source: ./dataset"), 7, ["file_mounts /vol: source ./dataset synced into volume data", "copy it onto the volume in setup:"]),
    "a volume that is not persistent": ("sky.yaml", volume_mount("persistent: false"), 7, ["persistent: false (volume data deleted when the task ends)", "orch volume rm data"]),
    "a volume's config": ("sky.yaml", volume_mount("config: {mount_cached: {transfers: 8}}"), 7, ["config: (per-store options for volume data)", "drop it"]),
    "a dstack volume name interpolated otherwise": ("v.dstack.yml", """
        type: task
        commands: [ls /data]
        volumes:
          - name: ${{ dstack.node_rank }}-data
            path: /data
        """, 4, ["volume name ${{ dstack.node_rank }}-data", "per_node: true", "NAME-R"]),
    "a choice of GPUs": ("sky.yaml", """
        resources:
          accelerators: {A100:1, H100:1}
        run: echo hi
        """, 2, ["a choice of GPUs (A100:1, H100:1)", "orch offers"]),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_orch_cannot_honour_is_refused_by_name_with_its_nearest_equivalent(orch_home, tmp_path, case):
    name, text, line, words = REFUSALS[case]
    task = write(tmp_path / name, text)
    proc = run_orch("run", "-f", task, "--provider", "local", "--cpu", check=2)
    err = proc.stderr
    assert err.count("\n") == 1 and err.startswith(f"orch: error: {task}:{line}: "), err
    assert "orch cannot honour it; nearest in orch:" in err
    for word in words:
        assert word in err, (word, err)
    nothing_created(orch_home)


# -- the variables every node finds ---------------------------------------------------------------
def test_every_node_finds_the_peers_variables_beside_orchs_own():
    from orchestrator.nodes import node_env

    env = node_env(1, ["10.0.0.1", "10.0.0.2"], 8, master_port=29500)
    assert env["SKYPILOT_NODE_RANK"] == env["DSTACK_NODE_RANK"] == env["ORCH_NODE_RANK"] == "1"
    assert env["SKYPILOT_NODE_IPS"] == env["DSTACK_NODES_IPS"] == env["ORCH_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["SKYPILOT_NUM_NODES"] == env["DSTACK_NODES_NUM"] == "2"
    assert env["DSTACK_MASTER_NODE_IP"] == "10.0.0.1"
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == env["DSTACK_GPUS_PER_NODE"] == env["ORCH_PROCS_PER_NODE"] == "8"
    assert env["DSTACK_GPUS_NUM"] == "16"
    assert (env["SKYPILOT_SETUP_NODE_RANK"], env["SKYPILOT_SETUP_NODE_IPS"], env["SKYPILOT_SETUP_NUM_GPUS_PER_NODE"]) \
        == ("1", "10.0.0.1\n10.0.0.2", "8"), "setup: the same facts (SkyPilot's environment variables for setup)"
    cpu = node_env(0, ["10.0.0.1"], 0)
    assert (cpu["ORCH_GPUS_PER_NODE"], cpu["ORCH_PROCS_PER_NODE"], cpu["SKYPILOT_NUM_GPUS_PER_NODE"],
            cpu["DSTACK_GPUS_NUM"]) == ("0", "1", "0", "0")


def test_dstacks_mpi_hostfile_lists_gpu_nodes_with_their_slots_and_cpu_nodes_alone():
    from orchestrator.nodes import mpi_hostfile

    assert mpi_hostfile(["10.0.0.1", "10.0.0.2"], 8) == "10.0.0.1 slots=8\n10.0.0.2 slots=8\n"
    assert mpi_hostfile(["10.0.0.1"], 0) == "10.0.0.1\n"
    with pytest.raises(ValueError):
        mpi_hostfile(["10.0.0.1\nslots=99"], 1)  # an address from a provider is input: only IP literals


def test_the_examples_count_processes_with_orch_procs_per_node():
    """On a CPU machine ORCH_GPUS_PER_NODE is 0: a process count taken from it starts nothing."""
    from tests.conftest import ROOT

    counted = []
    for task in sorted((ROOT / "examples").glob("*/task.yaml")):
        for line in task.read_text().splitlines():
            if any(word in line for word in ("nproc", "procs=")):  # where a process count is taken
                counted.append(line)
                assert "ORCH_PROCS_PER_NODE" in line and "ORCH_GPUS_PER_NODE" not in line, f"{task}: {line}"
    assert counted, "the torchrun and accelerate examples count their processes"
