from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnvState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENV_STATE_UNSPECIFIED: _ClassVar[EnvState]
    CREATING: _ClassVar[EnvState]
    RUNNING: _ClassVar[EnvState]
    EXITED: _ClassVar[EnvState]
    FAILED: _ClassVar[EnvState]
    DELETED: _ClassVar[EnvState]
ENV_STATE_UNSPECIFIED: EnvState
CREATING: EnvState
RUNNING: EnvState
EXITED: EnvState
FAILED: EnvState
DELETED: EnvState

class Resources(_message.Message):
    __slots__ = ("cpus", "memory_bytes", "cpu_max", "memory_max_bytes", "fixed")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_MAX_FIELD_NUMBER: _ClassVar[int]
    MEMORY_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIXED_FIELD_NUMBER: _ClassVar[int]
    cpus: float
    memory_bytes: int
    cpu_max: float
    memory_max_bytes: int
    fixed: bool
    def __init__(self, cpus: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., cpu_max: _Optional[float] = ..., memory_max_bytes: _Optional[int] = ..., fixed: _Optional[bool] = ...) -> None: ...

class Task(_message.Message):
    __slots__ = ("patch", "root", "strip")
    PATCH_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    STRIP_FIELD_NUMBER: _ClassVar[int]
    patch: bytes
    root: str
    strip: int
    def __init__(self, patch: _Optional[bytes] = ..., root: _Optional[str] = ..., strip: _Optional[int] = ...) -> None: ...

class EnvSpec(_message.Message):
    __slots__ = ("plan_path", "plan_toml", "groups", "image", "plan_dir", "task", "resources", "labels", "ttl_seconds", "snapshotter", "runtime", "env", "init", "mounts", "name")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PLAN_PATH_FIELD_NUMBER: _ClassVar[int]
    PLAN_TOML_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_FIELD_NUMBER: _ClassVar[int]
    PLAN_DIR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    INIT_FIELD_NUMBER: _ClassVar[int]
    MOUNTS_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    plan_path: str
    plan_toml: str
    groups: GroupList
    image: str
    plan_dir: str
    task: Task
    resources: Resources
    labels: _containers.ScalarMap[str, str]
    ttl_seconds: int
    snapshotter: str
    runtime: str
    env: _containers.ScalarMap[str, str]
    init: _containers.RepeatedScalarFieldContainer[str]
    mounts: _containers.RepeatedScalarFieldContainer[str]
    name: str
    def __init__(self, plan_path: _Optional[str] = ..., plan_toml: _Optional[str] = ..., groups: _Optional[_Union[GroupList, _Mapping]] = ..., image: _Optional[str] = ..., plan_dir: _Optional[str] = ..., task: _Optional[_Union[Task, _Mapping]] = ..., resources: _Optional[_Union[Resources, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ..., ttl_seconds: _Optional[int] = ..., snapshotter: _Optional[str] = ..., runtime: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., init: _Optional[_Iterable[str]] = ..., mounts: _Optional[_Iterable[str]] = ..., name: _Optional[str] = ...) -> None: ...

class GroupList(_message.Message):
    __slots__ = ("refs",)
    REFS_FIELD_NUMBER: _ClassVar[int]
    refs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, refs: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateRequest(_message.Message):
    __slots__ = ("envs", "parallelism")
    ENVS_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvSpec]
    parallelism: int
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvSpec, _Mapping]]] = ..., parallelism: _Optional[int] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("step", "ms")
    STEP_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    step: str
    ms: float
    def __init__(self, step: _Optional[str] = ..., ms: _Optional[float] = ...) -> None: ...

class CreateResult(_message.Message):
    __slots__ = ("index", "env", "error", "timings", "total_ms")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    index: int
    env: EnvInfo
    error: str
    timings: _containers.RepeatedCompositeFieldContainer[StepTiming]
    total_ms: float
    def __init__(self, index: _Optional[int] = ..., env: _Optional[_Union[EnvInfo, _Mapping]] = ..., error: _Optional[str] = ..., timings: _Optional[_Iterable[_Union[StepTiming, _Mapping]]] = ..., total_ms: _Optional[float] = ...) -> None: ...

