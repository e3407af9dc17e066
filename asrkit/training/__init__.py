"""Training: `asrkit train` and everything a run needs besides the data and the model.

=================== ==========================================================================
module              what
=================== ==========================================================================
``loop``            :class:`~asrkit.training.loop.Trainer`: the loop, read top to bottom
``checkpointing``   saving and resuming a trainer (what a checkpoint holds, when resuming is wrong)
``state``           RNG states, data fingerprint, the checks that make a resume right
``optim``           optimizers, learning-rate schedules, the moving average of the weights
``inputs``          which utterances, samplers and loaders (training RNGs untouched)
``validation``      dev loss and greedy WER per duration bin
``sync``            how DDP ranks agree before every batch (:class:`~asrkit.training.sync.StepVote`)
``distributed``     process-group set-up, small collectives, per-rank logs
``signals``         SIGTERM / SIGINT / SIGUSR1: stop at the next step boundary with a checkpoint
``lock``            one writer per experiment dir (``EXP/train.lock``, safe on NFS/Lustre)
``watchdog``        a thread per rank: the launcher's death, a failed or hung peer
``checks``          the whole config checked before any work; `asrkit config`
``command``         `asrkit train` (single process or under torchrun)
``average``         `asrkit average`: averaging of checkpoints
=================== ==========================================================================
"""


class TrainingError(RuntimeError):
    """Training cannot start or go on; the message says why and what to do."""
