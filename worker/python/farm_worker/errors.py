"""The exceptions the worker raises."""

class WorkerError(RuntimeError):
    """The worker cannot go on (refused by the learner, bad env, ...)."""


class ProtocolError(WorkerError):
    """The learner reported an Error, or sent something this worker cannot serve."""


class LearnerTimeout(WorkerError, TimeoutError):
    """The learner was unreachable or silent for give_up_s seconds."""


class _StopRequested(Exception):
    """request_stop() was called while waiting to send."""