class ExecRequest(_message.Message):
    __slots__ = ("env_id", "argv", "shell", "cwd", "env", "stdin", "timeout_seconds", "output_limit", "buffered")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    shell: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    stdin: bytes
    timeout_seconds: float
    output_limit: int
    buffered: bool
    def __init__(self, env_id: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., shell: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., stdin: _Optional[bytes] = ..., timeout_seconds: _Optional[float] = ..., output_limit: _Optional[int] = ..., buffered: _Optional[bool] = ...) -> None: ...

class ExecEvent(_message.Message):
    __slots__ = ("stdout", "stderr", "exit")
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    EXIT_FIELD_NUMBER: _ClassVar[int]
    stdout: bytes
    stderr: bytes
    exit: ExecExit
    def __init__(self, stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ..., exit: _Optional[_Union[ExecExit, _Mapping]] = ...) -> None: ...

class ExecExit(_message.Message):
    __slots__ = ("exit_code", "duration_ms", "timed_out", "killed", "cause", "stdout_dropped", "stderr_dropped", "stdout", "stderr")
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    KILLED_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    STDOUT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    STDERR_DROPPED_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    exit_code: int
    duration_ms: float
    timed_out: bool
    killed: bool
    cause: str
    stdout_dropped: int
    stderr_dropped: int
    stdout: bytes
    stderr: bytes
    def __init__(self, exit_code: _Optional[int] = ..., duration_ms: _Optional[float] = ..., timed_out: _Optional[bool] = ..., killed: _Optional[bool] = ..., cause: _Optional[str] = ..., stdout_dropped: _Optional[int] = ..., stderr_dropped: _Optional[int] = ..., stdout: _Optional[bytes] = ..., stderr: _Optional[bytes] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("env_id", "shell", "cwd", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SHELL_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    shell: str
    cwd: str
    env: _containers.ScalarMap[str, str]
    def __init__(self, env_id: _Optional[str] = ..., shell: _Optional[str] = ..., cwd: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    ms: float
    def __init__(self, session_id: _Optional[str] = ..., ms: _Optional[float] = ...) -> None: ...

class RunInSessionRequest(_message.Message):
    __slots__ = ("env_id", "session_id", "command", "timeout_seconds", "output_limit")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LIMIT_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    session_id: str
    command: str
    timeout_seconds: float
    output_limit: int
    def __init__(self, env_id: _Optional[str] = ..., session_id: _Optional[str] = ..., command: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., output_limit: _Optional[int] = ...) -> None: ...

class RunInSessionResponse(_message.Message):
    __slots__ = ("output", "exit_code", "duration_ms", "timed_out", "output_dropped", "session_closed")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    TIMED_OUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_DROPPED_FIELD_NUMBER: _ClassVar[int]
    SESSION_CLOSED_FIELD_NUMBER: _ClassVar[int]
    output: bytes
    exit_code: int
    duration_ms: float
    timed_out: bool
    output_dropped: int
    session_closed: bool
    def __init__(self, output: _Optional[bytes] = ..., exit_code: _Optional[int] = ..., duration_ms: _Optional[float] = ..., timed_out: _Optional[bool] = ..., output_dropped: _Optional[int] = ..., session_closed: _Optional[bool] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("env_id", "session_id")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    session_id: str
    def __init__(self, env_id: _Optional[str] = ..., session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReadFileRequest(_message.Message):
    __slots__ = ("env_id", "path", "limit")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    path: str
    limit: int
    def __init__(self, env_id: _Optional[str] = ..., path: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ReadFileResponse(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class WriteFileRequest(_message.Message):
    __slots__ = ("env_id", "path", "data", "mode", "no_parents")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    NO_PARENTS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    path: str
    data: bytes
    mode: int
    no_parents: bool
    def __init__(self, env_id: _Optional[str] = ..., path: _Optional[str] = ..., data: _Optional[bytes] = ..., mode: _Optional[int] = ..., no_parents: _Optional[bool] = ...) -> None: ...

class WriteFileResponse(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class UploadChunk(_message.Message):
    __slots__ = ("env_id", "dest", "data")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    DEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    dest: str
    data: bytes
    def __init__(self, env_id: _Optional[str] = ..., dest: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class UploadResponse(_message.Message):
    __slots__ = ("bytes",)
    BYTES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    def __init__(self, bytes: _Optional[int] = ...) -> None: ...

class DownloadRequest(_message.Message):
    __slots__ = ("env_id", "path")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    path: str
    def __init__(self, env_id: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class DataChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class EnvInfo(_message.Message):
    __slots__ = ("id", "state", "cause", "labels", "created_at", "expires_at", "source", "snapshotter", "runtime", "pid")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOTTER_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: EnvState
    cause: str
    labels: _containers.ScalarMap[str, str]
    created_at: int
    expires_at: int
    source: str
    snapshotter: str
    runtime: str
    pid: int
    def __init__(self, id: _Optional[str] = ..., state: _Optional[_Union[EnvState, str]] = ..., cause: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[int] = ..., expires_at: _Optional[int] = ..., source: _Optional[str] = ..., snapshotter: _Optional[str] = ..., runtime: _Optional[str] = ..., pid: _Optional[int] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("labels",)
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("envs",)
    ENVS_FIELD_NUMBER: _ClassVar[int]
    envs: _containers.RepeatedCompositeFieldContainer[EnvInfo]
    def __init__(self, envs: _Optional[_Iterable[_Union[EnvInfo, _Mapping]]] = ...) -> None: ...

class NodeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeInfo(_message.Message):
    __slots__ = ("name", "groups", "environments", "pooled", "cpu_capacity_millicores", "memory_capacity_bytes", "cpu_requested_millicores", "memory_requested_bytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    CPU_CAPACITY_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_REQUESTED_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_REQUESTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    groups: _containers.RepeatedScalarFieldContainer[str]
    environments: int
    pooled: int
    cpu_capacity_millicores: int
    memory_capacity_bytes: int
    cpu_requested_millicores: int
    memory_requested_bytes: int
    def __init__(self, name: _Optional[str] = ..., groups: _Optional[_Iterable[str]] = ..., environments: _Optional[int] = ..., pooled: _Optional[int] = ..., cpu_capacity_millicores: _Optional[int] = ..., memory_capacity_bytes: _Optional[int] = ..., cpu_requested_millicores: _Optional[int] = ..., memory_requested_bytes: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ("env_id",)
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    def __init__(self, env_id: _Optional[str] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("env", "cpu_millicores", "memory_limit_bytes", "memory_usage_bytes", "cpu_usage_ns", "quota_changes", "shim_status_json", "sessions", "running_execs")
    ENV_FIELD_NUMBER: _ClassVar[int]
    CPU_MILLICORES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_USAGE_NS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_CHANGES_FIELD_NUMBER: _ClassVar[int]
    SHIM_STATUS_JSON_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_EXECS_FIELD_NUMBER: _ClassVar[int]
    env: EnvInfo
    cpu_millicores: int
    memory_limit_bytes: int
    memory_usage_bytes: int
    cpu_usage_ns: int
    quota_changes: _containers.RepeatedScalarFieldContainer[str]
    shim_status_json: str
    sessions: int
    running_execs: int
    def __init__(self, env: _Optional[_Union[EnvInfo, _Mapping]] = ..., cpu_millicores: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., memory_usage_bytes: _Optional[int] = ..., cpu_usage_ns: _Optional[int] = ..., quota_changes: _Optional[_Iterable[str]] = ..., shim_status_json: _Optional[str] = ..., sessions: _Optional[int] = ..., running_execs: _Optional[int] = ...) -> None: ...

class EventsRequest(_message.Message):
    __slots__ = ("env_id", "replay")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    REPLAY_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    replay: bool
    def __init__(self, env_id: _Optional[str] = ..., replay: _Optional[bool] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("env_id", "state", "cause", "unix_ms")
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    state: EnvState
    cause: str
    unix_ms: int
    def __init__(self, env_id: _Optional[str] = ..., state: _Optional[_Union[EnvState, str]] = ..., cause: _Optional[str] = ..., unix_ms: _Optional[int] = ...) -> None: ...

class DeleteRequest(_message.Message):
    __slots__ = ("env_ids",)
    ENV_IDS_FIELD_NUMBER: _ClassVar[int]
    env_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, env_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DeleteResponse(_message.Message):
    __slots__ = ("deleted", "errors")
    DELETED_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    deleted: _containers.RepeatedScalarFieldContainer[str]
    errors: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deleted: _Optional[_Iterable[str]] = ..., errors: _Optional[_Iterable[str]] = ...) -> None: ...
