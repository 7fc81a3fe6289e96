"""The table of SPEC §3 cases shared by the form and the API (for test_spec_limits.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from jobs import validators as v
from tests.spec_io import DEDICATED


# -- the table ---------------------------------------------------------------------------------------------------
def env(n: int, start: int = 0) -> list[dict]:
    return [{"name": f"VAR_{i}", "value": str(i), "sensitive": i % 2 == 0} for i in range(start, start + n)]


def mounts(n: int, fs: str = "fs1") -> list[dict]:
    return [{"file_system": fs, "path": "/", "mount_path": f"/mnt/m{i}", "read_only": i % 2 == 1} for i in range(n)]


def tags(n: int) -> list[dict]:
    return [{"key": f"k{i}", "value": f"v{i}"} for i in range(n)]


ARTIFACTS = {"store_artifacts": True, "artifact_path": "obs://bucket/out/"}
PUBLISH_NEW = {
    **ARTIFACTS,
    "auto_publish": True,
    "publish_as": "new",
    "model_name": "my-model",
    "model_type": "text_generation",
    "model_description": "Fine-tuned for the test.",
}
PRESET = {"image_source": "preset", "preset_image": "busybox"}
DESCRIPTION_OK = "训练 job-1_a, b. 中文，。" + "x" * 236  # 256 characters of every allowed kind
MODEL_NAME_128 = "m" + "x" * 126 + "1"


@dataclass
class Case:
    id: str
    values: dict
    field: str  # the model (and form) field refused
    needle: str  # a word of the message: the limit or the rule

    def param(self):
        return pytest.param(self, id=self.id)


REFUSED = [
    # basic
    Case("name-65", {"name": "n" * 65}, "name", "64"),
    Case("name-chars", {"name": "bad name!"}, "name", "letters, digits"),
    Case("name-empty", {"name": ""}, "name", "required"),
    Case("description-257", {"description": "d" * 257}, "description", "256"),
    Case("description-chars", {"description": "no ! or ?"}, "description", "not allowed: '!' '?'"),
    Case("description-newline", {"description": "a\nb"}, "description", "0-256 characters"),
    Case("finetune-without-start", {"training_mode": "finetune"}, "training_mode", "preset template or a model"),
    Case("training-mode-unknown", {"training_mode": "magic"}, "training_mode", "custom or finetune"),
    # training
    Case("preset-image-needs-code-dir", {**PRESET}, "code_dir", "required with a preset image"),
    Case("code-dir-no-slash", {"code_dir": "obs://bucket/code"}, "code_dir", "ending with '/'"),
    Case("code-dir-not-obs", {"code_dir": "s3://bucket/code/"}, "code_dir", "obs://"),
    Case("code-dir-missing", {"code_dir": "obs://bucket/nothing/"}, "code_dir", "does not exist"),
    Case("code-dir-1001-files", {"code_dir": "obs://bucket/files-1001/"}, "code_dir", "at most 1000 files"),
    Case("code-dir-depth-33", {"code_dir": "obs://bucket/depth-33/"}, "code_dir", "at most 32 levels"),
    Case("code-dir-over-5gb", {"code_dir": "obs://bucket/size-over/"}, "code_dir", "at most 5 GB"),
    Case("backup-dir-no-bucket", {"code_backup_dir": "obs://nobucket/b/"}, "code_backup_dir", "does not exist"),
    Case("local-code-dir-home", {"local_code_dir": "/home/ma-user"}, "local_code_dir", "not /home/ma-user"),
    Case("local-code-dir-home-slash", {"local_code_dir": "/home/ma-user/"}, "local_code_dir", "/home/ma-user"),
    Case("local-code-dir-modelarts", {"local_code_dir": "/home/ma-user/modelarts/x"}, "local_code_dir", "under"),
    Case("local-code-dir-modelarts-itself", {"local_code_dir": "/home/ma-user/modelarts"}, "local_code_dir", "under"),
    Case("local-code-dir-dev", {"local_code_dir": "/home/ma-user/modelarts-dev/code"}, "local_code_dir", "under"),
    Case("local-code-dir-infer", {"local_code_dir": "/home/ma-user/infer/code"}, "local_code_dir", "under"),
    Case("local-code-dir-relative", {"local_code_dir": "code/dir"}, "local_code_dir", "absolute path"),
    Case(
        "local-code-dir-dotdot", {"local_code_dir": "/home/ma-user/work/../modelarts/x"}, "local_code_dir", "absolute"
    ),
    Case("env-101", {"environments": env(101)}, "environments", "at most 100"),
    Case("env-bad-name", {"environments": [{"name": "1BAD", "value": "x"}]}, "environments", "not a valid name"),
    Case("env-dash-name", {"environments": [{"name": "MY-VAR", "value": "x"}]}, "environments", "not a valid name"),
    Case("env-twice", {"environments": env(1) + env(1)}, "environments", "set twice"),
    Case("env-platform", {"environments": [{"name": "RANK", "value": "3"}]}, "environments", "set by the platform"),
    Case("env-ma-prefix", {"environments": [{"name": "MA_JOB_DIR", "value": "/x"}]}, "environments", "all MA_* names"),
    # resources
    Case("pool-public-as-dedicated", {**DEDICATED, "pool": "test-pool"}, "pool", "public pool"),
    Case(
        "dedicated-without-pool", {"pool_type": "dedicated", "flavor": "cpu-small"}, "pool", "dedicated resource pool"
    ),
    Case("dedicated-without-flavor", {"pool_type": "dedicated", "pool": "ded"}, "flavor", "Choose a flavor"),
    Case("flavor-larger-than-node", {**DEDICATED, "flavor": "cpu-huge"}, "flavor", "larger than a node"),
    Case("flavor-single-process", {"flavor": "GPU:1*tnt004", "node_count": 2}, "flavor", "single-process"),
    Case(
        "public-kind-mismatch",
        {**PRESET, "preset_image": "busybox-gpu", "code_dir": "obs://bucket/code/", "flavor": "cpu-small"},
        "flavor",
        "same kind",
    ),  # fmt: skip
    Case("public-custom-kind-mismatch", {"image_kind": "cpu", "flavor": "gpu-1"}, "flavor", "all CPU or all GPU"),
    Case(
        "custom-cpus-over-node",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 8.5, "custom_memory_gb": 8},
        "custom_cpus",
        "between 0.1 and 8",
    ),
    Case(
        "custom-gpus-over-node",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 2, "custom_memory_gb": 8, "custom_gpus": 3},
        "custom_gpus",
        "between 0 and 2",
    ),
    Case(
        "custom-memory-missing",
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 2},
        "custom_memory_gb",
        "required with a custom spec",
    ),
    Case("node-count-0", {"node_count": 0}, "node_count", "between 1 and 64"),
    Case("node-count-65", {"node_count": 65}, "node_count", "between 1 and 64"),
    Case("mounts-16", {**DEDICATED, "file_system_mounts": mounts(16)}, "file_system_mounts", "at most 15"),
    Case(
        "mount-path-twice",
        {**DEDICATED, "file_system_mounts": mounts(1) + mounts(1, fs="hostfs")},
        "file_system_mounts",
        "used twice",
    ),
    Case(
        "mount-path-twice-across-kinds",
        {
            **DEDICATED,
            "file_system_mounts": mounts(1),
            "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/m0/"}],
        },
        "obs_mounts",
        "used twice",
    ),
    Case(
        "artifact-mount-at-the-local-code-dir",
        {**ARTIFACTS, "local_code_dir": "/opt/code", "artifact_mount_path": "/opt/code"},
        "artifact_mount_path",
        "used twice",
    ),
    Case(
        "artifact-mount-at-the-mutual-trust-dir",
        {**ARTIFACTS, "mutual_trust": True, "mutual_trust_dir": "/opt/keys", "artifact_mount_path": "/opt/keys"},
        "artifact_mount_path",
        "used twice",
    ),
    *[
        Case(
            f"mount-path-{name}",
            {**DEDICATED, "file_system_mounts": [{"file_system": "fs1", "mount_path": path}]},
            "file_system_mounts",
            "not / nor /cache",
        )
        for name, path in [
            ("root", "/"),
            ("cache", "/cache"),
            ("modelarts", "/home/ma-user/modelarts"),
            ("below-modelarts", "/home/ma-user/modelarts/data"),
            ("job-data", "/job-data"),
            # The console's own /etc/hosts of a single instance (docker_hosts.HOSTS_FILE).
            ("etc-hosts", "/etc/hosts"),
            ("relative", "data"),
        ]
    ],
    Case(
        "mount-unknown-file-system",
        {**DEDICATED, "file_system_mounts": [{"file_system": "nope", "mount_path": "/mnt/x"}]},
        "file_system_mounts",
        "no file system named 'nope'",
    ),
    Case(
        "mount-bad-options",
        {**DEDICATED, "file_system_mounts": [{"file_system": "fs1", "mount_path": "/mnt/x", "options": "vers=3,;rm"}]},
        "file_system_mounts",
        "NFS options",
    ),
    *[
        # Where the server is belongs to the file system: a job's own address or port would point
        # the engine's mount (root, the host's network) at another server or the host's loopback.
        Case(
            f"mount-options-{name}",
            {**DEDICATED, "file_system_mounts": [{"file_system": "fs1", "mount_path": "/mnt/x", "options": options}]},
            "file_system_mounts",
            f"Mount options cannot set '{refused}'",
        )
        for name, options, refused in [
            ("addr", "vers=3,nolock,addr=10.0.0.9", "addr=10.0.0.9"),
            ("loopback", "vers=3,addr=127.0.0.1,port=2049", "addr=127.0.0.1"),
            ("mountport", "vers=3,mountport=111", "mountport=111"),
            ("clientaddr", "vers=4.1,clientaddr=10.0.0.1", "clientaddr=10.0.0.1"),
            ("upper-case", "vers=3,ADDR=10.0.0.9", "ADDR=10.0.0.9"),
        ]
    ],
    Case(
        "obs-mounts-2",
        {
            **DEDICATED,
            "obs_mounts": [
                {"obs_url": "obs://bucket/data/", "mount_path": "/mnt/a"},
                {"obs_url": "obs://bucket/out/", "mount_path": "/mnt/b"},
            ],
        },
        "obs_mounts",
        "at most 1",
    ),
    Case(
        "obs-mount-cache",
        {**DEDICATED, "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/cache"}]},
        "obs_mounts",
        "not / nor /cache",
    ),
    Case("priority-0", {**DEDICATED, "priority": 0}, "priority", "1-3"),
    Case("priority-4", {**DEDICATED, "priority": 4}, "priority", "1-3"),
    Case("priority-3-without-permission", {**DEDICATED, "priority": 3}, "priority", "may use high priority"),
    Case(
        "affinity-foreign-host",
        {**DEDICATED, "affinity": "affinity", "affinity_hosts": ["local"]},
        "affinity_hosts",
        "hosts of pool ded",
    ),
    Case("affinity-no-host", {**DEDICATED, "affinity": "anti_affinity"}, "affinity_hosts", "at least one host"),
    # dedicated-only settings on the public pool
    *[
        Case(f"public-{field_}", values, field_, "only available on a dedicated resource pool")
        for field_, values in [
            ("spec_type", {"spec_type": "custom", "custom_cpus": 1, "custom_memory_gb": 1}),
            ("affinity", {"affinity": "affinity", "affinity_hosts": ["ded-1"]}),
            ("file_system_mounts", {"file_system_mounts": mounts(1)}),
            ("obs_mounts", {"obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/mnt/o"}]}),
            ("priority", {"priority": 2}),
            ("preemptible", {"preemptible": True}),
            ("tensorboard", {"tensorboard": True, "observe_file_system": "fs1"}),
            ("mindstudio_insight", {"mindstudio_insight": True, "observe_file_system": "fs1"}),
            ("retention_hours", {"retention_hours": 2}),
        ]
    ],
    # data
    Case("datasets-4", {"datasets": ["preset-1", "preset-2", "preset-3", "mine"]}, "datasets", "at most 3"),
    Case("dataset-offline", {"datasets": ["mine-offline"]}, "datasets", "offline"),
    Case("dataset-not-mine", {"datasets": ["theirs"]}, "datasets", "not yours"),
    # storage
    Case("artifacts-without-path", {"store_artifacts": True}, "artifact_path", "Storage path is required"),
    Case("artifacts-path-no-slash", {**ARTIFACTS, "artifact_path": "obs://bucket/out"}, "artifact_path", "obs://"),
    *[
        Case(f"artifact-mount-{name}", {**ARTIFACTS, "artifact_mount_path": path}, "artifact_mount_path", needle)
        for name, path, needle in [
            ("home", "/home/", "system directories"),
            ("home-no-slash", "/home", "system directories"),
            ("ma-user", "/home/ma-user/", "system directories"),
            ("modelarts", "/home/ma-user/modelarts/", "system directories"),
            ("dot", "/home/ma-user/out.put", "letters, digits, '-', '_' and '/'"),
            ("space", "/home/ma-user/out put", "letters, digits, '-', '_' and '/'"),
            ("cache", "/cache", "not / nor /cache"),
        ]
    ],
    Case("publish-needs-artifacts", {**PUBLISH_NEW, "store_artifacts": False}, "auto_publish", "store artifacts on"),
    Case("model-name-1-char", {**PUBLISH_NEW, "model_name": "m"}, "model_name", "2-128 characters"),
    Case("model-name-1-cjk", {**PUBLISH_NEW, "model_name": "模"}, "model_name", "2-128 characters"),
    Case("model-name-129", {**PUBLISH_NEW, "model_name": MODEL_NAME_128 + "x"}, "model_name", "2-128 characters"),
    Case("model-name-starts-digit", {**PUBLISH_NEW, "model_name": "1model"}, "model_name", "starting with"),
    Case("model-name-starts-dash", {**PUBLISH_NEW, "model_name": "-model"}, "model_name", "starting with"),
    Case("model-name-ends-dash", {**PUBLISH_NEW, "model_name": "model-"}, "model_name", "ending with"),
    Case("model-name-dot", {**PUBLISH_NEW, "model_name": "my.model"}, "model_name", "CJK characters, letters"),
    Case("model-name-taken", {**PUBLISH_NEW, "model_name": "existing-model"}, "model_name", "already have a model"),
    Case("model-name-missing", {**PUBLISH_NEW, "model_name": ""}, "model_name", "required for a new model"),
    Case("model-type-missing", {**PUBLISH_NEW, "model_type": ""}, "model_type", "required for a new model"),
    Case("model-type-unknown", {**PUBLISH_NEW, "model_type": "audio"}, "model_type", "must be one of"),
    Case("model-description-missing", {**PUBLISH_NEW, "model_description": ""}, "model_description", "required"),
    Case(
        "version-of-their-model",
        {**PUBLISH_NEW, "publish_as": "version", "publish_model": "their-model"},
        "publish_model",
        "no model named 'their-model'",
    ),
    Case(
        "version-description-257",
        {**PUBLISH_NEW, "version_description": "v" * 257},
        "version_description",
        "at most 256",
    ),
    # high availability
    Case("max-restarts-129", {"fault_tolerance": True, "max_restarts": 129}, "max_restarts", "between 1 and 128"),
    Case("hang-restart-without-ft", {"hang_restart": True}, "fault_tolerance", "need fault tolerance on"),
    Case("pod-retry-129", {"fault_tolerance": True, "max_restarts": 3, "pod_retry_num": 129}, "pod_retry_num", "128"),
    # access
    Case(
        "ssh-and-mutual-trust",
        {"ssh_remote": True, "ssh_key_pair": "laptop", "mutual_trust": True},
        "mutual_trust",
        "SSH remote development and mutual-trust SSH files exclude each other",
    ),
    Case("ssh-without-key", {"ssh_remote": True}, "ssh_key_pair", "needs a key pair"),
    Case("ssh-their-key", {"ssh_remote": True, "ssh_key_pair": "their-key"}, "ssh_key_pair", "no key pair named"),
    Case("mutual-trust-dir-root", {"mutual_trust": True, "mutual_trust_dir": "/"}, "mutual_trust_dir", "other than /"),
    # observe
    Case(
        "tensorboard-and-mindstudio",
        {**DEDICATED, "tensorboard": True, "mindstudio_insight": True, "observe_file_system": "fs1"},
        "mindstudio_insight",
        "TensorBoard and MindStudio Insight exclude each other",
    ),
    Case("tensorboard-without-fs", {**DEDICATED, "tensorboard": True}, "observe_file_system", "needs a file system"),
    Case(
        "summary-path-modelarts",
        {**DEDICATED, "tensorboard": True, "observe_file_system": "fs1", "observe_path": "/home/ma-user/modelarts/s"},
        "observe_path",
        "not / nor /cache",
    ),
    Case(
        "metrics-port-0",
        {"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 0},
        "metrics_port",
        "1-65535",
    ),
    Case(
        "metrics-port-65536",
        {"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 65536},
        "metrics_port",
        "1-65535",
    ),
    Case(
        "metrics-path", {"metrics_mode": "http", "metrics_path": "metrics", "metrics_port": 9100}, "metrics_path", "'/'"
    ),
    Case("metrics-command-missing", {"metrics_mode": "command"}, "metrics_command", "command"),
    # more
    Case("keep-logs-without-path", {"keep_logs": True}, "log_export_path", "Log path is required"),
    Case("log-path-no-slash", {"keep_logs": True, "log_export_path": "obs://bucket/logs"}, "log_export_path", "obs://"),
    Case("auto-stop-0", {"auto_stop_hours": 0}, "auto_stop_hours", "1-720 hours"),
    Case("auto-stop-721", {"auto_stop_hours": 721}, "auto_stop_hours", "1-720 hours"),
    Case("retention-0", {**DEDICATED, "retention_hours": 0}, "retention_hours", "1-720 hours"),
    Case("retention-721", {**DEDICATED, "retention_hours": 721}, "retention_hours", "1-720 hours"),
    Case(
        "retention-with-fault-tolerance",
        {**DEDICATED, "retention_hours": 2, "fault_tolerance": True, "max_restarts": 3},
        "retention_hours",
        "incompatible with fault tolerance",
    ),
    Case("tags-21", {"tags": tags(21)}, "tags", "at most 20"),
    Case("tags-same-key", {"tags": tags(1) + tags(1)}, "tags", "unique"),
    Case("tag-key-empty", {"tags": [{"key": "", "value": "v"}]}, "tags", "1-128"),
    Case("visibility-unknown", {"visibility": "everyone"}, "visibility", "not a valid choice"),
]

ACCEPTED = [
    pytest.param({"name": "n" * 64}, id="name-64"),
    pytest.param({"name": "a"}, id="name-1"),
    pytest.param({"description": DESCRIPTION_OK}, id="description-256-all-kinds"),
    pytest.param({"training_mode": "finetune", "preset_template": "qwen-sft"}, id="finetune-template"),
    pytest.param({"training_mode": "finetune", "base_model": "existing-model"}, id="finetune-model"),
    pytest.param({**PRESET, "code_dir": "obs://bucket/code/"}, id="preset-image-code-dir"),
    pytest.param({"code_dir": "obs://bucket/files-1000/"}, id="code-dir-1000-files"),
    pytest.param({"code_dir": "obs://bucket/depth-32/"}, id="code-dir-depth-32"),
    pytest.param({"code_dir": "obs://bucket/size-5g/"}, id="code-dir-5gb"),
    pytest.param({"code_backup_dir": "obs://bucket/backup/"}, id="backup-dir"),
    pytest.param({"local_code_dir": "/home/ma-user/work"}, id="local-code-dir-custom"),
    pytest.param({"local_code_dir": "/home/ma-user/modelarts-data"}, id="local-code-dir-lookalike"),
    pytest.param({"local_code_dir": v.DEFAULT_LOCAL_CODE_DIR}, id="local-code-dir-default"),
    pytest.param({"environments": env(100)}, id="env-100"),
    pytest.param({**DEDICATED, "file_system_mounts": mounts(15)}, id="mounts-15"),
    pytest.param(
        {
            **DEDICATED,
            "file_system_mounts": [
                # a vendor's fstab line (NetApp, Filestore): none of it says where the server is
                {"file_system": "fs1", "mount_path": "/mnt/x", "options": "rw,hard,rsize=65536,vers=3,tcp,async"}
            ],
        },
        id="nfs-options-of-an-fstab-line",
    ),
    pytest.param(
        {
            **DEDICATED,
            "file_system_mounts": mounts(1) + [{"file_system": "fs1", "path": "/sub", "mount_path": "/mnt/2"}],
        },
        id="same-fs-twice",
    ),
    pytest.param(
        {**DEDICATED, "obs_mounts": [{"obs_url": "obs://bucket/data/", "mount_path": "/home/ma-user/data"}]},
        id="obs-mount-1",
    ),
    pytest.param({**DEDICATED, "priority": 1}, id="priority-1"),
    pytest.param({**DEDICATED, "priority": 2, "preemptible": True}, id="priority-2-preemptible"),
    pytest.param({"priority": 1}, id="public-priority-default"),
    pytest.param(
        {**DEDICATED, "spec_type": "custom", "custom_cpus": 8, "custom_memory_gb": 32, "custom_gpus": 2},
        id="custom-spec-node-size",
    ),
    pytest.param(
        {**DEDICATED, "affinity": "anti_affinity", "affinity_strength": "preferred", "affinity_hosts": ["ded-1"]},
        id="affinity",
    ),
    pytest.param({"flavor": "GPU:1*tnt004", "node_count": 1}, id="single-process-1"),
    pytest.param({"image_kind": "gpu", "flavor": "gpu-1"}, id="public-kinds-match"),
    pytest.param({**DEDICATED, "image_kind": "cpu", "flavor": "gpu-1", "pool": "ded"}, id="dedicated-kinds-free"),
    pytest.param({"datasets": ["preset-1", "preset-2", "mine"]}, id="datasets-3"),
    pytest.param({**ARTIFACTS, "artifact_mount_path": "/home/ma-user/outputs"}, id="artifacts"),
    pytest.param({**ARTIFACTS, "artifact_mount_path": "/data/out-1_a"}, id="artifact-mount-chars"),
    pytest.param({**PUBLISH_NEW, "model_name": "ab"}, id="model-name-2"),
    pytest.param({**PUBLISH_NEW, "model_name": MODEL_NAME_128}, id="model-name-128"),
    pytest.param({**PUBLISH_NEW, "model_name": "模型-v_1"}, id="model-name-cjk"),
    pytest.param({**PUBLISH_NEW, "version_description": "v" * 256}, id="version-description-256"),
    pytest.param(
        {**ARTIFACTS, "auto_publish": True, "publish_as": "version", "publish_model": "existing-model"},
        id="publish-version",
    ),
    pytest.param({"fault_tolerance": True, "max_restarts": 1}, id="max-restarts-1"),
    pytest.param({"fault_tolerance": True, "max_restarts": 128, "pod_retry_num": 128}, id="max-restarts-128"),
    pytest.param({"operator_reexecution": True}, id="operator-reexecution"),
    pytest.param({"ssh_remote": True, "ssh_key_pair": "laptop", "jupyter_lab": True}, id="ssh"),
    pytest.param({"mutual_trust": True}, id="mutual-trust-default-dir"),
    pytest.param({**DEDICATED, "tensorboard": True, "observe_file_system": "fs1"}, id="tensorboard"),
    pytest.param({**DEDICATED, "mindstudio_insight": True, "observe_file_system": "hostfs"}, id="mindstudio"),
    pytest.param({"metrics_mode": "http", "metrics_path": "/metrics", "metrics_port": 1}, id="metrics-port-1"),
    pytest.param({"metrics_mode": "http", "metrics_path": "/m", "metrics_port": 65535}, id="metrics-port-65535"),
    pytest.param(
        {"metrics_mode": "command", "metrics_command": "cat", "metrics_args": "/tmp/a.prom"}, id="metrics-cmd"
    ),
    pytest.param({"keep_logs": True, "log_export_path": "obs://bucket/logs/"}, id="keep-logs"),
    pytest.param({"auto_stop_hours": 1}, id="auto-stop-1"),
    pytest.param({"auto_stop_hours": 720}, id="auto-stop-720"),
    pytest.param({**DEDICATED, "retention_hours": 1}, id="retention-1"),
    pytest.param({**DEDICATED, "retention_hours": 720}, id="retention-720"),
    pytest.param({"tags": tags(20)}, id="tags-20"),
    pytest.param({"visibility": "creator", "log_time_range_download": True}, id="visibility-and-log-range"),
]
