"""Exception tree and process exit codes (documented in the README)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes of `sglang-supervisor`; systemd's RestartPreventExitStatus lists 1, 2, 3, 4
    and 6 (8 is restarted: under systemd, restarting every node is how its group is recreated)."""

    OK = 0
    NO_FIT = 1
    BAD_INPUT = 2
    SERVER_ARGS_REJECTED = 3
    STARTUP_FAILED = 4
    CRASH_LOOP = 5
    GPU_UNRECOVERABLE = 6
    GROUP_RECREATE = 8  # group mode: a node failed; the launcher recreates the whole group
    INTERNAL = 70


class SupervisorError(Exception):
    """Base of every error the supervisor reports to the operator without a traceback."""

    exit_code: ExitCode = ExitCode.INTERNAL
    logged = False  # already told as a `fatal` log event (the run loop's end)
    # The message's lines after the first (the pre-flight's table) are an event of their own
    # already (`preflight_report`): the `fatal` event leaves them out, a terminal still shows them.
    detail_logged = False


class ConfigError(SupervisorError):
    """Bad input: a flag, a config key, a file. The message names what is wrong."""

    exit_code = ExitCode.BAD_INPUT


class PreflightFailed(SupervisorError):
    """The pre-flight found that the server does not fit."""

    exit_code = ExitCode.NO_FIT
    fit: object = None  # its FitReport, when one was made (group mode reports it to the leader)


class ServerArgsRejected(SupervisorError):
    """SGLang exited 2 on its arguments: restarting cannot help."""

    exit_code = ExitCode.SERVER_ARGS_REJECTED


class StartupFailed(SupervisorError):
    """The server never became healthy (stall or hard startup timeout)."""

    exit_code = ExitCode.STARTUP_FAILED


class CrashLoop(SupervisorError):
    """Too many restarts within the restart window."""

    exit_code = ExitCode.CRASH_LOOP


class GpuUnrecoverable(SupervisorError):
    """A target GPU stays dirty after cleanup and reset; relaunching onto it is unsafe."""

    exit_code = ExitCode.GPU_UNRECOVERABLE


class GroupMustRecreate(SupervisorError):
    """Group mode: this node's server failed; SGLang's group cannot be mended in place, so the
    launcher (LeaderWorkerSet) must recreate the whole group."""

    exit_code = ExitCode.GROUP_RECREATE
