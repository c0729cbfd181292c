"""The restart protocol between a launcher and a training script: two environment variables and one exit code.

* :data:`RESTART_ENV` (``TF_COMMOPT_RESTART``): how many times the launcher has started this task again
  (``0`` at the first start). A training script reads it to say in its record that it resumed.
* :data:`BACKUP_DIR_ENV` (``TF_COMMOPT_BACKUP_DIR``): a directory the launcher made for backups because
  restarts were asked for; a script given no backup directory of its own backs up there (and says so).
* :data:`PREEMPTED_EXIT_CODE` (143 = 128 + SIGTERM): a task that received SIGTERM, saved a backup at a
  step boundary and stopped exits with it. It is what a process ended by SIGTERM reports, so every
  supervisor already reads it as "terminated, start me again": the launcher's restart policies,
  Kubernetes' ``restartPolicy: ExitCode`` (128–255 are retryable) and ``OnFailure``, SLURM requeues.

Example:
    >>> restart_count({"TF_COMMOPT_RESTART": "2"}), restart_count({})
    (2, 0)
    >>> launcher_backup_dir({"TF_COMMOPT_BACKUP_DIR": "/tmp/b"})
    '/tmp/b'
"""

from __future__ import annotations

from typing import Mapping, Optional

__all__ = ["RESTART_ENV", "BACKUP_DIR_ENV", "PREEMPTED_EXIT_CODE", "restart_count", "launcher_backup_dir"]

RESTART_ENV = "TF_COMMOPT_RESTART"
BACKUP_DIR_ENV = "TF_COMMOPT_BACKUP_DIR"
PREEMPTED_EXIT_CODE = 143


def restart_count(environ: Mapping[str, str]) -> int:
    """How many times this task was started again (0 when the variable is unset or not a count)."""
    text = environ.get(RESTART_ENV, "0").strip()
    return int(text) if text.isdigit() else 0


def launcher_backup_dir(environ: Mapping[str, str]) -> Optional[str]:
    """The backup directory the launcher made for this job, or None."""
    return environ.get(BACKUP_DIR_ENV) or None
