"""Parameters of what a run logs and how long its waits may last."""

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class LoggingArguments:
    """Parameters that control what a run logs, and PaddleNLP's benchmark run."""

    sample_log_interval: int = field(default=5, metadata={"help": "Write a table of sample completions every logging_steps * this steps."})
    num_sample_logs: int = field(default=4, metadata={"help": "Rows in each sample table."})
    autotuner_benchmark: bool = field(
        default=False, metadata={"help": "PaddleNLP's benchmark run: 5 steps of full-length responses, no evaluation, checkpoints or reports."}
    )


@dataclass
class WatchdogArguments:
    """Parameters that bound the waits with no timeout of their own (docs/troubleshooting.md, "Hangs")."""

    watchdog_timeout: Optional[float] = field(
        default=None,
        metadata={"help": "Seconds a collective, a checkpoint write or a weight publication may last before the watchdog ends the process, naming the wait (default: derived from the steps so far, 10 x the slowest and at least 60 s; 1800 s before the first step)."},
    )

    def validate_watchdog(self):
        if self.watchdog_timeout is not None and self.watchdog_timeout <= 0:
            raise ValueError(f"watchdog_timeout must be positive (or unset: derived from the steps), got {self.watchdog_timeout}")
